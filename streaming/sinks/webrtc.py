"""WebRTC preview with aiortc: every viewer gets the shared H.264 and Opus packets, never re-encoded.

A track whose ``recv()`` returns an ``av.Packet`` makes aiortc packetise it without encoding
(Annex-B H.264, Opus). With pre-encoded packets aiortc's own keyframe handling never reaches
our encoder, so this module does it: a viewer is fed from the moment its connection is up
(ICE + DTLS done), starting at the next IDR, which it asks the shared encoder for; the
browser's PLI/FIR (routed to it per sender by ``streaming.sinks.keyframe_requests``) asks
for one too. Each picture carries what it shows (``streaming.picture_tags``: its timestamp,
segment, speech), and a viewer's audio starts with a picture the tags name, on the pictures'
timeline, so a client can pair samples with pictures exactly.

Each viewer has bounded queues (drop-oldest): a viewer that stalls loses its own frames
(video then resumes at an IDR) and never slows the others, the RTMP output or the encoder.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from fractions import Fraction

import aioice.ice
import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError

from engine.timebase import FPS
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output import EncodedFrame
from streaming.picture_tags import PictureTag, tag_access_unit
from streaming.sinks.keyframe_requests import route_keyframe_requests

log = logging.getLogger(__name__)
VIDEO_TIME_BASE = Fraction(1, FPS)
AUDIO_TIME_BASE = Fraction(1, AUDIO_RATE)
H264_PROFILE = "42e01f"  # Constrained Baseline, level 3.1, packetization-mode 1: what the encoder makes
CONNECT_TIMEOUT = 10.0
"""Seconds an answered viewer has to connect (ICE + DTLS) before its slot is freed: offers never completed hold none."""


class ViewerRefused(RuntimeError):
    """The preview takes no new viewer (it is full, or the stream has ended)."""


def restrict_ice_to_loopback() -> None:
    """Gather ICE candidates on 127.0.0.1 only (aioice skips loopback by default and would use other interfaces).

    Used when the server is bound to loopback: the preview then never offers an address that
    is reachable from elsewhere. It replaces aioice's address lookup for the whole process.
    """
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []


def loopback_candidates(sdp: str) -> str:
    """The SDP without the ICE candidates not on 127.0.0.1 (a loopback server must not reach other addresses)."""
    return (
        "\r\n".join(line for line in sdp.splitlines() if not line.startswith("a=candidate") or _on_loopback(line))
        + "\r\n"
    )


def _on_loopback(candidate: str) -> bool:
    """Whether an ``a=candidate:`` line's connection address (its fifth field, RFC 8839) is 127.0.0.1."""
    fields = candidate.split()
    return len(fields) >= 8 and fields[4] == "127.0.0.1"


class PacketTrack(MediaStreamTrack):
    """A track that hands aiortc pre-encoded packets from a bounded queue (the oldest is dropped when full)."""

    def __init__(self, kind: str, maxsize: int) -> None:
        super().__init__()
        self.kind = kind
        self._queue: asyncio.Queue[av.Packet | None] = asyncio.Queue(maxsize)
        self.sent = 0

    def put(self, packet: av.Packet | None) -> bool:
        """Queue a packet (None ends the track); False when an older packet had to be dropped for it."""
        dropped = False
        if self._queue.full():
            self._queue.get_nowait()
            dropped = True
        self._queue.put_nowait(packet)
        return not dropped

    def clear(self) -> int:
        """Drop everything queued; returns how many packets."""
        count = self._queue.qsize()
        while not self._queue.empty():
            self._queue.get_nowait()
        return count

    async def recv(self) -> av.Packet:
        packet = await self._queue.get()
        if packet is None:
            self.stop()
            raise MediaStreamError
        self.sent += 1
        return packet


