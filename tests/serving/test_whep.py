"""WHEP egress on the service: headless Chromium plays a session's preview page through POST /whep, a second viewer
gets its picture at once (its own IDR from the worker's encoder), DELETE ends a viewer, and no packet leaves the
worker while nobody watches."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from harness.viewers import CHROMIUM_FLAGS, chromium_path
from serving.http import create_service_app
from serving.processes import ServiceOptions
from serving.service import Service
from tests.streaming.conftest import INSTALL_HINT, free_port
from tests.streaming.sinks.test_webrtc import poll

pytestmark = pytest.mark.slow
RUNTIME = "tests.streaming.synthetic_runtime:build"


def test_two_chromium_viewers_over_whep_and_a_player_that_says_goodbye(tmp_path: Path) -> None:
    chromium = chromium_path()
    if chromium is None:
        pytest.skip(f"chromium is not installed ({INSTALL_HINT})")
    from playwright.async_api import async_playwright

    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }

    async def scenario() -> None:
        # "crawl" makes a frame every 2 s, as the engine on a CPU (9-22 s): a viewer's IDR must come from the
        # stream's repeats, not from a new frame, so the second viewer's first picture is not a frame's render away.
        service = Service(ServiceOptions(workers=1, runtime=RUNTIME))
        await service.start()
        runner = web.AppRunner(create_service_app(service, token="s3cret"))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        auth = {"Authorization": "Bearer s3cret"}
        try:
            async with aiohttp.ClientSession(headers=auth) as http:
                created = await (await http.post(f"{base}/sessions", json={"avatar": "crawl", "preview": True})).json()
                session_id, page_url = created["id"], created["urls"]["preview"]
                await until(lambda: service.sessions[session_id].output_stats.get("frames_released", 0) > 25)
                sent = (await (await http.get(f"{base}/sessions/{session_id}")).json())["sinks"]["webrtc"][
                    "frames_sent"
                ]
                assert sent == 0, "no viewer: the worker sends the front end no preview packet"

                async with async_playwright() as playwright:
                    browser = await playwright.chromium.launch(
                        executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env
                    )
                    try:
                        first = await browser.new_page()
                        await first.goto(page_url)
                        stats = await poll(first, "s.framesDecoded >= 10 && s.audioSamples > 0", 20)
                        assert (stats["frameWidth"], stats["frameHeight"]) == (128, 128)
                        await asyncio.sleep(1.0)
                        second = await browser.new_page()
                        await second.goto(page_url)
                        late = await poll(second, "s.firstFrameMs !== null && s.framesDecoded > 0", 10)
                        print(f"second viewer: first picture {late['firstFrameMs']:.0f} ms after its answer")
                        assert late["firstFrameMs"] < 1000, late
                        assert service.sessions[session_id].preview.viewers == 2
                        location = await second.evaluate("preview.location")
                        assert location.startswith(f"/whep/{session_id}/")
                        assert (await http.delete(f"{base}{location}")).status == 200
                        assert service.sessions[session_id].preview.viewers == 1, "DELETE ends that viewer, and only it"
                        assert (await http.delete(f"{base}{location}")).status == 404
                        await second.close()
                        before = (await poll(first, "true", 1))["framesDecoded"]
                        await asyncio.sleep(0.5)
                        assert (await poll(first, "true", 1))["framesDecoded"] - before >= 8, (
                            "the first viewer plays on"
                        )
                        await first.close()  # the page DELETEs its Location and closes its connection on the way out
                        await until(lambda: service.sessions[session_id].preview.viewers == 0)
                    finally:
                        await browser.close()

                await asyncio.sleep(1.5)  # the worker reports its counters once a second
                body = await (await http.get(f"{base}/sessions/{session_id}")).json()
                stopped = body["sinks"]["webrtc"]["frames_sent"]
                await asyncio.sleep(1.5)
                body = await (await http.get(f"{base}/sessions/{session_id}")).json()
                assert body["sinks"]["webrtc"]["frames_sent"] == stopped, "the last viewer left: the packets stop"
        finally:
            await runner.cleanup()
            await service.close()

    asyncio.run(scenario())


async def until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


PLAYER_PAGE = """<!doctype html><script>
async function play(whep, token) {
  const pc = new RTCPeerConnection();
  pc.addTransceiver("video", {direction: "recvonly"});
  pc.addTransceiver("audio", {direction: "recvonly"});
  window.video = document.createElement("video");
  video.muted = true; video.autoplay = true; document.body.append(video);
  pc.ontrack = (e) => { video.srcObject = e.streams[0] || new MediaStream([e.track]); };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => pc.iceGatheringState === "complete" ? done()
    : pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && done()));
  const answer = await fetch(whep, {method: "POST", body: pc.localDescription.sdp,
    headers: {"Content-Type": "application/sdp", "Authorization": "Bearer " + token}});
  window.location_ = answer.headers.get("Location");
  if (answer.status !== 201) return answer.status;
  await pc.setRemoteDescription({type: "answer", sdp: await answer.text()});
  return 201;
}
</script>"""


def test_a_whep_player_on_an_allowed_origins_page_plays_and_another_origins_cannot(tmp_path: Path) -> None:
    """A browser's own CORS: the page of an allowed origin (another port) plays over WHEP; a refused one gets
    nothing."""
    chromium = chromium_path()
    if chromium is None:
        pytest.skip(f"chromium is not installed ({INSTALL_HINT})")
    from playwright.async_api import async_playwright

    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }

    async def scenario() -> None:
        allowed_port, refused_port, port = free_port(), free_port(), free_port()
        sites = []
        for page_port in (allowed_port, refused_port):
            pages = web.Application()
            pages.router.add_get("/", lambda request: web.Response(text=PLAYER_PAGE, content_type="text/html"))
            runner = web.AppRunner(pages)
            sites.append(runner)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", page_port).start()
        service = Service(ServiceOptions(workers=1, runtime=RUNTIME))
        await service.start()
        origin = f"http://127.0.0.1:{allowed_port}"
        app = create_service_app(service, token="s3cret", bound=("127.0.0.1", port), origins=(origin,))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer s3cret"}) as http:
                created = await (await http.post(f"{base}/sessions", json={"avatar": "anna", "preview": True})).json()
                session_id, whep = created["id"], created["urls"]["whep"]
                assert whep == f"{base}/whep/{session_id}", "the answer names the WHEP endpoint"
                async with async_playwright() as playwright:
                    browser = await playwright.chromium.launch(
                        executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env
                    )
                    try:
                        player = await browser.new_page()
                        await player.goto(origin)
                        assert await player.evaluate("([w, t]) => play(w, t)", [whep, "s3cret"]) == 201
                        assert (await player.evaluate("window.location_")).startswith(f"/whep/{session_id}/"), (
                            "Location is exposed"
                        )
                        await player.wait_for_function("video.videoWidth > 0 && video.currentTime > 0.2", timeout=20000)
                        other = await browser.new_page()
                        await other.goto(f"http://127.0.0.1:{refused_port}")
                        refused = await other.evaluate(
                            "([w, t]) => play(w, t).then(String, (e) => e.name)",
                            [whep, "s3cret"],
                        )
                        assert refused == "TypeError", "the browser refuses the answer: no CORS for that origin"
                        assert service.sessions[session_id].preview.viewers == 1
                    finally:
                        await browser.close()
        finally:
            await runner.cleanup()
            await service.close()
            for site in sites:
                await site.cleanup()

    asyncio.run(scenario())


CENTRE = """() => { const v = document.getElementById('video'), c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight; const g = c.getContext('2d'); g.drawImage(v, 0, 0);
  return Array.from(g.getImageData(c.width / 2, c.height / 2 + 8, 1, 1).data.slice(0, 3)); }"""


def test_the_preview_shows_the_avatars_portrait_until_the_first_frame(tmp_path: Path) -> None:
    """A CPU's first frame takes minutes: the viewer sees the portrait meanwhile (not black), then the stream itself."""
    chromium = chromium_path()
    if chromium is None:
        pytest.skip(f"chromium is not installed ({INSTALL_HINT})")
    from playwright.async_api import async_playwright

    from tests.streaming.synthetic_runtime import FIRST_LATE, PORTRAIT

    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp_path),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }

    async def scenario() -> None:
        service = Service(ServiceOptions(workers=1, runtime=RUNTIME))
        await service.start()
        runner = web.AppRunner(create_service_app(service))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http, async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env
                )
                try:
                    page = await browser.new_page()
                    opened = time.monotonic()
                    asked = {"avatar": "late", "preview": True}
                    created = await (await http.post(f"{base}/sessions", json=asked)).json()
                    await page.goto(created["urls"]["preview"])
                    await page.wait_for_function("document.getElementById('video').videoWidth > 0", timeout=10000)
                    shown = await page.evaluate(CENTRE)
                    waited = time.monotonic() - opened
                    print(f"the still shown {waited:.1f} s after the session opened")
                    assert waited < FIRST_LATE - 0.5, "before the first frame"
                    session = service.sessions[created["id"]]
                    assert all(abs(a - b) <= 12 for a, b in zip(shown, PORTRAIT)), f"{PORTRAIT}, not {shown}"
                    await until(lambda: session.output_stats.get("frames_released", 0) > 0, 10)
                    before = (await poll(page, "true", 1))["framesDecoded"]
                    await asyncio.sleep(1.5)
                    assert (await poll(page, "true", 1))["framesDecoded"] - before >= 25, "then the stream's own frames"
                    shown = await page.evaluate(CENTRE)
                    assert any(abs(a - b) > 30 for a, b in zip(shown, PORTRAIT)), f"frames replace it: {shown}"
                    assert session.output_stats["sinks"]["webrtc"]["stills_sent"] >= 1
                finally:
                    await browser.close()
        finally:
            await runner.cleanup()
            await service.close()

    asyncio.run(scenario())
