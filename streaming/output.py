"""One session's output: pull its frames, release one every 1/25 s of wall time, encode it once, fan out to every sink.

Encode once, fan out: the H.264 bitstream is identical for RTMP (FLV), the WebRTC viewers
(RTP) and MP4, so it is encoded once per session output (the expensive part, and NVENC
sessions are a scarce resource). Opus is encoded once and shared by all viewers. AAC is
encoded per muxer (cheap: about 1% of a core), so each RTMP connection, including one made
after a reconnect, starts its audio timeline on the keyframe its video starts on.

Two threads: the pull thread takes frames as the session makes them (a little ahead of real
time) and prepares each for the encoder (the colour conversion, where the frame is); the
release thread runs the output's own clock (``streaming.slots``): at each slot's deadline it
takes the frame due by then, or repeats the last picture with silence when none is (counted),
encodes it and hands it to every sink ``playout_delay`` later. The output's timestamps are slot
numbers, so they advance at exactly 25 fps of wall time even when the GPU falls behind. A
frame is due when the session's own live clock shows it (the runtime has it ready by then); a
source without a clock is paced from its first frame's arrival plus ``playout_delay``. A first
frame ready only after it was due starts the output's clock when it is ready (every later frame
is held that much later), so a slow start costs latency once instead of repeats; so do frames that come a little
late later on (the staging of many large frames at a full GPU): each such lateness shows the frames one slot later
from then on (one repeat, no speech lost), up to ``MAX_ADDED_SLOTS``; past that the output sheds. Latency added so
is given back a slot at a time once every frame for ``RECLAIM_SECONDS`` came early enough to be shown a slot sooner:
at the next silent frame, which is skipped (never speech), so one hiccup does not cost the whole session a slot. Sinks
never block the release thread: each one queues and drops on its own, so a stalled viewer or
a dead RTMP server slows nobody else.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.timebase import FPS
from engine.trace import trace
from streaming.encoders.audio import OpusEncoder
from streaming.encoders.h264 import EncodedVideo, H264Settings
from streaming.encoders.raw import RawPictures
from streaming.encoders.select import VideoEncoder, open_video_encoder
from streaming.fanout import Fanout, Sink
from streaming.frames import AUDIO_SAMPLES_PER_FRAME, EncodedFrame, FrameSource
from streaming.slots import EPSILON, PERIOD, Fill, catch_up, fill, slot_time

log = logging.getLogger(__name__)
MAX_PREPARED = 2 * FPS
"""Frames prepared ahead of their slot at most; the pull thread waits beyond (the session then drops its oldest)."""
PLAYOUT_DELAY = 0.01
"""Seconds after a slot's deadline that its frame is released to the sinks: time to encode it."""
MAX_ADDED_SLOTS = 2
"""Slots of latency an output adds, one at a time, when its frames come late, before it sheds them instead: a frame a
little late is shown one slot later (one repeat, no speech lost) rather than skipped with its audio after the repeat."""
RECLAIM_SECONDS = 20.0
"""The window of the output's slack: every frame shown in one must have come ``PERIOD + RECLAIM_MARGIN`` before its
slot for the output to give a slot of added latency back (long beside the hiccups it absorbs, so that it does not
swing back and forth: at most one repeat a window where they recur)."""
RECLAIM_MARGIN = 0.005
"""Seconds the frames must still be early by once the slot is given back: the runtime keeps its frames only half a
slot ahead of the clock, staging and transport included, so a larger margin is rarely there to see."""
SILENCE = np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)


@dataclass
class OutputStats:
    """Counters of one session output (read by /metrics)."""

    frames_in: int = 0
    frames_released: int = 0
    late_releases: int = 0
    repeated: int = 0
    """Slots filled with the last picture (and silence) because no frame was due: the shed frames."""
    skipped: int = 0
    """Frames let go to catch up with the clock after a repeat."""
    added_slots: int = 0
    """Slots of latency added since the first frame because frames came late and not yet given back (at most
    ``MAX_ADDED_SLOTS``)."""
    reclaimed: int = 0
    """Slots of added latency given back, each by skipping one silent frame."""
    added_latency: float = 0.0
    """Seconds the output now shows frames after the session's clock has them due: a late first frame, then the
    added slots."""
    slack: float | None = None
    """The least time by which a frame shown in the last whole ``RECLAIM_SECONDS`` was ready before its slot (a repeat
    counts as a slot late); None before the first window ends."""
    encode_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=10 * 60 * FPS))


