"""The in-process backend of the pipecat video service: a live session of a runtime in the bot's own process.

For a single bot on its own GPU. Opening waits for the runtime loop's current tick (seconds on a CPU), so it runs on
a worker thread while the event loop goes on carrying the transport and the portrait's slots.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.audio.pcm import to_s16
from engine.runtime import AdmissionError, SessionClosed
from engine.runtime.backpressure import push_when_room
from integrations.avatar_backend import Refused, Shown
from integrations.slots import SlotPicker
from streaming.playback import PlaybackEvents
from streaming.push_messages import PlaybackEvent, PlaybackFinished
from streaming.sources.push import ProtocolError, PushFormat, decode_chunk

if TYPE_CHECKING:
    from avatars.cache import Avatar
    from engine.runtime.runtime import Runtime

log = logging.getLogger(__name__)


class RuntimeBackend:
    """A runtime session and the frames taken from it (at most ``max_held``)."""

    def __init__(self, runtime: Runtime, avatar: Avatar, options: dict[str, Any], max_held: int) -> None:
        self._runtime, self._avatar, self._options, self._max_held = runtime, avatar, options, max_held
        portrait = avatar.frames[0].cpu().numpy()
        self._portrait = np.ascontiguousarray(portrait).tobytes()
        self.size: tuple[int, int] | None = (portrait.shape[1], portrait.shape[0])
        self.audio_rate = 48_000
        self.session = None
        self._picker: SlotPicker | None = None
        self._finished_through = -1
        """The highest segment finished in the frames shown here (``streaming.playback``: the service's rule)."""
        self._playback = PlaybackEvents(self._take_event)

    def first_picture(self) -> bytes | None:
        """The avatar's portrait."""
        return self._portrait

    async def open(self) -> None:
        try:
            session = await asyncio.to_thread(self._runtime.open_session, self._avatar, live=True, **self._options)
        except (AdmissionError, SessionClosed) as exc:
            raise Refused(f"the avatar's runtime session could not be opened: {exc}") from exc
        self.session, self._picker = session, SlotPicker(session, self._max_held)
        self.audio_rate = session.audio_rate

    async def push_audio(self, pcm: bytes, sample_rate: int, channels: int, wanted: Callable[[], bool]) -> None:
        try:
            samples = decode_chunk(pcm, PushFormat(sample_rate, channels, "s16le"))
        except ProtocolError as exc:  # as the service answers such a push message: said, and dropped
            log.warning("dropped a chunk of TTS audio: %s", exc)
            return
        try:
            await push_when_room(lambda: self.session.push_audio(samples, sample_rate), wanted)
        except SessionClosed:
            pass

    def interrupt(self) -> None:
        if self.session is not None:
            try:
                self.session.interrupt()
            except SessionClosed:
                pass
        if self._picker is not None:
            self._picker.clear()

    async def end_segment(self) -> int | None:
        try:
            return self.session.end_segment()
        except SessionClosed:
            return None

    def shown(self, segment: int) -> bool:
        """Whether ``segment``'s playback finished: a frame numbered above it was shown (``streaming.playback``)."""
        return self._finished_through >= segment

    def next(self) -> Shown | None:
        if self._picker is None:
            return None
        try:
            frame = self._picker.next()
        except SessionClosed:
            return None
        if frame is None:
            return None
        self._playback.shown(frame.speech, frame.segment)
        picture = np.ascontiguousarray(frame.image.cpu().numpy()).tobytes()
        return Shown(frame.index, picture, to_s16(frame.audio) if frame.speech else None)

    def phase(self) -> float | None:
        """Anywhere: the picker shows each frame at the slot nearest its due time."""
        return None

    def _take_event(self, event: PlaybackEvent) -> bool:
        if isinstance(event, PlaybackFinished):
            self._finished_through = event.segment
        return True

    async def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = self._picker = None