class Viewer:
    """One browser: its peer connection, its two packet tracks and whether it still waits for an IDR."""

    def __init__(self, pc: RTCPeerConnection, request_keyframe: Callable[[], None], queue_frames: int) -> None:
        self.id = secrets.token_urlsafe(8)
        self.pc = pc
        self.video = PacketTrack("video", queue_frames)
        self.audio = PacketTrack("audio", 2 * queue_frames)
        self.connected = False
        self.waiting_for_keyframe = True
        self.frames_dropped = 0
        self.keyframe_requests = 0
        self._request_keyframe = request_keyframe
        self._shift = 0
        self.audio_from: int | None = None
        """The timestamp of the picture whose audio this viewer's audio starts with (the first picture sent that has
        audio: the still shown before a session's first frame has none)."""
        self._last: tuple[int, float] | None = None
        """The last picture's timestamp (1/25 s) and when it was queued (monotonic seconds)."""

    def offer(self, frame: EncodedFrame) -> None:
        """Queue one released frame once connected: its picture from the first IDR on, tagged with what it shows
        (``streaming.picture_tags``), and its Opus packets from the first picture with audio on, on its timeline."""
        if not self.connected:
            return
        pts, now = frame.index + self._shift, time.monotonic()
        if self._last is not None and pts <= self._last[0]:
            # A numbering that starts again (the stream's own after the still shown before its first frame): its
            # timestamps go on from the last one by the time passed (rounded down), from an IDR.
            pts = self._last[0] + max(1, int((now - self._last[1]) * FPS))
            self._shift = pts - frame.index
            if not self.waiting_for_keyframe and not frame.keyframe:
                self.waiting_for_keyframe = True
                self.keyframe_wanted()
        shown = frame.keyframe or not self.waiting_for_keyframe
        if self.audio_from is None and frame.opus and (shown or self._last is not None):
            self.audio_from = pts  # audio sample n from the first packet sent belongs to picture audio_from + n // 1920
        self._offer_picture(frame, pts, now)
        if self.audio_from is not None:
            shift = (pts - frame.index) * AUDIO_SAMPLES_PER_FRAME
            for sample, data in frame.opus:
                self.audio.put(_packet(data, sample + shift, AUDIO_TIME_BASE))

    def _offer_picture(self, frame: EncodedFrame, pts: int, now: float) -> None:
        if self.waiting_for_keyframe and not frame.keyframe:
            self.frames_dropped += 1
            return
        self.waiting_for_keyframe = False
        self._last = (pts, now)
        tag = PictureTag(pts, self.audio_from, frame.segment, frame.speech, frame.repeat)
        if not self.video.put(_packet(tag_access_unit(frame.video, tag), pts, VIDEO_TIME_BASE)):
            self.frames_dropped += 1 + self.video.clear()
            self.waiting_for_keyframe = True
            self.keyframe_wanted()

    def keyframe_wanted(self) -> None:
        """This viewer needs an IDR (it joined, fell behind, or its browser sent PLI/FIR)."""
        self.keyframe_requests += 1
        self._request_keyframe()

    def end(self) -> None:
        """End both tracks (the browser sees the stream stop)."""
        self.video.put(None)
        self.audio.put(None)


def _packet(data: bytes, pts: int, time_base: Fraction) -> av.Packet:
    packet = av.Packet(data)
    packet.pts = pts
    packet.time_base = time_base
    return packet


