"""A pipecat video service for the Ditto avatar: TTS audio in, the avatar's pictures and their audio out at 25 fps.

Two backends, one set of pipecat rules. How bots should run: thin clients of the one live service on the GPU host
(``apps.serve``), which batches every bot's session in its GPU loop::

    video = DittoVideoService(url="http://gpu-host:8080", avatar="anchor", token=TOKEN)

No runtime, torch or engine is imported in the bot then: the session is created with ``POST /sessions`` at
``StartFrame``, TTS audio goes over its push WebSocket, pictures and their audio come back over WHEP
(``integrations.service_backend``). For a single bot on its own GPU, in process::

    video = DittoVideoService(runtime, avatar)      # avatars.cache.load_avatar(...)

Either way, place it between the TTS and ``transport.output()`` with the transport's ``video_out_enabled=True,
video_out_is_live=True, video_out_framerate=25``. It consumes ``TTSAudioRawFrame`` (any rate) and emits, on its
own 25 fps clock, one ``OutputImageRawFrame`` per slot (RGB, pts = slot index / 25) and, for speech frames, the
audio that frame speaks as an ``OutputAudioRawFrame``. Idle frames carry no audio, so silence never keeps the bot
"speaking". Where no frame is ready for a slot the last picture is shown again.

``InterruptionFrame`` and ``UserStartedSpeakingFrame`` interrupt: pending speech and every speech frame held are
dropped, and until the session's next idle frame the slots show the last idle picture. ``TTSStoppedFrame`` closes
the speech segment and is passed on once its last speech frame has been shown (at once on an interruption).
``EndFrame`` waits (at most ``end_timeout``) for the last speech frames, then ends the session; ``CancelFrame`` ends
it at once. A session that cannot be opened is an ``ErrorFrame`` saying why.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from engine.timebase import FPS
from integrations.avatar_backend import AvatarBackend, Refused
from streaming.slots import PERIOD, slot_time

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.controls import Controls
    from engine.runtime.runtime import Runtime

NS_PER_FRAME = 1_000_000_000 // FPS
PHASE_TOLERANCE_S = 0.002
"""The slot deadlines are kept from 0 to twice this after the backend's phase (never before it: a deadline early of
its picture's time would show the picture before it is surely there)."""


def phase_step(start: float, phase: float | None) -> float:
    """Seconds to move a clock whose slot 0 is at ``start`` onto ``phase``'s grid, ``PHASE_TOLERANCE_S`` after it (at
    most half a slot either way); 0 when there is no phase or the clock is within the tolerance of that."""
    if phase is None:
        return 0.0
    offset = (phase + PHASE_TOLERANCE_S - start + PERIOD / 2) % PERIOD - PERIOD / 2
    return offset if abs(offset) > PHASE_TOLERANCE_S else 0.0


@dataclass
class SlotRecord:
    """One output slot as the service emitted it (for measurements and tests): when, which frame, speech or not."""

    slot: int
    emitted_at: float
    frame_index: int | None
    speech: bool


@dataclass
class VideoServiceStats:
    """Counters of the service: slots emitted, slots repeating a picture, segments, interrupts, audio taken in."""

    slots: int = 0
    repeats: int = 0
    segments_started: int = 0
    segments_stopped: int = 0
    interrupts: int = 0
    audio_seconds_in: float = 0.0
    last_interrupt_at: float | None = None
    """``time.monotonic()`` of the last interruption."""
    log: deque[SlotRecord] = field(default_factory=lambda: deque(maxlen=2000))


