"""One session's state on the runtime's side: committed audio, motion, the render backlog, the live clock.

Only the runtime's loop thread touches a pipeline. It commits the audio its session queued
(and idle silence when a live session runs short), hands out HuBERT chunks and LMDM window
requests for the loop to batch with other sessions', keeps the final motion frames until
they are rendered, and turns rendered images into frames carrying their own audio.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import torch

from engine.audio.hubert import HOP_SAMPLES
from engine.controls import BLINK_CONTROLS, FADE_CONTROLS, FIELD_NAMES, STITCH_CONTROLS, Controls, stitch_controls
from engine.motion.conditions import ConditionBuilder, mirror_index
from engine.motion.stitching import (
    DRIVEN_KEYS_IMAGE,
    DRIVEN_KEYS_VIDEO,
    MotionStitcher,
    Posed,
    blink_schedule,
    fade_alphas,
)
from engine.motion.vector import MOTION_DIM
from engine.motion_source import MotionSource
from engine.motion_stream import MotionStream, WindowRequest
from engine.runtime.avatars import LoadedAvatar
from engine.runtime.config import RuntimeConfig
from engine.runtime.loop_side import SessionLoopSide
from engine.runtime.pacing import (
    RESYNC_FRAMES,
    Lead,
    frame_deadline,
    frames_due,
    needs_idle,
    on_grid,
    speech_depth,
    speech_start,
    window_due,
    window_due_at,
)
from engine.runtime.session import Frame
from engine.timebase import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

BLEND_FRAMES = 5
"""Frames over which the picture cross-fades from the last frame shown to the stream after an interrupt."""
MAX_IDLE_SAMPLES = 4 * HOP_SAMPLES
"""Silence one tick may commit for a session (enough to restart a stream after an interrupt in one tick)."""
BLINK_SCHEDULE_FRAMES = 3000
"""Frames of the blink schedule, cycled: the reference's length for streams of unknown length."""


