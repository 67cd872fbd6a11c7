"""WebRTC preview: a real headless Chromium decodes the shared H.264 and Opus; viewers get an IDR of their own and leave
cleanly."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiortc.rtp import RTCP_PSFB_PLI, RtcpPsfbPacket

from harness.viewers import CHROMIUM_FLAGS
from streaming.encoders.h264 import H264Settings
from streaming.output import EncodedFrame, SessionOutput
from streaming.output_settings import OutputSettings
from streaming.picture_tags import read_tag
from streaming.sinks.webrtc import Viewer, ViewerRefused, WebRtcPreview, loopback_candidates
from tests.serving.inprocess import Stream, create_app
from tests.streaming.conftest import INSTALL_HINT, free_port
from tests.streaming.synthetic import SyntheticSession

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def frame(index: int, keyframe: bool, audio: bool = True) -> EncodedFrame:
    opus = ((index * 1920, b"op"),) if audio else ()
    return EncodedFrame(index, 64, 64, b"\x00\x00\x00\x01\x65", keyframe, np.zeros(1920, np.float32), opus, False)


class Requests:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_a_viewer_starts_at_a_keyframe_and_a_stalled_one_drops_only_its_own_frames() -> None:
    async def scenario() -> None:
        requests = Requests()
        stalled, watching = Viewer(None, requests, queue_frames=5), Viewer(None, requests, queue_frames=5)
        stalled.offer(frame(0, keyframe=True))
        assert stalled.video._queue.empty(), "nothing is queued before the connection is up"
        stalled.connected = watching.connected = True
        received = []
        for i in range(40):
            for viewer in (stalled, watching):
                viewer.offer(frame(i, keyframe=i in (3, 30)))
            while not watching.video._queue.empty():
                received.append((await watching.video.recv()).pts)
        assert received == list(range(3, 40)), "video from the first keyframe on, nothing lost"
        assert watching.frames_dropped == 3
        assert stalled.video._queue.qsize() <= 5, "bounded: a stalled viewer holds at most its queue"
        assert stalled.frames_dropped > 20 and requests.count >= 1, "it fell behind, dropped, and asked for an IDR"
        assert stalled.audio._queue.qsize() == 10

    asyncio.run(scenario())


def test_a_numbering_that_starts_again_goes_on_from_the_last_timestamp_by_the_time_passed() -> None:
    """Stills, then the stream's frames from 0: timestamps never go back (a WHEP receiver numbers pictures by them)."""

    async def scenario() -> None:
        requests = Requests()
        viewer = Viewer(None, requests, queue_frames=50)
        viewer.connected = True
        viewer.offer(frame(0, keyframe=True))
        viewer.offer(frame(12, keyframe=True))
        await asyncio.sleep(0.2)
        for index, keyframe in ((0, False), (1, True), (2, False)):
            viewer.offer(frame(index, keyframe))
        pts = [(await viewer.video.recv()).pts for _ in range(viewer.video._queue.qsize())]
        assert pts[:2] == [0, 12] and len(pts) == 4, pts
        assert 5 <= pts[2] - 13 <= 7 and pts[3] == pts[2] + 1, f"0.2 s (5 frames) on from 12, then one by one: {pts}"
        assert requests.count == 1 and viewer.frames_dropped == 1, "the restart's P-frame waits for an IDR"

    asyncio.run(scenario())


def test_each_picture_is_tagged_and_the_audio_starts_on_the_pictures_timeline_at_a_tagged_picture() -> None:
    """A client pairs audio with pictures exactly: audio sample n from the first packet belongs to picture audio_from +
    n // 1920, also after a still without audio and a numbering that starts again."""

    async def scenario() -> None:
        viewer = Viewer(None, Requests(), queue_frames=50)
        viewer.connected = True
        viewer.offer(frame(0, keyframe=True, audio=False))  # the still before a session's first frame
        for index in range(1, 6):
            viewer.offer(frame(index, keyframe=False))
        await asyncio.sleep(0.12)
        viewer.offer(frame(0, keyframe=True))  # the stream's own numbering after the stills
        pictures = [await viewer.video.recv() for _ in range(viewer.video._queue.qsize())]
        audio = [await viewer.audio.recv() for _ in range(viewer.audio._queue.qsize())]
        sei = [bytes(p)[7:].replace(b"\x00\x00\x03", b"\x00\x00") for p in pictures]  # start code, NAL, type, size
        tags = [read_tag([payload]) for payload in sei]  # the SEI message's payload, as a decoder exports it
        assert [(t.pts, t.audio_from) for t in tags[:5]] == [(0, None), (1, 1), (2, 1), (3, 1), (4, 1)], tags
        restart = tags[6].pts
        assert restart >= 7 and tags[6].audio_from == 1
        audio_pts = [int(p.pts) for p in audio]
        assert audio_pts == [i * 1920 for i in (1, 2, 3, 4, 5, restart)], "from picture 1 on, on its timeline"
        assert all(bytes(p).startswith(b"\x00\x00\x00\x01\x06") for p in pictures), "the tag leads the slice"

    asyncio.run(scenario())


