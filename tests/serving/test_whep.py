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
from serving.service import Service, ServiceOptions
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
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp_path), "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache")}

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
                sent = (await (await http.get(f"{base}/sessions/{session_id}")).json())["sinks"]["webrtc"]["frames_sent"]
                assert sent == 0, "no viewer: the worker sends the front end no preview packet"

                async with async_playwright() as playwright:
                    browser = await playwright.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env)
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
                        assert (await poll(first, "true", 1))["framesDecoded"] - before >= 8, "the first viewer plays on"
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
