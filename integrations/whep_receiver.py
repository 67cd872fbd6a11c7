"""Watch a session of the live service over WHEP (docs/whep.md) from a bot: aiortc receives and decodes the H.264 video
and Opus audio; the pictures wait here, each with what it shows and the audio that goes with it.

Every picture carries its tag (``streaming.picture_tags``): its stream timestamp (the service's slot, 1/25 s), its
speech segment, whether it speaks. The service starts a viewer's audio with a picture the tags name, on the pictures'
timeline, so the samples of picture ``s`` are the 1920 that start ``(s - audio_from) * 1920`` samples after the first
received: pictures and audio are paired exactly, whatever each track's delay. A picture is ready once it and all its
samples are here; its ready time feeds the ``Playout`` line the bot shows pictures on (a line of its own before the
audio starts: the stills shown before a session's first frame come on another clock). Audio is kept (48 kHz mono s16)
only for pictures not yet shown, at most ``MAX_AUDIO_SLOTS`` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

import aiohttp
import aioice.ice
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from yarl import URL

from engine.timebase import FPS
from integrations.playout import Playout
from streaming.picture_tags import PictureTag, read_tag

AUDIO_RATE = 48_000
SAMPLES_PER_SLOT = AUDIO_RATE // FPS
MAX_AUDIO_SLOTS = 4 * FPS
"""Slots of audio kept at most (a bot that stops taking pictures stops keeping their audio too)."""
AUDIO_WAIT_S = 0.5
"""Seconds a picture waits for its audio before it is ready without (the audio is lost, or its track stalled)."""

log = logging.getLogger(__name__)


def gather_on_loopback_too() -> None:
    """Offer a 127.0.0.1 ICE candidate as well (aioice skips loopback): a service bound to loopback offers only that
    address. Other candidates stay, so the process's other peer connections (the bot's own transport) are unchanged."""
    lookup = aioice.ice.get_host_addresses
    if getattr(lookup, "adds_loopback", False):
        return

    def with_loopback(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        found = lookup(use_ipv4, use_ipv6)
        return [*found, "127.0.0.1"] if use_ipv4 and "127.0.0.1" not in found else found

    with_loopback.adds_loopback = True
    aioice.ice.get_host_addresses = with_loopback


@dataclass
class Received:
    """A decoded picture and its tag, converted to RGB only if it is shown."""

    tag: PictureTag
    video: av.VideoFrame
    arrived: float

    @property
    def slot(self) -> int:
        return self.tag.pts

    def rgb(self) -> bytes:
        return np.ascontiguousarray(self.video.to_ndarray(format="rgb24")).tobytes()


class WhepReceiver:
    """One WHEP viewer of a session: its pictures (``pictures``, oldest first), the audio of each (``take_audio``),
    whether a picture's audio is all here (``complete``), and the line they are shown on (``playout``)."""

    def __init__(self, pc: RTCPeerConnection) -> None:
        self._pc = pc
        self.pictures: deque[Received] = deque()
        self.playout = Playout()
        self._first: int | None = None
        self._audio: dict[int, np.ndarray] = {}
        """Audio by slot from the first picture (0: the first picture's), s16 mono, SAMPLES_PER_SLOT each."""
        self._audio_end = 0
        """Samples from the first one received up to the end of the latest received."""
        self._waiting: dict[int, float] = {}
        """Pictures whose audio is not all here yet: slot from the first -> arrival."""
        self._tasks: list[asyncio.Task] = []
        self._location: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self.frames_received = 0
        self.untagged = 0
        """Pictures without a tag (a service that does not tag them): not shown."""
        pc.on("track", self._on_track)

    @classmethod
    async def connect(cls, http: aiohttp.ClientSession, url: str) -> WhepReceiver:
        """Offer to the WHEP endpoint ``url`` (``/whep/ID`` of the service) and start receiving."""
        if URL(url).host in ("127.0.0.1", "localhost"):
            gather_on_loopback_too()
        receiver = cls(RTCPeerConnection(RTCConfiguration(iceServers=[])))
        await receiver._offer(http, url)
        return receiver

    async def _offer(self, http: aiohttp.ClientSession, url: str) -> None:
        """Offer to receive video and audio from ``url``; its answer sets up the connection and the viewer's location
        (DELETEd at ``close``)."""
        pc = self._pc
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers every candidate here: no trickle needed
        async with http.post(url, data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}) as answer:
            if answer.status != 201:
                await pc.close()
                raise ConnectionError(f"WHEP {url} answered {answer.status}: {await answer.text()}")
            sdp, location = await answer.text(), answer.headers.get("Location")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        self._http, self._location = http, location and str(answer.url.join(URL(location)))

    def complete(self, slot: int) -> bool:
        """Whether every sample of picture ``slot`` has arrived (or, lost, never will: later audio has)."""
        return self._first is not None and (slot - self._first + 1) * SAMPLES_PER_SLOT <= self._audio_end

    def take_audio(self, slot: int) -> bytes:
        """Picture ``slot``'s audio (s16 mono, 48 kHz, always ``SAMPLES_PER_SLOT`` samples: silence where some never
        came), forgetting it and any older."""
        if self._first is None:
            return bytes(2 * SAMPLES_PER_SLOT)
        index = slot - self._first
        samples = self._audio.pop(index, None)
        for older in [k for k in self._audio if k < index]:
            del self._audio[older]
        return bytes(2 * SAMPLES_PER_SLOT) if samples is None else samples.tobytes()

    async def close(self) -> None:
        """Leave: DELETE the viewer's location, close the peer connection."""
        for task in self._tasks:
            task.cancel()
        if self._http is not None and self._location is not None and not self._http.closed:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with self._http.delete(self._location, timeout=aiohttp.ClientTimeout(total=2)):
                    pass
        await self._pc.close()

    def _on_track(self, track: MediaStreamTrack) -> None:
        reader = self._read_video if track.kind == "video" else self._read_audio
        self._tasks.append(asyncio.ensure_future(reader(track)))

    async def _read_video(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                self._on_picture(await track.recv(), time.monotonic())

    def _on_picture(self, frame: av.VideoFrame, now: float) -> None:
        tag = read_tag(frame.side_data)
        if tag is None:
            if not self.untagged:
                log.warning("the service's pictures carry no tag (streaming.picture_tags): they are not shown")
            self.untagged += 1
            return
        if self._first is None and tag.audio_from is not None:
            self._first, self.playout = tag.audio_from, Playout()
        self.pictures.append(Received(tag, frame, now))
        self.frames_received += 1
        if self._first is None or tag.pts < self._first:
            self.playout.ready(tag.pts, now)  # before the audio starts (the still before a session's first frame)
        elif self.complete(tag.pts):
            self.playout.ready(tag.pts, now)
        else:
            self._waiting[tag.pts - self._first] = now
        for slot in [s for s, arrived in self._waiting.items() if arrived < now - AUDIO_WAIT_S]:
            self.playout.ready(slot + self._first, self._waiting.pop(slot) + AUDIO_WAIT_S)

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                samples = frame.to_ndarray().reshape(-1)[:: len(frame.layout.channels)].astype(np.int16)
                self._on_audio(samples, int(frame.pts), time.monotonic())

    def _on_audio(self, samples: np.ndarray, start: int, now: float) -> None:
        """``samples`` (mono s16) that start ``start`` samples after the first one received."""
        at = start
        while at < start + samples.size:
            slot, offset = divmod(at, SAMPLES_PER_SLOT)
            take = min(SAMPLES_PER_SLOT - offset, start + samples.size - at)
            block = self._audio.setdefault(slot, np.zeros(SAMPLES_PER_SLOT, np.int16))
            block[offset : offset + take] = samples[at - start : at - start + take]
            at += take
        while len(self._audio) > MAX_AUDIO_SLOTS:
            del self._audio[min(self._audio)]
        self._audio_end = max(self._audio_end, start + samples.size)
        done = self._audio_end // SAMPLES_PER_SLOT
        for slot in [s for s in self._waiting if s < done]:
            self.playout.ready(slot + self._first, max(now, self._waiting.pop(slot)))