def test_browser_pli_reaches_the_shared_encoder() -> None:
    """aiortc routes PLI/FIR to RTCRtpSender._send_keyframe; the preview turns that into an encoder request."""

    async def scenario() -> None:
        from aiortc import RTCPeerConnection, RTCSessionDescription

        requests = Requests()
        preview = WebRtcPreview(asyncio.get_running_loop(), requests)
        client = RTCPeerConnection()
        client.addTransceiver("video", direction="recvonly")
        client.addTransceiver("audio", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())
        _, answer = await preview.join(client.localDescription.sdp)
        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        viewer = next(iter(preview._viewers))
        for _ in range(100):
            if viewer.connected:
                break
            await asyncio.sleep(0.05)
        assert requests.count == 1, "a viewer asks for an IDR once its connection is up"
        sender = next(t.sender for t in viewer.pc.getTransceivers() if t.kind == "video")
        await sender._handle_rtcp_packet(RtcpPsfbPacket(fmt=RTCP_PSFB_PLI, ssrc=1, media_ssrc=sender._ssrc))
        assert requests.count == 2
        await preview.aclose()
        await client.close()

    asyncio.run(scenario())


def test_only_candidates_whose_connection_address_is_127_0_0_1_are_kept() -> None:
    sdp = "\r\n".join(
        [
            "v=0",
            "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host",
            "a=candidate:2 1 udp 1694498815 127.0.0.2 50001 typ srflx raddr 127.0.0.1 rport 50000",
            "a=candidate:3 1 udp 2130706431 192.168.1.5 50002 typ host generation 0 127.0.0.1 ",
            "a=candidate:4 1 udp 2130706431 abcd.local 50003 typ host",
            "a=candidate:5 1 udp",
            "a=end-of-candidates",
        ]
    )
    kept = loopback_candidates(sdp).splitlines()
    assert [line for line in kept if line.startswith("a=candidate")] == [
        "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host"
    ]
    assert kept[0] == "v=0" and kept[-1] == "a=end-of-candidates"


def test_a_viewer_that_never_connects_frees_its_slot() -> None:
    """Offers whose ICE never completes hold a slot only for ``connect_timeout``: then new viewers are served again."""

    async def scenario() -> None:
        from aiortc import RTCPeerConnection

        preview = WebRtcPreview(asyncio.get_running_loop(), Requests(), max_viewers=2, connect_timeout=0.5)
        clients = []

        async def offer_without_candidates() -> str:
            client = RTCPeerConnection()
            clients.append(client)
            client.addTransceiver("video", direction="recvonly")
            client.addTransceiver("audio", direction="recvonly")
            await client.setLocalDescription(await client.createOffer())
            # No candidates and the answer is never applied: this peer's ICE can never complete.
            return (
                "\r\n".join(x for x in client.localDescription.sdp.splitlines() if not x.startswith("a=candidate"))
                + "\r\n"
            )

        for _ in range(2):
            await preview.join(await offer_without_candidates())
        with pytest.raises(ViewerRefused):
            await preview.join(await offer_without_candidates())
        for _ in range(40):
            if preview.viewers == 0:
                break
            await asyncio.sleep(0.05)
        assert preview.viewers == 0, "slots of viewers that never connected are freed after connect_timeout"
        await preview.join(await offer_without_candidates())
        assert preview.viewers == 1
        await preview.aclose()
        for client in clients:
            await client.close()

    asyncio.run(scenario())