class DittoVideoService(FrameProcessor):
    """TTS audio in, the avatar's frames and their audio out at 25 fps, interruptible within one slot."""

    def __init__(
        self,
        runtime: Runtime | None = None,
        avatar: Avatar | str | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        latency: str = "faithful",
        overlap: int | None = None,
        seed: int = 0,
        controls: Controls | dict[str, Any] | None = None,
        max_held_frames: int = 25,
        end_timeout: float = 10.0,
        **kwargs,
    ) -> None:
        """Remote: ``url`` of the live service, ``avatar`` a registered avatar's name, ``token`` the service's (if it
        has one), ``controls`` a dict of control fields. In process: an ``engine.runtime.Runtime`` and an avatar as
        ``avatars.cache.load_avatar`` returns it, ``controls`` an ``engine.controls.Controls``. ``latency``,
        ``overlap`` and ``seed`` are the session's in both."""
        super().__init__(**kwargs)
        if (runtime is None) == (url is None) or avatar is None:
            raise ValueError("give either url= and avatar= (the live service) or a runtime and an avatar (in process)")
        options = {"latency": latency, "overlap": overlap, "seed": seed, "controls": controls}
        if url is not None:
            from integrations.service_backend import ServiceBackend

            self.backend: AvatarBackend = ServiceBackend(url, str(avatar), token, options, max_held_frames)
        else:
            from integrations.runtime_backend import RuntimeBackend

            self.backend = RuntimeBackend(runtime, avatar, options, max_held_frames)
        self.stats = VideoServiceStats()
        self._end_timeout = end_timeout
        self._picture: bytes | None = self.backend.first_picture()
        self._idle_picture = self._picture
        self._segment: int | None = None
        self._generation = 0
        self._held_stops: deque[tuple[int, TTSStoppedFrame]] = deque()
        self._clock_task: asyncio.Task | None = None
        self._opening: asyncio.Task | None = None
        self._open = False

    @property
    def size(self) -> tuple[int, int] | None:
        """Width and height of the pictures (remote: known once the session is open)."""
        return self.backend.size

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """TTS audio goes into the session; interruptions clear it; every other frame passes on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self._start()
        elif isinstance(frame, EndFrame):
            await self._finish()
            await self.push_frame(frame, direction)
        elif isinstance(frame, CancelFrame):
            await self._stop()
            await self.push_frame(frame, direction)
        elif isinstance(frame, (InterruptionFrame, UserStartedSpeakingFrame)):
            await self.interrupt()
            await self.push_frame(frame, direction)
        elif isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            await self._push_audio(frame)
        elif isinstance(frame, TTSStartedFrame):
            self._begin_segment()
            await self.push_frame(frame, direction)
        elif isinstance(frame, TTSStoppedFrame):
            await self._end_segment(frame)
        else:
            await self.push_frame(frame, direction)

    async def interrupt(self) -> None:
        """Drop pending speech and every speech frame held; the next slots show the idle picture; held
        ``TTSStoppedFrame``s pass on (their segments are over)."""
        self.stats.interrupts += 1
        self.stats.last_interrupt_at = time.monotonic()
        self._generation += 1
        self._segment = None
        if self._open:
            self.backend.interrupt()
        self._picture = self._idle_picture
        while self._held_stops:
            await self.push_frame(self._held_stops.popleft()[1])

    # -- internals ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._clock_task is None:
            self._clock_task = self.create_task(self._clock(), name="ditto-video-clock")
        if not self._open and self._opening is None:
            self._opening = self.create_task(self._open_session(), name="ditto-video-open")

    async def _open_session(self) -> None:
        try:
            await self.backend.open()
        except Refused as exc:
            await self.push_error(str(exc), exc)
            return
        self._open = True

    async def _opened(self) -> bool:
        """Whether the session is open, once the one being opened is."""
        if not self._open and self._opening is not None:
            await asyncio.shield(self._opening)
        return self._open

    async def _finish(self) -> None:
        """Close the open segment and wait (bounded) until its last speech frame is shown, then end the session."""
        if await self._opened():
            if self._segment is not None:
                closed = await self.backend.end_segment()
                if closed is not None:
                    self._held_stops.append((closed, TTSStoppedFrame()))
                self._segment = None
            deadline = time.monotonic() + self._end_timeout
            while self._held_stops and time.monotonic() < deadline and self._clock_task is not None:
                await asyncio.sleep(1 / FPS)
        await self._stop()

    async def _stop(self) -> None:
        if self._clock_task is not None:
            await self.cancel_task(self._clock_task)
            self._clock_task = None
        if self._opening is not None:
            await asyncio.wait([self._opening])  # an opening cannot be cut short safely: let it end, then close
            self._opening = None
        if self._open:
            self._open = False
            await self.backend.close()
        self._held_stops.clear()

    def _begin_segment(self) -> None:
        self.stats.segments_started += 1
        self._segment = self.stats.segments_started

    async def _end_segment(self, frame: TTSStoppedFrame) -> None:
        """Close the segment in the session; the frame passes on once the segment's last speech frame is shown."""
        if self._segment is not None:
            self.stats.segments_stopped += 1
        self._segment = None
        closed = await self.backend.end_segment() if self._open else None
        if closed is None:
            await self.push_frame(frame)
        else:
            self._held_stops.append((closed, frame))

    async def _push_audio(self, frame: TTSAudioRawFrame) -> None:
        """Queue one TTS chunk, waiting while the session holds its lead; an interruption meanwhile drops it."""
        if not await self._opened():
            return
        if self._segment is None:
            self._begin_segment()
        generation = self._generation
        await self.backend.push_audio(
            frame.audio, frame.sample_rate, frame.num_channels, lambda: generation == self._generation
        )
        if generation == self._generation:
            self.stats.audio_seconds_in += len(frame.audio) / 2 / frame.num_channels / frame.sample_rate

    async def _clock(self) -> None:
        """One picture per 1/25 s slot, numbered from the start (pts = slot / 25), never drifting from wall time: the
        output clock's slot deadlines (``streaming.slots``), moved onto the backend's phase when it has one (the remote
        stream's own clock: a picture then waits for its slot only a few milliseconds); where the service's output
        releases a late slot late, a stalled event loop here skips the slots that passed rather than burst them
        out."""
        start = time.monotonic()
        slot = 0
        while True:
            await asyncio.sleep(max(0.0, slot_time(start, slot) - time.monotonic()))
            await self._emit(slot)
            slot += 1
            start += phase_step(start, self.backend.phase())
            behind = int((time.monotonic() - start) * FPS) - slot
            if behind > 0:  # the event loop stalled: skip the slots that passed rather than burst them out
                slot += behind

    async def _emit(self, slot: int) -> None:
        shown = self.backend.next() if self._open else None
        now = time.monotonic()
        if shown is None:
            if self._picture is None:
                self._picture = self._idle_picture = self.backend.first_picture()
            if self._picture is not None:
                self.stats.repeats += 1
                await self._push_picture(self._picture, slot)
            self.stats.log.append(SlotRecord(slot, now, None, False))
        else:
            self._picture = shown.picture
            if shown.speech_audio is None:
                self._idle_picture = shown.picture
            await self._push_picture(shown.picture, slot)
            if shown.speech_audio is not None:
                out = OutputAudioRawFrame(shown.speech_audio, sample_rate=self.backend.audio_rate, num_channels=1)
                out.pts = slot * NS_PER_FRAME
                await self.push_frame(out)
            self.stats.log.append(SlotRecord(slot, now, shown.index, shown.speech_audio is not None))
        self.stats.slots += 1
        while self._held_stops and self.backend.shown(self._held_stops[0][0]):
            await self.push_frame(self._held_stops.popleft()[1])

    async def _push_picture(self, picture: bytes, slot: int) -> None:
        image = OutputImageRawFrame(image=picture, size=self.size, format="RGB")
        image.pts = slot * NS_PER_FRAME
        await self.push_frame(image)
