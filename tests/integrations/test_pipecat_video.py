"""The pipecat video service in a real pipecat pipeline: SmallWebRTC (aiortc) to headless Chromium, in process over
the synthetic runtime's ``echo`` session (the runtime's session contract on a live clock, speaking what is pushed; the
model is not the point here): the first picture reaches the browser before any TTS audio, speech frames and their
audio follow, and an interruption mid-utterance stops every speech frame at once. The real runtime in process is
tests/integrations/test_livekit_avatar.py's; the real engine behind a bot, test_pipecat_remote.py's.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT

pytest.importorskip("pipecat", reason=INTEGRATIONS_HINT)

from aiohttp import web
from pipecat.frames.frames import InterruptionFrame, TTSAudioRawFrame, TTSStartedFrame, TTSStoppedFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

from harness.viewers import CHROMIUM_FLAGS, chromium_path
from integrations.pipecat_video import DittoVideoService
from streaming.sinks.webrtc import restrict_ice_to_loopback
from tests.streaming.conftest import INSTALL_HINT, free_port
from tests.streaming.synthetic_runtime import FakeAvatar, FakeRuntime

pytestmark = pytest.mark.slow
TTS_RATE = 24_000
PAGE = """<!doctype html><html><body>
<video id="v" autoplay playsinline muted></video><audio id="a" autoplay></audio><script>
const pc = new RTCPeerConnection({iceServers: []});
pc.addTransceiver('audio', {direction: 'recvonly'});
pc.addTransceiver('video', {direction: 'recvonly'});
const video = document.getElementById('v');
const stream = new MediaStream();
window.firstFrameAt = null;
window.peakRms = 0;
pc.ontrack = (e) => {
  stream.addTrack(e.track);
  video.srcObject = stream;
  if (e.track.kind !== 'audio') return;
  const heard = new MediaStream([e.track]);
  document.getElementById('a').srcObject = heard;
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  context.createMediaStreamSource(heard).connect(analyser);
  const buffer = new Float32Array(analyser.fftSize);
  setInterval(() => {
    analyser.getFloatTimeDomainData(buffer);
    const rms = Math.sqrt(buffer.reduce((sum, x) => sum + x * x, 0) / buffer.length);
    window.peakRms = Math.max(window.peakRms, rms);
  }, 10);
};
async function connect() {
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => { if (pc.iceGatheringState === 'complete') done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && done(); });
  const answer = await (await fetch('/offer', {method: 'POST', headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({sdp: pc.localDescription.sdp, type: 'offer'})})).json();
  await pc.setRemoteDescription(answer);
}
window.stats = async () => {
  const s = {framesDecoded: 0, frameWidth: 0, audioSamples: 0, ice: pc.iceConnectionState};
  (await pc.getStats()).forEach((r) => {
    if (r.type === 'inbound-rtp' && r.kind === 'video') {
      s.framesDecoded = r.framesDecoded || 0; s.frameWidth = r.frameWidth || 0;
    }
    if (r.type === 'inbound-rtp' && r.kind === 'audio') s.audioSamples = r.totalSamplesReceived || 0;
  });
  if (s.framesDecoded > 0 && window.firstFrameAt === null) window.firstFrameAt = Date.now();
  s.firstFrameAt = window.firstFrameAt;
  s.peakRms = window.peakRms;
  return s;
};
connect();
</script></body></html>"""


def tts_frames(seconds: float) -> list:
    """What a TTS service pushes: started, 20 ms chunks of s16 audio (a 220 Hz tone), stopped."""
    t = np.arange(int(seconds * TTS_RATE)) / TTS_RATE
    pcm = (0.4 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    step = TTS_RATE // 50
    chunks = [TTSAudioRawFrame(pcm[i : i + step].tobytes(), TTS_RATE, 1) for i in range(0, pcm.size, step)]
    return [TTSStartedFrame(), *chunks, TTSStoppedFrame()]


def test_the_browser_sees_the_avatar_before_any_tts_and_no_speech_frame_after_an_interruption(tmp_path) -> None:
    chromium = chromium_path()
    if chromium is None:
        pytest.skip(f"chromium is not installed ({INSTALL_HINT})")
    from playwright.async_api import async_playwright

    runtime, avatar = FakeRuntime(admission=False), FakeAvatar("echo")
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
        restrict_ice_to_loopback()
        service = DittoVideoService(runtime, avatar)
        width, height = service.size
        pipelines: list[PipelineTask] = []
        runs: list[asyncio.Task] = []

        async def offer(request: web.Request) -> web.Response:
            body = await request.json()
            connection = SmallWebRTCConnection()
            await connection.initialize(sdp=body["sdp"], type=body["type"])
            transport = SmallWebRTCTransport(
                webrtc_connection=connection,
                params=TransportParams(
                    audio_out_enabled=True,
                    video_out_enabled=True,
                    video_out_is_live=True,
                    video_out_width=width,
                    video_out_height=height,
                    video_out_framerate=25,
                ),
            )
            task = PipelineTask(Pipeline([transport.input(), service, transport.output()]), params=PipelineParams())
            pipelines.append(task)
            runs.append(asyncio.create_task(PipelineRunner(handle_sigint=False).run(task)))
            return web.json_response(connection.get_answer())

        app = web.Application()
        app.router.add_get("/", lambda _: web.Response(text=PAGE, content_type="text/html"))
        app.router.add_post("/offer", offer)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env
                )
                try:
                    page = await browser.new_page()
                    opened = time.time()
                    await page.goto(f"http://127.0.0.1:{port}/")
                    first = await poll(page, "s.framesDecoded > 0 && s.frameWidth > 0", 30)
                    assert first["frameWidth"] == width
                    assert service.stats.audio_seconds_in == 0 and service.stats.segments_started == 0, (
                        "no TTS audio yet"
                    )
                    print(
                        f"first picture in the browser {first['firstFrameAt'] / 1000 - opened:.2f} s after the page "
                        "opened"
                    )

                    await pipelines[0].queue_frames(tts_frames(1.6))
                    pushed = time.monotonic()
                    deadline = pushed + 10
                    while not any(r.speech for r in service.stats.log):
                        assert time.monotonic() < deadline, (
                            f"no speech frame within 10 s: {service.backend.session.stats()}"
                        )
                        await asyncio.sleep(0.02)
                    first_speech = next(r for r in service.stats.log if r.speech)
                    await asyncio.sleep(0.5)  # the utterance's first speech frames are shown and heard, more to come
                    heard = await poll(page, "s.peakRms > 0.05", 3)  # later on a busy machine: its audio lags
                    await pipelines[0].queue_frame(InterruptionFrame())
                    queued = time.monotonic()
                    while service.stats.interrupts == 0:
                        await asyncio.sleep(0.005)
                    interrupted = service.stats.last_interrupt_at
                    before = await poll(page, "true", 5)
                    await asyncio.sleep(2.0)
                    after = await poll(page, "true", 5)
                finally:
                    await browser.close()
            speech = [r for r in service.stats.log if r.speech]
            late = [r for r in speech if r.emitted_at > interrupted]
            print(
                f"first speech frame emitted {first_speech.emitted_at - pushed:.1f} s after the TTS audio; "
                f"{len(speech) - len(late)} speech frames before the interruption, {len(late)} after it; peak RMS "
                f"heard {heard['peakRms']:.3f}; "
                f"the interruption reached the service {1000 * (interrupted - queued):.1f} ms after it was queued"
            )
            assert not [r for r in late if r.emitted_at > interrupted + 0.2], (
                "no speech frame more than 200 ms after the interruption"
            )
            assert after["framesDecoded"] - before["framesDecoded"] >= 25, "pictures go on after the interruption"
            assert first["peakRms"] < 0.01, "silence before any speech"
            assert heard["peakRms"] > 0.05, f"the speech frames' tone was heard in the browser: {heard}"
            assert service.backend.session is not None and service.backend.session.stats()["interrupts"] == 1
        finally:
            for task in pipelines:
                await task.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            await runner.cleanup()

    asyncio.run(scenario())


async def poll(page, condition: str, seconds: float) -> dict:
    """The page's stats once ``condition`` (on ``s``) holds."""
    deadline = time.monotonic() + seconds
    while True:
        stats = await page.evaluate(f"stats().then((s) => ({condition}) ? s : null)")
        if stats is not None:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {condition}; last: {await page.evaluate('stats()')}")
        await asyncio.sleep(0.1)
