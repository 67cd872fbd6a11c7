"""A session: the thread-safe handle through which one client pushes audio and takes frames.

A session launches no GPU work: ``push_audio`` validates and resamples on the caller's thread
(to 16 kHz for the model and to the sinks' rate for the frames' own audio), queues the
samples and returns at once; the runtime's one loop turns queued audio into frames and hands
them back through a bounded queue. Any thread may push (a microphone callback, a web
handler) and any thread may take frames. Frame i is at i/25 s and carries exactly the
audio it speaks, so sinks keep audio and video on one clock.

Speech comes in segments (a TTS utterance): the audio pushed between two ``end_segment`` calls
(or interrupts) is one, numbered 0, 1, 2, ... in push order; a close with nothing pushed since
opens none. Every frame carries a segment number: that of the speech it speaks, or for silence
the segment open when the silence was committed. So once a frame numbered above s is shown,
every frame of segment s has been: what playback events are made of (``streaming.playback``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import torch

from engine.audio.pcm import PcmError, StreamingResampler, channel_axis, check_rate
from engine.controls import Controls
from engine.latency import FAITHFUL, LatencyMode
from engine.runtime.config import RuntimeConfig
from engine.runtime.errors import AudioError, Backpressure, SessionClosed
from engine.timebase import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

CLOSED_SEGMENTS_KEPT = 256
"""Closed segments remembered for ``closed_segments`` until it is called (the oldest go first: bounded)."""


@dataclass
class Frame:
    """One output frame: full-size RGB uint8 (H,W,3) on the device, its time, and the audio it speaks."""

    index: int
    image: torch.Tensor
    audio: np.ndarray
    speech: bool
    ready: torch.cuda.Event | None = field(default=None, repr=False)
    motion: torch.Tensor | None = field(default=None, repr=False)
    segment: int = 0
    """The speech segment this frame speaks, or for silence the one open when it was committed (see the module)."""

    @property
    def pts(self) -> Fraction:
        """Presentation time in seconds, from the frame index (never from wall time)."""
        return Fraction(self.index, FPS)

    def is_ready(self) -> bool:
        """Whether the GPU has finished this frame (always true on the CPU)."""
        return self.ready is None or self.ready.query()

    def wait(self) -> None:
        """Block until the GPU has finished this frame."""
        if self.ready is not None:
            self.ready.synchronize()


@dataclass
class Intake:
    """Audio committed to a session since the loop last looked: model-rate and sink-rate samples, and commands."""

    model: np.ndarray
    sink: np.ndarray
    interrupt: bool
    end: bool
    close: bool
    generation: int
    controls: Controls | None = None
    """The session's controls when they changed since the loop last looked."""
    segments: tuple[tuple[int, int], ...] = ()
    """(model samples, segment number) runs of ``model``, in order."""
    segment: int = 0
    """The segment open now: the one silence committed from here on belongs to."""


