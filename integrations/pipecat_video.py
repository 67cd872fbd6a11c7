"""A pipecat video service backed by a runtime session in the same process.

Place it between the TTS and ``transport.output()``::

    runtime = Runtime.from_checkpoints("checkpoints")
    avatar = load_avatar("anchor", runtime.device)
    video = DittoVideoService(runtime, avatar)
    Pipeline([transport.input(), stt, llm, tts, video, transport.output()])

with the transport's ``video_out_enabled=True, video_out_is_live=True, video_out_framerate=25`` and
``video_out_width/height`` = ``video.size``. The service consumes ``TTSAudioRawFrame`` (any rate: the session
resamples to the model's 16 kHz) and emits, on its own 25 fps output clock, one ``OutputImageRawFrame`` per
slot (RGB, pts = slot index / 25) and, for speech frames, the exact audio that frame speaks as an
``OutputAudioRawFrame``. Idle frames carry no audio, so silence never keeps the bot "speaking".

Frames flow from ``StartFrame`` on, before any TTS audio: the avatar's own portrait until the runtime's first
frame, then the runtime's idle motion. The session opens off the event loop (it waits for the runtime's current
tick); TTS audio that arrives meanwhile waits for it. A session the runtime cannot admit is an ``ErrorFrame``.
When the runtime has no frame ready for a slot (a CPU, an overloaded GPU) the last picture is shown again. ``InterruptionFrame`` interrupts the session (pending speech and untaken
frames dropped) and drops every speech frame this service still holds at once; until the runtime's next frame
the slot shows the last idle picture, never a speech frame of the interrupted segment. Memory is bounded: the
session holds at most its lead of audio and its frame queue; this service at most ``max_held_frames``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
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
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from engine.controls import Controls
from engine.runtime import AdmissionError, Backpressure, SessionClosed
from engine.timebase import FPS
from integrations.slots import SlotPicker

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.runtime.runtime import Runtime

NS_PER_FRAME = 1_000_000_000 // FPS
BACKPRESSURE_RETRY_S = 0.02


@dataclass
class SlotRecord:
    """One output slot as the service emitted it (for measurements and tests): when, which runtime frame, speech or not."""

    slot: int
    emitted_at: float
    runtime_index: int | None
    speech: bool


@dataclass
class VideoServiceStats:
    """Counters of the service: slots emitted, slots that repeated a picture, segments and interrupts, audio taken in."""

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
        runtime: Runtime,
        avatar: Avatar,
        *,
        latency: str = "faithful",
        overlap: int | None = None,
        seed: int = 0,
        controls: Controls | None = None,
        max_held_frames: int = 25,
        **kwargs,
    ) -> None:
        """``runtime`` an ``engine.runtime.Runtime``; ``avatar`` as ``avatars.cache.load_avatar`` returns it; ``latency``,
        ``overlap``, ``seed`` and ``controls`` are the session's (``Runtime.open_session``)."""
        super().__init__(**kwargs)
        self._runtime = runtime
        self._avatar = avatar
        self._options = {"latency": latency, "overlap": overlap, "seed": seed, "controls": controls}
        self._max_held = max_held_frames
        portrait = avatar.frames[0].cpu().numpy()
        self._portrait = np.ascontiguousarray(portrait).tobytes()
        self.size: tuple[int, int] = (portrait.shape[1], portrait.shape[0])
        self.session = None
        self.stats = VideoServiceStats()
        self._picker: SlotPicker | None = None
        self._picture: bytes = self._portrait
        self._idle_picture: bytes = self._portrait
        self._segment: int | None = None
        self._generation = 0
        self._clock_task: asyncio.Task | None = None
        self._opening: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """TTS audio goes into the session; interruptions clear it; every other frame passes on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self._start()
        elif isinstance(frame, (EndFrame, CancelFrame)):
            await self._stop()
            await self.push_frame(frame, direction)
        elif isinstance(frame, InterruptionFrame):
            self.interrupt()
            await self.push_frame(frame, direction)
        elif isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            await self._push_audio(frame)
        elif isinstance(frame, TTSStartedFrame):
            self._begin_segment()
            await self.push_frame(frame, direction)
        elif isinstance(frame, TTSStoppedFrame):
            if self._segment is not None:
                self.stats.segments_stopped += 1
            self._segment = None
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    def interrupt(self) -> None:
        """Drop pending speech in the session and every speech frame held here; the next slots show the idle picture."""
        self.stats.interrupts += 1
        self.stats.last_interrupt_at = time.monotonic()
        self._generation += 1
        self._segment = None
        if self.session is not None:
            try:
                self.session.interrupt()
            except SessionClosed:
                pass
        if self._picker is not None:
            self._picker.clear()
        self._picture = self._idle_picture

    # -- internals ---------------------------------------------------------------------------

    def _start(self) -> None:
        if self._clock_task is None:
            self._clock_task = self.create_task(self._clock(), name="ditto-video-clock")
        if self.session is None and self._opening is None:
            self._opening = self.create_task(self._open(), name="ditto-video-open")

    async def _open(self) -> None:
        """Open the runtime session on a worker thread: opening waits for the runtime loop's current tick (seconds on a
        CPU), and meanwhile this event loop must go on carrying the transport and the portrait's slots."""
        try:
            session = await asyncio.to_thread(self._runtime.open_session, self._avatar, live=True, **self._options)
        except (AdmissionError, SessionClosed) as exc:
            await self.push_error(f"the avatar's runtime session could not be opened: {exc}", exc)
            return
        self.session, self._picker = session, SlotPicker(session, self._max_held)

    async def _opened(self) -> bool:
        """Whether a session is open, once the one being opened is."""
        if self.session is None and self._opening is not None:
            await asyncio.shield(self._opening)
        return self.session is not None

    async def _stop(self) -> None:
        if self._clock_task is not None:
            await self.cancel_task(self._clock_task)
            self._clock_task = None
        if self._opening is not None:
            await asyncio.wait([self._opening])  # a thread cannot be cancelled: let the opening end, then close its session
            self._opening = None
        if self.session is not None:
            self.session.close()
            self.session = self._picker = None

    def _begin_segment(self) -> None:
        self.stats.segments_started += 1
        self._segment = self.stats.segments_started

    async def _push_audio(self, frame: TTSAudioRawFrame) -> None:
        """Queue one TTS chunk (s16 PCM), waiting while the session holds its lead; an interruption meanwhile drops it."""
        if not await self._opened():
            return
        if self._segment is None:
            self._begin_segment()
        pcm = np.frombuffer(frame.audio, dtype=np.int16).astype(np.float32) / 32768.0
        generation = self._generation
        while generation == self._generation:
            try:
                self.session.push_audio(pcm, frame.sample_rate, channels=frame.num_channels)
                self.stats.audio_seconds_in += pcm.size / frame.num_channels / frame.sample_rate
                return
            except Backpressure:
                await asyncio.sleep(BACKPRESSURE_RETRY_S)
            except SessionClosed:
                return

    async def _clock(self) -> None:
        """One picture per 1/25 s slot, numbered from the start (pts = slot / 25), never drifting from wall time."""
        start = time.monotonic()
        slot = 0
        while True:
            await asyncio.sleep(max(0.0, start + slot / FPS - time.monotonic()))
            await self._emit(slot)
            slot += 1
            behind = int((time.monotonic() - start) * FPS) - slot
            if behind > 0:  # the event loop stalled: skip the slots that passed rather than burst them out
                slot += behind

    async def _emit(self, slot: int) -> None:
        session = self.session
        frame = None
        if self._picker is not None:
            try:
                frame = self._picker.next()
            except SessionClosed:
                frame = None
        now = time.monotonic()
        if frame is None:
            self.stats.repeats += 1
            await self._push_picture(self._picture, slot)
            self.stats.log.append(SlotRecord(slot, now, None, False))
        else:
            picture = np.ascontiguousarray(frame.image.cpu().numpy()).tobytes()
            self._picture = picture
            if not frame.speech:
                self._idle_picture = picture
            await self._push_picture(picture, slot)
            if frame.speech:
                audio = (np.clip(frame.audio, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()
                out = OutputAudioRawFrame(audio, sample_rate=session.audio_rate, num_channels=1)
                out.pts = slot * NS_PER_FRAME
                await self.push_frame(out)
            self.stats.log.append(SlotRecord(slot, now, frame.index, frame.speech))
        self.stats.slots += 1

    async def _push_picture(self, picture: bytes, slot: int) -> None:
        image = OutputImageRawFrame(image=picture, size=self.size, format="RGB")
        image.pts = slot * NS_PER_FRAME
        await self.push_frame(image)