class WebRtcPreview:
    """The preview sink of one session output: answers offers and feeds every connected viewer.

    ``loopback_only`` (the server is bound to 127.0.0.1) keeps ICE on 127.0.0.1 for the whole process;
    a viewer not connected ``connect_timeout`` seconds after its answer is dropped. ``on_watching(True)`` is called
    when the first viewer joins and ``on_watching(False)`` when the last one leaves, so the encoded packets need to
    reach this process only while someone watches.
    """

    name = "webrtc"

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        request_keyframe: Callable[[], None],
        max_viewers: int = 16,
        queue_seconds: float = 0.5,
        loopback_only: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT,
        on_watching: Callable[[bool], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_watching = on_watching
        self._request_keyframe = request_keyframe
        self.max_viewers = max_viewers
        self._queue_frames = max(2, round(queue_seconds * FPS))
        self._loopback_only = loopback_only
        self.connect_timeout = connect_timeout
        self._expiring: set[asyncio.Task] = set()
        if loopback_only:
            restrict_ice_to_loopback()
        self._viewers: set[Viewer] = set()
        self._closed = False
        self.viewers_total = 0
        self._gone = {"frames_sent": 0, "frames_dropped": 0, "keyframe_requests": 0}

    @property
    def viewers(self) -> int:
        """Viewers now connected."""
        return len(self._viewers)

    def send(self, frame: EncodedFrame) -> None:
        """Hand a released frame to every viewer (called from the output's thread; never blocks)."""
        if not self._closed and self._viewers:
            self._loop.call_soon_threadsafe(self._publish, frame)

    def _publish(self, frame: EncodedFrame) -> None:
        for viewer in tuple(self._viewers):
            viewer.offer(frame)

    async def join(self, sdp: str) -> tuple[str, str]:
        """Accept a viewer's SDP offer: its id (for ``leave``) and the SDP answer; once connected the viewer gets
        video from an IDR it asks the shared encoder for. ViewerRefused when full or ended, ValueError for a bad
        offer."""
        if self._closed:
            raise ViewerRefused("the stream has ended")
        if len(self._viewers) >= self.max_viewers:
            raise ViewerRefused(f"the preview serves at most {self.max_viewers} viewers")
        if self._loopback_only:
            sdp = loopback_candidates(sdp)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        viewer = Viewer(pc, self._request_keyframe, self._queue_frames)
        video = pc.addTransceiver(viewer.video, direction="sendonly")
        # Codec preferences must be set before setRemoteDescription: aiortc picks the answer's codecs there.
        codecs = RTCRtpSender.getCapabilities("video").codecs
        video.setCodecPreferences(
            [c for c in codecs if c.mimeType == "video/H264" and c.parameters.get("profile-level-id") == H264_PROFILE]
            + [c for c in codecs if c.mimeType == "video/rtx"]
        )
        route_keyframe_requests(video.sender, viewer.keyframe_wanted)
        pc.addTransceiver(viewer.audio, direction="sendonly")

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState == "connected" and not viewer.connected:
                viewer.connected = True
                viewer.keyframe_wanted()
            elif pc.connectionState in ("failed", "closed"):
                await self._drop(viewer)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            await pc.close()
            raise ValueError(
                f"the offer cannot be answered ({type(exc).__name__}: {exc}); send the browser's own SDP offer"
            ) from exc
        self._viewers.add(viewer)
        self.viewers_total += 1
        if len(self._viewers) == 1 and self._on_watching is not None:
            self._on_watching(True)
        task = asyncio.ensure_future(self._expire_unconnected(viewer))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)
        log.info("webrtc: viewer %d joined (%d watching)", self.viewers_total, len(self._viewers))
        return viewer.id, pc.localDescription.sdp

    async def leave(self, viewer_id: str) -> bool:
        """End viewer ``viewer_id`` (its player said goodbye); False when no such viewer is here."""
        viewer = next((v for v in self._viewers if v.id == viewer_id), None)
        if viewer is None:
            return False
        await self._drop(viewer)
        return True

    async def _expire_unconnected(self, viewer: Viewer) -> None:
        """Free ``viewer``'s slot if it has not connected within ``connect_timeout``."""
        await asyncio.sleep(self.connect_timeout)
        if not viewer.connected and viewer in self._viewers:
            log.info("webrtc: a viewer did not connect within %.1f s; its slot is freed", self.connect_timeout)
            await self._drop(viewer)

    async def _drop(self, viewer: Viewer) -> None:
        if viewer in self._viewers:
            self._viewers.discard(viewer)
            for key, value in _viewer_stats(viewer).items():
                self._gone[key] += value
            log.info("webrtc: a viewer left (%d watching)", len(self._viewers))
            if not self._viewers and self._on_watching is not None:
                self._on_watching(False)
        viewer.end()
        await viewer.pc.close()

    def close(self) -> None:
        """End the stream for every viewer (called from the output's thread)."""
        if not self._closed and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.aclose(), self._loop)

    async def aclose(self) -> None:
        """End every viewer's tracks and close their connections."""
        self._closed = True
        for task in tuple(self._expiring):
            task.cancel()
        for viewer in tuple(self._viewers):
            await self._drop(viewer)

    def stats(self) -> dict[str, int | float]:
        """Viewers now and in all; video frames sent, frames dropped and IDRs asked for, over all viewers ever."""
        totals = dict(self._gone)
        for viewer in tuple(self._viewers):
            for key, value in _viewer_stats(viewer).items():
                totals[key] += value
        return {"viewers": len(self._viewers), "viewers_total": self.viewers_total, **totals}


def _viewer_stats(viewer: Viewer) -> dict[str, int]:
    return {
        "frames_sent": viewer.video.sent,
        "frames_dropped": viewer.frames_dropped,
        "keyframe_requests": viewer.keyframe_requests,
    }