class Session:
    """A client's handle; open one with ``Runtime.open_session``."""

    def __init__(
        self,
        session_id: int,
        avatar_name: str,
        live: bool,
        overlap: int,
        seed: int,
        config: RuntimeConfig,
        wake: Callable[[], None],
        controls: Controls | None = None,
        latency: LatencyMode = FAITHFUL,
    ) -> None:
        self.id = session_id
        self.latency = latency
        self.avatar_name = avatar_name
        self.live = live
        self.overlap = overlap
        self.seed = seed
        self.audio_rate = config.audio_rate
        self._max_lead = config.max_lead_seconds
        self._max_queued = config.max_queued_frames
        self._wake = wake
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._model_parts: list[np.ndarray] = []
        self._sink_parts: list[np.ndarray] = []
        self._part_segments: list[tuple[int, int]] = []
        self._segment = 0
        self._segment_has_audio = False
        self._segments_closed: deque[tuple[int, bool]] = deque(maxlen=CLOSED_SEGMENTS_KEPT)
        self._pending_model = 0
        self._format: tuple[int, int] | None = None
        self._to_model: StreamingResampler | None = None
        self._to_sink: StreamingResampler | None = None
        self._interrupt = False
        self._generation = 0
        self._end = False
        self._close = False
        self._queue: deque[Frame] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self.committed_samples = 0
        self._taken_samples = 0
        self._last_taken: Frame | None = None
        self._clock: float | None = None
        self._speech_latency: float | None = None
        self._controls = controls if controls is not None else Controls()
        self._controls_changed = False
        self.counters = {
            "frames_generated": 0,
            "frames_taken": 0,
            "frames_dropped": 0,
            "deadline_misses": 0,
            "windows": 0,
            "idle_hops": 0,
            "interrupts": 0,
            "resyncs": 0,
        }

    # -- audio in (any thread) -------------------------------------------------------------

    def push_audio(
        self,
        pcm: np.ndarray,
        sample_rate: int,
        channels: int | None = None,
        block: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Queue PCM at any common rate and layout; returns at once (or, with ``block``, once the lead allows it).

        Raises ``AudioError`` for unusable audio and ``Backpressure`` when the session already
        holds ``max_lead_seconds`` of audio not yet taken as frames.
        """
        try:
            fmt = (check_rate(sample_rate), channels or 1)
            fresh = self._resamplers(fmt) if self._format != fmt else None
            seconds = _frames_in(pcm, channels) / fmt[0]
        except PcmError as exc:
            raise AudioError(str(exc)) from exc
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                self._check_open()
                room = self._max_lead - self._lead_seconds()
                if seconds <= room or (self._lead_seconds() == 0 and seconds <= self._max_lead * 2):
                    break
                if not block:
                    raise Backpressure(
                        f"session {self.id} already holds {self._lead_seconds():.2f} s of audio (limit "
                        f"{self._max_lead} s); "
                        "push less at a time, wait for frames to be taken, or push with block=True"
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Backpressure(f"session {self.id}: no room for {seconds:.2f} s of audio within {timeout} s")
                self._changed.wait(left if left is not None else 0.1)
            if (
                self._format != fmt
            ):  # a new format, or the loop drained the resamplers (speech ended) since the check above
                self._flush_resamplers()
                self._to_model, self._to_sink = fresh or self._resamplers(fmt)
                self._format = fmt
            try:
                model = self._to_model.push(pcm)
                sink = self._to_sink.push(pcm)
            except PcmError as exc:
                raise AudioError(str(exc)) from exc
            self._append(model, sink)
            self._segment_has_audio |= seconds > 0
        self._wake()

    def end_segment(self) -> int | None:
        """Close the speech segment pushed since the last close (all its audio goes to the model now, none waits in a
        resampler); its number, or None when nothing was pushed since."""
        with self._changed:
            self._check_open()
            self._flush_resamplers()
            self._to_model = self._to_sink = None
            self._format = None
            closed = self._close_segment(interrupted=False)
        self._wake()
        return closed

    def closed_segments(self) -> list[tuple[int, bool]]:
        """(segment number, interrupted) of the segments closed since the last call, in order."""
        with self._lock:
            closed = list(self._segments_closed)
            self._segments_closed.clear()
            return closed

    def end(self) -> None:
        """End of input: every remaining frame is rendered, then ``next_frame`` returns None."""
        with self._changed:
            self._check_open()
            self._flush_resamplers()
            self._close_segment(interrupted=False)
            self._end = True
        self._wake()

    def interrupt(self) -> int | None:
        """Drop pending speech and every frame not yet taken; the stream goes on from the current pose into idle.
        Closes the open segment as interrupted: its number, or None when nothing was pushed since the last close."""
        with self._changed:
            self._check_open()
            self._model_parts, self._sink_parts, self._pending_model, self._part_segments = [], [], 0, []
            self._to_model = self._to_sink = None
            self._format = None
            self._queue.clear()
            self._interrupt = True
            self._generation += 1
            self.counters["interrupts"] += 1
            closed = self._close_segment(interrupted=True)
            self._changed.notify_all()
        self._wake()
        return closed

    # -- controls (any thread) ---------------------------------------------------------------

    @property
    def controls(self) -> Controls:
        """The controls in force (or about to be: the loop applies a change at its next tick)."""
        with self._lock:
            return self._controls

    def set_controls(self, controls: Controls) -> None:
        """Replace every control; the loop applies them from its next tick (see ``engine.controls``)."""
        if not isinstance(controls, Controls):
            raise TypeError(f"set_controls takes an engine.controls.Controls, got {type(controls).__name__}")
        with self._changed:
            self._check_alive()
            self._controls, self._controls_changed = controls, True
        self._wake()

    def update_controls(self, /, **changes) -> Controls:
        """Change some controls (``ControlError`` for an unknown field or a bad value, leaving them as they were);
        returns the controls now in force. Applied by the loop from its next tick."""
        with self._changed:
            self._check_alive()
            self._controls, self._controls_changed = self._controls.replace(**changes), True
            controls = self._controls
        self._wake()
        return controls

    def close(self) -> None:
        """Free the session: its frames, its motion state; idempotent."""
        with self._changed:
            self._close = True
            self._queue.clear()
            self._finished = True
            self._changed.notify_all()
        self._wake()

    # -- frames out (any thread) -----------------------------------------------------------

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        """The next frame, once the GPU has finished it; None after ``end`` once all are taken. TimeoutError on
        timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._queue:
                if self._error is not None:
                    raise SessionClosed(f"session {self.id} failed: {self._error}") from self._error
                if self._finished:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no frame from session {self.id} within {timeout} s")
                self._changed.wait(left)
            frame = self._queue.popleft()
            self._taken(frame)
            self._changed.notify_all()
        frame.wait()
        return frame

    def take_ready(self, limit: int | None = None) -> list[Frame]:
        """The frames whose GPU work is done, in order (``limit`` at most), without waiting."""
        out = []
        with self._changed:
            while self._queue and self._queue[0].is_ready() and (limit is None or len(out) < limit):
                frame = self._queue.popleft()
                self._taken(frame)
                out.append(frame)
            if out:
                self._changed.notify_all()
        return out

    async def frames(self, poll: float = 0.004) -> AsyncIterator[Frame]:
        """Frames as they become ready, until the session has ended and drained."""
        while True:
            ready = self.take_ready()
            for frame in ready:
                yield frame
            if not ready:
                with self._lock:
                    if self._error is not None:
                        raise SessionClosed(f"session {self.id} failed: {self._error}") from self._error
                    if self._finished and not self._queue:
                        return
                await asyncio.sleep(poll)

    @property
    def clock_anchor(self) -> float | None:
        """Monotonic time at which the session's live clock shows frame 0 (None until its first frame is ready).

        Frame i is due at ``clock_anchor + i/25``: the runtime keeps its frames ready by then, so
        sinks pace by this one clock instead of starting one of their own when frames arrive.
        """
        return self._clock

    @property
    def frames_queued(self) -> int:
        """Frames rendered and waiting to be taken."""
        return len(self._queue)

    @property
    def finished(self) -> bool:
        """Whether the session has ended (or was closed) and every frame has been handed out."""
        return self._finished and not self._queue

    def stats(self) -> dict[str, float]:
        """Counters: frames generated, taken, dropped, deadline misses, windows, idle hops, interrupts, lead; for a live
        session also ``speech_latency_ms``, how long after it is pushed speech is shown (by construction, see
        ``engine.runtime.pacing``)."""
        with self._lock:
            stats = {**self.counters, "lead_seconds": round(self._lead_seconds(), 3), "queued": len(self._queue)}
            if self._speech_latency is not None:
                stats["speech_latency_ms"] = round(self._speech_latency * 1000, 1)
            return stats

    # -- the runtime's side (``SessionLoopSide``: the loop thread only, never a client) ----------

    def collect(self) -> Intake:
        """Everything queued since the last call, in order: interrupt first, then audio, then end/close."""
        with self._changed:
            intake = Intake(
                np.concatenate(self._model_parts) if self._model_parts else np.zeros(0, np.float32),
                np.concatenate(self._sink_parts) if self._sink_parts else np.zeros(0, np.float32),
                self._interrupt,
                self._end,
                self._close,
                self._generation,
                self._controls if self._controls_changed else None,
                tuple(self._part_segments),
                self._segment,
            )
            self._model_parts, self._sink_parts, self._pending_model, self._part_segments = [], [], 0, []
            self._interrupt = self._end = self._controls_changed = False
            self.committed_samples += intake.model.size
        return intake

    def deliver(self, frames: list[Frame], drop_oldest: bool, generation: int) -> None:
        """Queue rendered frames (unless an interrupt came since the loop collected); a live session drops its oldest
        beyond the bound."""
        with self._changed:
            if self._close or generation != self._generation:
                return
            self._queue.extend(frames)
            self.counters["frames_generated"] += len(frames)
            while drop_oldest and len(self._queue) > self._max_queued:
                self._taken(self._queue.popleft())
                self.counters["frames_dropped"] += 1
                self.counters["frames_taken"] -= 1
            self._changed.notify_all()

    def room(self) -> int:
        """Frames the queue can still take."""
        return max(self._max_queued - len(self._queue), 0)

    @property
    def last_taken(self) -> Frame | None:
        """The frame the client took last (None before the first)."""
        return self._last_taken

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to one of the session's ``counters``."""
        self.counters[counter] += n

    def drain_resamplers(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The samples the resamplers still hold, when no newer audio waits (speech ended: idle follows); None
        otherwise."""
        with self._changed:
            if self._model_parts or self._to_model is None:
                return None
            tail = self._to_model.flush(), self._to_sink.flush()
            self._to_model = self._to_sink = None
            self._format = None
            return tail

    def set_committed(self, samples: int) -> None:
        """Model-rate samples committed to the motion stream so far (the session's lead counts them)."""
        with self._changed:
            self.committed_samples = samples
            self._changed.notify_all()

    def set_clock(self, anchor: float) -> None:
        """Start (or restart) the live clock: frame 0 is shown at ``anchor``."""
        self._clock = anchor

    def set_speech_latency(self, seconds: float) -> None:
        """How long after it is pushed speech is shown now (reported in ``stats``)."""
        self._speech_latency = seconds

    def finish(self) -> None:
        """Every frame was delivered: ``next_frame`` returns None once the queue is drained."""
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def fail(self, error: BaseException) -> None:
        """The session failed: its frames are dropped and its client's next call raises ``SessionClosed``."""
        with self._changed:
            self._error = error
            self._finished = True
            self._queue.clear()
            self._changed.notify_all()

    # -- internals -------------------------------------------------------------------------

    def _check_alive(self) -> None:
        """Controls may change until the session is closed or failed (after ``end``, for the frames still to come)."""
        if self._error is not None:
            raise SessionClosed(f"session {self.id} failed: {self._error}") from self._error
        if self._close:
            raise SessionClosed(f"session {self.id} is closed; open a new one with runtime.open_session")

    def _check_open(self) -> None:
        self._check_alive()
        if self._end:
            raise SessionClosed(f"session {self.id} has ended; open a new one with runtime.open_session")

    def _lead_seconds(self) -> float:
        return max(self._pending_model + self.committed_samples - self._taken_samples, 0) / SAMPLE_RATE

    def _append(self, model: np.ndarray, sink: np.ndarray) -> None:
        if model.size or sink.size:
            self._model_parts.append(model)
            self._sink_parts.append(sink)
            self._part_segments.append((model.size, self._segment))
            self._pending_model += model.size

    def _close_segment(self, interrupted: bool) -> int | None:
        """Close the open segment if anything was pushed into it (noted for ``closed_segments``); its number or None."""
        if not self._segment_has_audio:
            return None
        closed, self._segment, self._segment_has_audio = self._segment, self._segment + 1, False
        self._segments_closed.append((closed, interrupted))
        return closed

    def _resamplers(self, fmt: tuple[int, int]) -> tuple[StreamingResampler, StreamingResampler]:
        """New resamplers from ``fmt`` (rate, channels) to the model's rate and to the sinks'."""
        return StreamingResampler(fmt[0], fmt[1]), StreamingResampler(fmt[0], fmt[1], self.audio_rate)

    def _flush_resamplers(self) -> None:
        if self._to_model is not None:
            self._append(self._to_model.flush(), self._to_sink.flush())

    def _taken(self, frame: Frame) -> None:
        self._last_taken = frame
        self._taken_samples = max(self._taken_samples, (frame.index + 1) * SAMPLES_PER_FRAME)
        self.counters["frames_taken"] += 1


def _frames_in(pcm: np.ndarray, channels: int | None) -> int:
    """Sample frames in a PCM block (its length along the time axis)."""
    if not isinstance(pcm, np.ndarray):
        raise PcmError(f"PCM must be a numpy array, got {type(pcm).__name__}")
    if pcm.ndim != 2:
        return pcm.shape[0] if pcm.ndim else 0
    return pcm.shape[1 - channel_axis(pcm.shape, channels)]