class SessionPipeline:
    """The loop's state for one session."""

    def __init__(
        self,
        session: SessionLoopSide,
        avatar: LoadedAvatar,
        stitch,
        silence_feature: torch.Tensor,
        step_noise: torch.Tensor,
        cond_width: int,
        controls: Controls,
        config: RuntimeConfig,
        motion: MotionSource | None = None,
    ) -> None:
        """``motion``: where the frames come from instead of a ``MotionStream`` of the session's audio (e.g. motion
        computed beforehand for an offline render)."""
        self.session = session
        """The loop's side of the session: everything the pipeline takes from it or hands back goes through here."""
        self.avatar = avatar
        self.config = config
        self.device = avatar.f_s.device
        self.conditions = ConditionBuilder(avatar.canonical_kp, avatar.eye_open, avatar.eye_ball, cond_width)
        self.motion: MotionSource = motion or MotionStream(
            self.conditions,
            avatar.source_motion,
            silence_feature,
            session.overlap,
            step_noise,
            session.seed,
            session.latency,
        )
        self.hop = session.latency.hop_frames
        """Video frames per HuBERT hop: the granularity of its audio and of the silence committed while idle."""
        self.stitcher = MotionStitcher(
            avatar.source,
            stitch=stitch,
            driven_keys=DRIVEN_KEYS_IMAGE if avatar.is_image else DRIVEN_KEYS_VIDEO,
            drive_eye=avatar.is_image,
        )
        self.controls: Controls | None = None
        self.apply_controls(controls)
        self.request: WindowRequest | None = None
        self.backlog = torch.zeros(0, MOTION_DIM, device=self.device)
        self.backlog_start = 0
        self.discard = 0
        """Stream frames still to drop before the backlog, so that an interrupt keeps the windows' phase
        (``_interrupt``)."""
        self.sink_per_frame = session.audio_rate // FPS
        self.sink_ratio = session.audio_rate // SAMPLE_RATE if session.audio_rate % SAMPLE_RATE == 0 else None
        self.audio = np.zeros(0, np.float32)
        self.audio_start = 0
        self.speech: list[tuple[int, int, int]] = []
        """(first, end, segment) model samples of committed speech, by segment (``engine.runtime.session``)."""
        self.marks: list[tuple[int, int]] = [(0, 0)]
        """(first model sample, segment) where the committed audio's segment changes: silence's segment."""
        self.segment = 0
        """The session's open segment as of the last intake."""
        self.tail_is_speech = False
        self.out_next = 0
        self.blend_from: torch.Tensor | None = None
        self.blend_left = 0
        self.anchor: float | None = None
        self.lead = Lead(0.0, config.min_lead_frames)
        """Set by the runtime from its load each tick."""
        self.grid: float | None = None
        """Origin of the runtime's window grid, set by a runtime that batches sessions: the clock starts on it."""
        period = self.motion.window_period
        self.depth = 0.0 if period is None else speech_depth(period, self.motion.held_frames, self.hop)
        self.in_flight: deque[tuple[torch.cuda.Event | None, int, int]] = deque()
        self.ending = False
        self.closed = False
        self.generation = 0

    # -- audio ----------------------------------------------------------------------------

    def intake(self, now: float) -> bool:
        """Commit what the session queued, handle its commands, and add idle silence if live and short; True if anything
        changed."""
        intake = self.session.collect()
        self.generation = intake.generation
        self.segment = intake.segment
        changed = False
        if intake.close:
            self.closed = True
            return True
        if intake.controls is not None:
            self.apply_controls(intake.controls)
            changed = True
        if intake.interrupt:
            self._interrupt()
            changed = True
        if intake.model.size:
            if self.session.live and not self.tail_is_speech and self.anchor is not None:
                self._place_speech(now, intake.segments[0][1])
            self._commit(intake.model, intake.sink, True, intake.segments)
            changed = True
        if intake.end and not self.ending:
            self.ending = True
            self.motion.end()
            changed = True
        if self.session.live and not self.ending and not self.motion.audio_pending:
            changed |= self._idle(now)
        if self.session.live:
            self.session.set_speech_latency((self.depth + self.lead.frames) / FPS)
        return changed

    def _due(self, now: float) -> float:
        """Frames the live clock has shown by ``now``; a clock far behind what is produced restarts from the next
        frame."""
        produced = self.produced
        if self.anchor is not None and frames_due(now, self.anchor) - produced > RESYNC_FRAMES:
            self._start_clock(now - produced / FPS)
            self.session.count("resyncs")
        return frames_due(now, self.anchor)

    @property
    def produced(self) -> int:
        """Output frames final so far (rendered or waiting to be); the next window's first frame has this index."""
        return self.out_next + self.backlog.shape[0]

    def _stream_offset(self) -> int:
        """Output frame index minus stream frame index (nonzero after an interrupt)."""
        return self.out_next - self.backlog_start

    def _place_speech(self, now: float, segment: int) -> None:
        """Speech of ``segment`` starting now (after silence): pad with silence (of that segment) so that it is shown
        as soon as its frames can be final, not earlier."""
        due = self._due(now) - self._stream_offset()
        gap = speech_start(self.motion.samples_in, due, self.lead, self.depth) - self.motion.samples_in
        if gap > 0:
            self._commit(np.zeros(gap, np.float32), None, False, ((gap, segment),))

    def _idle(self, now: float) -> bool:
        """Commit the silence a live session needs now to keep its final frames ``lead`` ahead of its clock; True if
        any.

        Only as much as makes the next frames final (none while a hop of final motion still waits
        for the renderer: more silence would not help), so that speech pushed next is not queued behind it.
        """
        if self.backlog.shape[0] >= self.hop:
            return False
        produced = self.produced
        due = self._due(now)
        if not needs_idle(produced, due, self.lead, self.tail_is_speech):
            return False
        drained = self.tail_is_speech and (tail := self.session.drain_resamplers()) is not None
        if drained:
            self._commit(tail[0], tail[1], True, ((tail[0].size, self.segment),))
        target = math.ceil(due + self.lead.frames) - self._stream_offset()
        samples = min(self.motion.samples_for_frames(target), MAX_IDLE_SAMPLES)
        if samples > 0:
            self._commit(np.zeros(samples, np.float32), None, False, ((samples, self.segment),))
            self.session.count("idle_hops", math.ceil(samples / (self.hop * SAMPLES_PER_FRAME)))
        return drained or samples > 0

    def _commit(
        self, model: np.ndarray, sink: np.ndarray | None, speech: bool, segments: tuple[tuple[int, int], ...]
    ) -> None:
        """Commit ``model`` (and its sink-rate audio; None: silence), whose (samples, segment) runs are ``segments``."""
        start = self.motion.samples_in
        if sink is None:
            self._align_sink(start)
            sink = np.zeros(self._sink_samples(model.size), np.float32)
        elif not self.tail_is_speech:
            self._align_sink(start)
        self.motion.push(model)
        self.audio = np.concatenate([self.audio, sink])
        for samples, segment in segments:
            if speech:
                self.speech.append((start, start + samples, segment))
            if segment != self.marks[-1][1]:
                self.marks.append((start, segment))
            start += samples
        self.tail_is_speech = speech
        self.session.set_committed(self.motion.samples_in)

    def _sink_samples(self, model_samples: int) -> int:
        return (
            model_samples * self.sink_ratio
            if self.sink_ratio
            else round(model_samples * self.session.audio_rate / SAMPLE_RATE)
        )

    def _align_sink(self, model_position: int) -> None:
        """Make the sink-rate audio end exactly where the model-rate audio does (resampler delays differ slightly)."""
        want = self._sink_samples(model_position) - self.audio_start
        if self.audio.size > want:
            self.audio = self.audio[: max(want, 0)]
        elif self.audio.size < want:
            self.audio = np.concatenate([self.audio, np.zeros(want - self.audio.size, np.float32)])

    def _interrupt(self) -> None:
        """Drop speech not yet diffused and every frame not yet taken; silence the audio of frames still to come.

        With a runtime grid, up to a window's worth of stream frames more are dropped (stale motion with
        silenced audio), so that output frame index − stream frame index keeps its value modulo the frames
        per window: the session's windows stay on the grid and keep running in the other sessions' batch.
        """
        offset = self._stream_offset()
        self.motion.interrupt()
        self.request = None
        self.backlog = self.backlog[:0]
        self.backlog_start = self.motion.frames_out
        silent_from = self._sink_samples(self.motion.frames_out * SAMPLES_PER_FRAME) - self.audio_start
        self.audio[max(silent_from, 0) :] = 0
        self._align_sink(self.motion.samples_in)
        cut = self.motion.frames_out * SAMPLES_PER_FRAME
        self.speech = [(a, min(b, cut), s) for a, b, s in self.speech if a < cut]
        self.marks = [m for m in self.marks if m[0] < cut] + [(cut, self.segment)]
        self.tail_is_speech = False
        self.session.set_committed(self.motion.samples_in)
        last = self.session.last_taken
        self.out_next = 0 if last is None else last.index + 1
        self.discard = 0
        if self.grid is not None and self.motion.window_period is not None:
            self.discard = (self._stream_offset() - offset) % self.motion.window_period
            self.backlog_start += self.discard
        self.blend_from = None if last is None else last.motion
        self.blend_left = BLEND_FRAMES if self.blend_from is not None else 0
        self.in_flight.clear()

    # -- controls -------------------------------------------------------------------------

    def apply_controls(self, controls: Controls) -> None:
        """Take new controls: window controls for the next window requested, the others for the next frame stitched."""
        changed = set(FIELD_NAMES if self.controls is None else controls.changed(self.controls))
        if "emotion" in changed:
            self.conditions.set_emotion(controls.emotion_rows(self.device))
        self.motion.set_window_controls(controls.fix_kp_cond, controls.fix_kp_cond_dims)
        if changed.intersection(STITCH_CONTROLS):
            self.stitcher.controls = stitch_controls(controls, self.device)
        if changed.intersection(BLINK_CONTROLS):
            self._set_blinks(controls)
        if changed.intersection(FADE_CONTROLS):
            self.stitcher.set_fade(controls.fade_target, controls.fade_keys)
        self.controls = controls

    def _set_blinks(self, controls: Controls) -> None:
        """A fresh schedule from the session's seed (open-ended, cycled), continuing from the frames already
        stitched."""
        if not controls.blink or controls.blink_table is None or not self.stitcher.drive_eye:
            self.stitcher.set_blinks(None, None)
            return
        table = torch.tensor(controls.blink_table, dtype=torch.float32, device=self.device)
        gaps = list(controls.blink_gaps) if isinstance(controls.blink_gaps, tuple) else controls.blink_gaps
        schedule = blink_schedule(BLINK_SCHEDULE_FRAMES, table.shape[0], gaps, random.Random(self.session.seed))
        self.stitcher.set_blinks(table, schedule.to(self.device))

    def _fade_alpha(self, count: int) -> torch.Tensor | None:
        """Fade weights of the next ``count`` output frames (None without fades); the fade-out needs the end known."""
        controls = self.controls
        if not controls.fade_in and not controls.fade_out:
            return None
        total = None
        if controls.fade_out and self.ending:
            total = self.out_next - self.backlog_start + math.ceil(self.motion.samples_in / SAMPLES_PER_FRAME)
        index = torch.arange(self.out_next, self.out_next + count, device=self.device)
        return fade_alphas(index, controls.fade_in, controls.fade_out if total is not None else 0, total)

    # -- motion ---------------------------------------------------------------------------

    def window_request(self) -> WindowRequest | None:
        """This session's next window, if its features cover one (kept until completed, so a failed batch retries
        it)."""
        if self.request is None:
            self.request = self.motion.window_request()
        return self.request

    def window_due(self, now: float) -> bool:
        """Whether the next window should run now: a live session's once the clock is within the lead of its first
        frame (sooner it would only wait, and run apart from the other sessions'); any other session's at once."""
        if not self.session.live or self.anchor is None:
            return True
        return window_due(self.produced, frames_due(now, self.anchor), self.lead)

    def next_work_at(self) -> float:
        """When this live session next needs the GPU: now (``-inf``) while it has frames to render or no clock yet,
        else when its next window falls due."""
        if self.anchor is None or self.backlog.shape[0]:
            return -math.inf
        return window_due_at(self.anchor, self.produced, self.lead)

    def complete(self, window: torch.Tensor) -> None:
        """Take a sampled window; its final frames join the render backlog."""
        self.request = None
        self._add_backlog(self.motion.complete(window))
        self.session.count("windows")

    def finish_if_done(self) -> None:
        """After ``end``: emit the last frames once nothing is left to sample."""
        if self.motion.can_finish:
            self._add_backlog(self.motion.finish())

    def _add_backlog(self, motion: torch.Tensor) -> None:
        if self.discard:
            dropped = min(self.discard, motion.shape[0])
            motion = motion[dropped:]
            self.discard -= dropped
        if motion.shape[0]:
            self.backlog = torch.cat([self.backlog, motion])
            if self.stitcher.anchor is None and self.motion.anchor is not None:
                self.stitcher.set_anchor(self.motion.anchor)

    @property
    def done(self) -> bool:
        """Ended and every frame rendered."""
        return self.ending and self.motion.finished and self.backlog.shape[0] == 0

    # -- render ---------------------------------------------------------------------------

    def render_count(self, chunk: int) -> int:
        """Frames this session may render now: its backlog (live sessions drop old frames when their queue is full);
        an offline session waits for room for ``chunk`` frames (or its whole backlog), so its batches stay full."""
        count = self.backlog.shape[0]
        if self.session.live:
            return count
        room = self.session.room()
        return min(count, room) if room >= min(count, chunk) else 0

    def next_deadline(self) -> float:
        """When this session's next frame is due (offline sessions: never, they take what is left)."""
        if not self.session.live:
            return math.inf
        if self.anchor is None:
            return -math.inf
        return frame_deadline(self.anchor, self.out_next)

    def pose(self, count: int) -> tuple[torch.Tensor, torch.Tensor, Posed]:
        """The next ``count`` backlog frames -> (motion, avatar rows, their per-session stitching steps done);
        ``stitch_posed`` finishes them (x_s, x_d), batched with other sessions'. The frames leave the backlog on
        delivery."""
        motion = self.backlog[:count]
        if self.blend_left:
            motion = self._blend(motion)
        rows = mirror_index(
            torch.arange(self.out_next, self.out_next + count, device=self.device), self.avatar.num_frames
        )
        return motion, rows, self.stitcher.pose(motion, rows, self._fade_alpha(count))

    def _blend(self, motion: torch.Tensor) -> torch.Tensor:
        steps = min(self.blend_left, motion.shape[0])
        done = BLEND_FRAMES - self.blend_left
        weight = (
            torch.arange(done + 1, done + steps + 1, device=self.device, dtype=motion.dtype) / (BLEND_FRAMES + 1)
        )[:, None]
        blended = motion.clone()
        blended[:steps] = self.blend_from * (1 - weight) + motion[:steps] * weight
        self.blend_left -= steps
        return blended

    def deliver(self, motion: torch.Tensor, images: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        """Turn rendered images into frames with their audio and hand them to the session."""
        count = images.shape[0]
        frames = []
        for j in range(count):
            m = self.backlog_start + j
            speech, segment = self._segment_of(m)
            frames.append(Frame(self.out_next + j, images[j], self._frame_audio(m), speech, ready, motion[j], segment))
        self.in_flight.append((ready, self.out_next, count))
        self.backlog = self.backlog[count:]
        self.backlog_start += count
        self.out_next += count
        self._trim_audio()
        self.session.deliver(frames, drop_oldest=self.session.live, generation=self.generation)

    def _frame_audio(self, motion_index: int) -> np.ndarray:
        lo = motion_index * self.sink_per_frame - self.audio_start
        chunk = self.audio[max(lo, 0) : max(lo + self.sink_per_frame, 0)]
        return (
            np.pad(chunk, (0, self.sink_per_frame - chunk.size)) if chunk.size < self.sink_per_frame else chunk.copy()
        )

    def _segment_of(self, motion_index: int) -> tuple[bool, int]:
        """Whether stream frame ``motion_index`` speaks, and its segment: its speech's, else that of its last sample."""
        lo, hi = motion_index * SAMPLES_PER_FRAME, (motion_index + 1) * SAMPLES_PER_FRAME
        spoken = [s for a, b, s in self.speech if a < hi and b > lo]
        if spoken:
            return True, max(spoken)
        segment = self.marks[0][1]
        for first, marked in self.marks:
            if first >= hi:
                break
            segment = marked
        return False, segment

    def _trim_audio(self) -> None:
        drop = self.backlog_start * self.sink_per_frame - self.audio_start
        if drop > 0:
            self.audio = self.audio[drop:]
            self.audio_start += drop
        floor = self.backlog_start * SAMPLES_PER_FRAME
        self.speech = [(a, b, s) for a, b, s in self.speech if b > floor]
        while len(self.marks) > 1 and self.marks[1][0] <= floor:
            self.marks.pop(0)

    # -- the clock ------------------------------------------------------------------------

    def check_deadlines(self, now: float) -> None:
        """Note which rendered frames are ready by ``now``; set the clock's anchor at the first; count frames ready
        after their deadline."""
        while self.in_flight:
            ready, first, count = self.in_flight[0]
            if ready is not None and not ready.query():
                return
            self.in_flight.popleft()
            if self.anchor is None:
                self._start_clock(now - first / FPS)
            if self.session.live:
                late = sum(1 for i in range(first, first + count) if now > frame_deadline(self.anchor, i) + 1 / FPS)
                self.session.count("deadline_misses", late)

    def _start_clock(self, anchor: float) -> None:
        """Start (or restart) the clock at ``anchor``, or just after: with a runtime grid, late enough that the next
        window falls due on it, in the same tick as every other session's (a first frame shown up to one hop later)."""
        period = self.motion.window_period
        if self.grid is not None and period is not None:
            first_due = frame_deadline(anchor, self.produced)
            anchor += on_grid(first_due, self.grid, period / FPS) - first_due
        self.anchor = anchor
        self.session.set_clock(anchor)
