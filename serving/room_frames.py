"""A room output's frames out: each frame the session's output releases (its I420 picture and 48 kHz audio), from the
release thread to the room's tracks on the rooms loop (``streaming.sinks.room_tracks``, which sends the picture when its
sound starts), at most ``QUEUED_FRAMES`` waiting; speech of a segment a clear or a pause cut
(``SegmentBook.cut``) goes out as the last idle picture and silence, so the avatar stops speaking at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np
from livekit import rtc

from serving.room_segments import SegmentBook
from streaming.output import EncodedFrame
from streaming.sinks.room_tracks import RoomTracks

QUEUED_FRAMES = 5
"""Released frames waiting for the room's tracks at most; older ones are dropped (a room that stalls slows no one)."""


class RoomFrames:
    """The released frames of one room output, to its tracks (``open_tracks``, then ``publish`` on the rooms loop)."""

    def __init__(
        self, width: int, height: int, loop: asyncio.AbstractEventLoop, book: SegmentBook, counters: dict[str, int]
    ) -> None:
        self.width, self.height, self._loop = width, height, loop
        self.book, self.counters = book, counters
        self.tracks: RoomTracks | None = None
        self._queued: deque[tuple[rtc.VideoFrame, np.ndarray]] = deque()
        self._queue_changed = asyncio.Event()
        self._idle: Any = None

    def open_tracks(self) -> RoomTracks:
        """The room's video and audio sources, made now: frames released from here on go to them."""
        self.tracks = RoomTracks.create(self.width, self.height)
        return self.tracks

    def send(self, frame: EncodedFrame) -> None:
        """One released frame (release thread), to the rooms loop; a cut segment's speech is shown idle."""
        if self.tracks is None or frame.picture is None:  # not in a room yet
            return
        picture, audio = frame.picture, frame.audio
        if frame.speech and frame.segment <= self.book.cut:
            picture, audio = self._idle if self._idle is not None else picture, audio * 0
            self.counters["frames_cut"] += 1
        elif frame.speech:
            self.book.spoken[frame.segment] = self.book.spoken.get(frame.segment, 0) + 1
            self.counters["speech_frames_sent"] += 1
        elif not frame.repeat:
            self._idle = picture
        video = rtc.VideoFrame(self.width, self.height, rtc.VideoBufferType.I420, picture.tobytes())
        self._loop.call_soon_threadsafe(self._offer, video, audio)

    def _offer(self, video: rtc.VideoFrame, audio: np.ndarray) -> None:
        self._queued.append((video, audio))
        while len(self._queued) > QUEUED_FRAMES:
            self._queued.popleft()
            self.counters["frames_dropped"] += 1
        self._queue_changed.set()

    async def publish(self) -> None:
        """Frames to the room's tracks, paced in real time by the audio source (``RoomTracks``)."""
        while True:
            await self._queue_changed.wait()
            self._queue_changed.clear()
            while self._queued:
                video, audio = self._queued.popleft()
                await self.tracks.push(video, audio)
                self.counters["frames_sent"] += 1
