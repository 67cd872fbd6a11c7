"""Watch a session of the live service over WHEP (docs/whep.md) from a bot: aiortc receives and decodes the H.264 video
and Opus audio; the pictures wait here on the sender's own clock for the bot's output slots.

A frame's index is its RTP time in 1/25 s from the first frame received, and its due time (``clock_anchor``) is
the first frame's arrival plus ``JITTER_S``: the service already paces the stream at 25 fps, so the bot's slots take
it as it comes, with a slot of slack for the network. The decoded audio (48 kHz mono s16) waits in a buffer of at
most ``MAX_AUDIO_S``; the oldest goes first when the bot falls behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import aiohttp
import aioice.ice
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from yarl import URL

from engine.timebase import FPS

AUDIO_RATE = 48_000
JITTER_S = 1 / FPS
MAX_AUDIO_S = 0.2


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
    """A decoded picture, converted to RGB only if it is shown."""

    index: int
    video: av.VideoFrame

    def rgb(self) -> bytes:
        return np.ascontiguousarray(self.video.to_ndarray(format="rgb24")).tobytes()


class WhepReceiver:
    """One WHEP viewer of a session: ``take_ready()`` and ``clock_anchor`` for ``integrations.slots.SlotPicker``, and
    ``take_audio()`` for the audio that arrived with the pictures."""

    def __init__(self, pc: RTCPeerConnection) -> None:
        self._pc = pc
        self._frames: list[Received] = []
        self._audio = bytearray()
        self._first_pts: int | None = None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
        self._tasks: list[asyncio.Task] = []
        self._location: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self.clock_anchor: float | None = None
        self.origin = float("inf")
        """When the sender released frame 0, on this clock: the least-delayed frame's arrival less its index's time
        (the sender's clock runs on wall time, one frame per slot; a starved network or machine only delays)."""
        self.frames_received = 0
        self.audio_dropped_s = 0.0
        pc.on("track", self._on_track)

    @classmethod
    async def connect(cls, http: aiohttp.ClientSession, url: str) -> WhepReceiver:
        """Offer to the WHEP endpoint ``url`` (``/whep/ID`` of the service) and start receiving."""
        if URL(url).host in ("127.0.0.1", "localhost"):
            gather_on_loopback_too()
        receiver = cls(RTCPeerConnection(RTCConfiguration(iceServers=[])))
        pc = receiver._pc
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers every candidate here: no trickle needed
        async with http.post(url, data=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}) as answer:
            if answer.status != 201:
                await pc.close()
                raise ConnectionError(f"WHEP {url} answered {answer.status}: {await answer.text()}")
            sdp, location = await answer.text(), answer.headers.get("Location")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        receiver._http, receiver._location = http, location and str(answer.url.join(URL(location)))
        return receiver

    def take_ready(self) -> list[Received]:
        """The pictures received since the last call, oldest first."""
        frames, self._frames = self._frames, []
        return frames

    def take_audio(self, samples: int) -> bytes:
        """Up to ``samples`` of the oldest audio received (s16 mono, 48 kHz)."""
        taken = bytes(self._audio[: 2 * samples])
        del self._audio[: 2 * samples]
        return taken

    def drop(self) -> None:
        """Forget every picture and sample received so far (an interruption's speech in flight)."""
        self._frames.clear()
        self._audio.clear()

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
                frame = await track.recv()
                if self._first_pts is None:
                    self._first_pts = frame.pts
                    self.clock_anchor = time.monotonic() + JITTER_S
                index = round(float((frame.pts - self._first_pts) * frame.time_base) * FPS)
                self.origin = min(self.origin, time.monotonic() - index / FPS)
                self._frames.append(Received(index, frame))
                self.frames_received += 1

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                for mono in self._resampler.resample(frame):
                    self._audio += mono.to_ndarray().tobytes()
                excess = len(self._audio) - int(2 * AUDIO_RATE * MAX_AUDIO_S)
                if excess > 0:
                    del self._audio[:excess]
                    self.audio_dropped_s += excess / 2 / AUDIO_RATE