@pytest.mark.slow
def test_chromium_decodes_the_preview_and_a_late_viewer_gets_a_picture_within_a_second(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    env = browser_env(tmp_path)

    async def scenario() -> None:
        session = SyntheticSession(256, 256)
        # A 10 s GOP: only the IDR the preview asks for can give a late viewer its first picture within a second.
        output = SessionOutput(session, encoder="x264", settings=H264Settings(keyframe_seconds=10))
        preview = WebRtcPreview(asyncio.get_running_loop(), output.request_keyframe)
        output.add_sink(preview)
        port = free_port()
        runner = web.AppRunner(create_app([Stream("0", session, output, preview)], notice="synthetic test pattern"))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        output.start()
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS, env=env
                )
                try:
                    first = await browser.new_page()
                    await first.goto(f"http://127.0.0.1:{port}/?session=0")
                    stats = await poll(first, "s.framesDecoded >= 25 && s.audioSamples > 0", 20)
                    assert (stats["frameWidth"], stats["frameHeight"]) == (256, 256)
                    assert "video/H264" in stats["codecs"] and "audio/opus" in stats["codecs"]
                    await asyncio.sleep(1.5)
                    second = await browser.new_page()
                    await second.goto(f"http://127.0.0.1:{port}/?session=0")
                    late = await poll(second, "s.firstFrameMs !== null && s.framesDecoded > 0", 10)
                    assert late["firstFrameMs"] < 1000, late
                    assert (late["frameWidth"], late["frameHeight"]) == (256, 256)
                    before = (await poll(first, "true", 1))["framesDecoded"]
                    await asyncio.sleep(1.0)
                    after = (await poll(first, "true", 1))["framesDecoded"]
                    assert after - before >= 15, "the first viewer kept playing while the second joined"
                    assert preview.stats()["viewers"] == 2
                    await second.close()
                    for _ in range(40):
                        if preview.viewers == 1:
                            break
                        await asyncio.sleep(0.05)
                    assert preview.viewers == 1, "a viewer that leaves is let go at once"
                    before = (await poll(first, "true", 1))["framesDecoded"]
                    await asyncio.sleep(0.5)
                    assert (await poll(first, "true", 1))["framesDecoded"] - before >= 8
                finally:
                    await browser.close()
        finally:
            session.end()
            await asyncio.to_thread(output.stop)
            await preview.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.slow
def test_chromium_decodes_a_high_profile_cbr_preview(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    env = browser_env(tmp_path)

    async def scenario() -> None:
        session = SyntheticSession(256, 256)
        settings = OutputSettings(preset="ultrafast").video(256, 256)
        assert settings.profile == "high", "what a broadcast session sends, the preview included"
        output = SessionOutput(session, encoder="x264", settings=settings)
        preview = WebRtcPreview(asyncio.get_running_loop(), output.request_keyframe)
        output.add_sink(preview)
        port = free_port()
        runner = web.AppRunner(create_app([Stream("0", session, output, preview)], notice="synthetic test pattern"))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        output.start()
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS, env=env
                )
                try:
                    page = await browser.new_page()
                    await page.goto(f"http://127.0.0.1:{port}/?session=0")
                    stats = await poll(page, "s.framesDecoded >= 25", 20)
                    assert (stats["frameWidth"], stats["frameHeight"]) == (256, 256)
                    assert "video/H264" in stats["codecs"]
                    await page.close()
                    for _ in range(40):
                        if preview.viewers == 0:
                            break
                        await asyncio.sleep(0.05)
                finally:
                    await browser.close()
        finally:
            session.end()
            await asyncio.to_thread(output.stop)
            await preview.aclose()
            await runner.cleanup()

    asyncio.run(scenario())


def browser_env(tmp_path: Path) -> dict[str, str]:
    """The environment for a headless Chromium whose files all stay under ``tmp_path`` (skips without Chromium)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"chromium is not installed ({INSTALL_HINT})")
    home = tmp_path / "home"
    home.mkdir()
    return {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }


async def poll(page, condition: str, seconds: float) -> dict:
    """preview.stats() from the page once ``condition`` (on ``s``) holds."""
    deadline = time.monotonic() + seconds
    while True:
        stats = await page.evaluate(f"preview.stats().then((s) => ({condition}) ? s : null)")
        if stats is not None:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {condition}; last: {await page.evaluate('preview.stats()')}")
        await asyncio.sleep(0.1)