@dataclass(frozen=True)
class Prepared:
    """A frame ready for its slot: the encoder's input, its audio, and when it is due (monotonic seconds)."""

    index: int
    picture: Any
    audio: np.ndarray
    speech: bool
    due: float
    segment: int = 0
    arrived: float = 0.0
    """When it was ready for its slot (monotonic seconds)."""


def confine_torch_threads() -> None:
    """One intra-op torch thread for the calling thread only (the encode thread's small per-frame ops).

    On a CPU-only machine torch's OpenMP threads for a per-frame colour conversion contend with
    the runtime and the encoder itself, and the tail of the encode time grows several-fold.
    ``torch.set_num_threads sets the calling thread's
    count and also the default for threads initialised later; a short-lived thread puts the
    default back, so no other thread is affected.
    """
    default = torch.get_num_threads()
    torch.set_num_threads(1)
    restore = threading.Thread(target=torch.set_num_threads, args=(default,))
    restore.start()
    restore.join()


class SessionOutput:
    """Drive one session's frames through one encoder to any number of sinks, added or removed at any time.

    ``encoder``: ``auto``, ``nvenc`` or ``x264`` (``streaming.encoders.select``), or ``raw``: no H.264, each frame's
    picture goes to the sinks as it is (``streaming.encoders.raw``: sinks that take pictures, such as a LiveKit room);
    ``playout_delay``: seconds after a slot's deadline that its frame is released (time to encode it);
    ``on_sink_failed(sink name, message)``: told, from the release thread, of each sink that failed and was detached
    (``streaming.fanout``).
    """

    def __init__(
        self,
        session: FrameSource,
        encoder: str = "auto",
        settings: H264Settings | None = None,
        playout_delay: float = PLAYOUT_DELAY,
        name: str = "0",
        on_sink_failed: Callable[[str, str], None] | None = None,
    ) -> None:
        self.session, self.name = session, name
        self._trace = trace("output")
        self._fanout = Fanout(name, on_sink_failed)
        self.encoder_kind, self.settings = encoder, settings
        self.encoder: VideoEncoder | None = None
        self.encoder_note = ""
        self.stats = OutputStats()
        self.playout_delay = playout_delay
        self._ready = threading.Condition()
        self._prepared: deque[Prepared] = deque()
        self._ended = False
        self._arrival: float | None = None
        self._stop = threading.Event()
        self._opus = OpusEncoder()
        self._threads = (
            threading.Thread(target=self._pull_loop, name=f"pull-{name}", daemon=True),
            threading.Thread(target=self._release_loop, name=f"release-{name}", daemon=True),
        )
        self.finished = threading.Event()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks now attached."""
        return self._fanout.sinks

    def add_sink(self, sink: Sink) -> None:
        """Attach a sink; it receives frames from the next release on."""
        self._fanout.add(sink)

    def remove_sink(self, sink: Sink) -> None:
        """Detach a sink (it is not closed)."""
        self._fanout.remove(sink)

    def request_keyframe(self) -> None:
        """Make an upcoming frame an IDR (a new viewer, a PLI, a reconnected server)."""
        if self.encoder is not None:
            self.encoder.keyframes.request()

    def start(self) -> SessionOutput:
        """Start pulling, encoding and releasing."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop pulling frames, close every sink and wait for the threads (idempotent)."""
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        """Plain counters for /metrics: frames in, released, late, repeated (shed), skipped, encode times, each
        sink's."""
        stats = self.stats
        return {
            "encoder": self.encoder.name if self.encoder else None,
            "frames_in": stats.frames_in,
            "frames_released": stats.frames_released,
            "late_releases": stats.late_releases,
            "repeated": stats.repeated,
            "skipped": stats.skipped,
            "added_latency_ms": round(stats.added_latency * 1000),
            "slack_ms": None if stats.slack is None else round(stats.slack * 1000, 1),
            "reclaimed": stats.reclaimed,
            "encode_ms_p50": round(self.encode_ms(0.5), 3),
            "encode_ms_p99": round(self.encode_ms(0.99), 3),
            "sinks": {sink.name: sink.stats() for sink in self._fanout.sinks},
        }

    def encode_ms(self, quantile: float) -> float:
        """A quantile of the recent per-frame encode times, in milliseconds (0 before the first frame)."""
        times = self.stats.encode_seconds
        return float(np.quantile(np.fromiter(times, float), quantile)) * 1000 if times else 0.0

    # -- pull thread ----------------------------------------------------------------------

    def _pull_loop(self) -> None:
        confine_torch_threads()
        try:
            while not self._stop.is_set():
                try:
                    frame = self.session.next_frame(timeout=0.2)
                except TimeoutError:
                    continue
                if frame is None:
                    break
                self.stats.frames_in += 1
                encoder = self.encoder or self._open_encoder(frame.image)
                prepared = Prepared(
                    frame.index,
                    encoder.prepare(frame.image, frame.ready),
                    frame.audio,
                    frame.speech,
                    self._due(frame.index),
                    frame.segment,
                    time.monotonic(),
                )
                if self._trace.on:
                    self._trace.record("prepared", prepared.arrived, s=self.name, i=frame.index, due=prepared.due)
                with self._ready:
                    while len(self._prepared) >= MAX_PREPARED and not self._stop.is_set():
                        self._ready.wait(0.2)
                    self._prepared.append(prepared)
                    self._ready.notify_all()
        except Exception:
            log.exception("output %s: taking frames failed; the output stops", self.name)
        finally:
            with self._ready:
                self._ended = True
                self._ready.notify_all()

    def _due(self, index: int) -> float:
        """When frame ``index`` is due: when the session's clock shows it, or (no clock) ``playout_delay`` after the
        first frame arrived, paced from there."""
        anchor = self.session.clock_anchor
        if anchor is None:
            if self._arrival is None:
                self._arrival = time.monotonic() + self.playout_delay - index * PERIOD
            anchor = self._arrival
        return anchor + index * PERIOD

    def _open_encoder(self, image: torch.Tensor) -> VideoEncoder:
        height, width = (
            image.shape[:2] if isinstance(image, torch.Tensor) else (image.shape[0] * 2 // 3, image.shape[1])
        )
        if self.encoder_kind == "raw":
            self.encoder, self.encoder_note = RawPictures(width, height), "encoder: none (raw pictures to the sinks)"
        else:
            self.encoder, self.encoder_note = open_video_encoder(
                self.encoder_kind, width, height, image_device(image), self.settings
            )
        log.info("output %s: %s", self.name, self.encoder_note)
        return self.encoder

    # -- release thread -------------------------------------------------------------------

    def _release_loop(self) -> None:
        pending: deque[tuple[int, np.ndarray, tuple[tuple[int, bytes], ...], bool, bool, int, Any]] = deque()
        try:
            first = self._first()
            if first is None:
                return
            shift = max(0.0, time.monotonic() - first.due)
            origin, slot, last = first.due + shift - first.index * PERIOD, first.index, first
            self.stats.added_latency = shift
            slack, window, give_back = math.inf, time.monotonic(), False
            while not self._stop.is_set():
                deadline = slot_time(origin, slot)
                _sleep_until(deadline)
                with self._ready:
                    if self._ended and not self._prepared:
                        break
                    behind = catch_up(deadline, [p.due + shift for p in self._prepared])
                    if behind and self.stats.added_slots + behind <= MAX_ADDED_SLOTS:
                        shift += behind * PERIOD  # show the late frames from here on, a slot later each
                        self.stats.added_slots += behind
                        behind = 0
                    for _ in range(behind):
                        self._prepared.popleft()
                        self.stats.skipped += 1
                    if give_back and self._give_back_slot(shift):
                        shift -= PERIOD
                        give_back = False
                    self.stats.added_latency = shift
                    head = self._prepared[0].due + shift if self._prepared else None
                    item = self._prepared.popleft() if fill(deadline, head) is Fill.FRAME else None
                    self._ready.notify_all()
                early = -PERIOD if item is None else deadline - item.arrived
                slack = min(slack, early)
                give_back &= early >= PERIOD + RECLAIM_MARGIN
                if deadline - window >= RECLAIM_SECONDS:
                    self.stats.slack, give_back = slack, slack >= PERIOD + RECLAIM_MARGIN
                    slack, window = math.inf, deadline
                if item is None:
                    self.stats.repeated += 1
                    if self._trace.on:
                        self._trace.record(
                            "repeat", s=self.name, slot=slot, deadline=deadline, shift=shift, expected=last.index + 1
                        )
                else:
                    last = item
                packets = self._encode(slot, last, item is None, pending)
                _sleep_until(deadline + self.playout_delay)
                if time.monotonic() > deadline + self.playout_delay + PERIOD:
                    self.stats.late_releases += 1
                self._match(packets, pending)
                slot += 1
            if self.encoder is not None:
                self._match(self.encoder.flush(), pending)
        except Exception:
            log.exception("output %s: encoding failed; the output stops", self.name)
        finally:
            self._fanout.close_all()
            self.finished.set()

    def _give_back_slot(self, shift: float) -> bool:
        """Skip the queued head frame to show every later one a slot sooner, if the output runs a slot or more behind
        the session's clock, the head is silent and the next frame is there to take its slot (called holding
        ``_ready``)."""
        queued = self._prepared
        if shift < PERIOD - EPSILON or len(queued) < 2 or queued[0].speech or queued[0].audio.any():
            return False
        queued.popleft()
        self.stats.skipped += 1
        self.stats.reclaimed += 1
        self.stats.added_slots = max(0, self.stats.added_slots - 1)
        return True

    def _first(self) -> Prepared | None:
        """The first prepared frame (left queued), once there is one; None if the output ends or stops before."""
        with self._ready:
            while not self._prepared:
                if self._ended or self._stop.is_set():
                    return None
                self._ready.wait(0.2)
            return self._prepared[0]

    def _encode(self, slot: int, picture: Prepared, repeat: bool, pending: deque) -> list[EncodedVideo]:
        """Encode slot ``slot``: ``picture``'s frame, or (``repeat``) its picture again with silence."""
        started = time.perf_counter()
        audio = SILENCE if repeat else picture.audio
        packets = self.encoder.encode_picture(picture.picture, slot)
        raw = isinstance(self.encoder, RawPictures)  # no viewer of this output decodes Opus
        opus = () if raw else tuple((int(p.pts), bytes(p)) for p in self._opus.encode(audio))
        self.stats.encode_seconds.append(time.perf_counter() - started)
        pending.append((slot, audio, opus, picture.speech and not repeat, repeat, picture.segment, picture.picture))
        return packets

    def _match(self, packets: list[EncodedVideo], pending: deque) -> None:
        """Pair each access unit with its slot (an encoder with output delay returns older slots' units), then send
        it."""
        for packet in packets:
            while pending and pending[0][0] < packet.index:
                log.warning("output %s: the encoder returned no picture for slot %d", self.name, pending.popleft()[0])
            if not pending or pending[0][0] != packet.index:
                log.warning("output %s: dropping an access unit for unknown slot %d", self.name, packet.index)
                continue
            slot, audio, opus, speech, repeat, segment, picture = pending.popleft()
            encoder = self.encoder
            self._send(
                EncodedFrame(
                    slot,
                    encoder.width,
                    encoder.height,
                    packet.data,
                    packet.keyframe,
                    audio,
                    opus,
                    speech,
                    repeat,
                    segment,
                    picture,
                )
            )

    def _send(self, frame: EncodedFrame) -> None:
        self._fanout.send(frame)
        self.stats.frames_released += 1


def image_device(image: torch.Tensor | np.ndarray) -> torch.device:
    """Where a frame's picture is (host arrays: the CPU)."""
    return image.device if isinstance(image, torch.Tensor) else torch.device("cpu")


def _sleep_until(deadline: float) -> None:
    wait = deadline - time.monotonic()
    if wait > 0:
        time.sleep(wait)
