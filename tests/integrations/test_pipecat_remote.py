"""A pipecat bot as a thin client of the live service: ``DittoVideoService(url=...)`` against the service in processes
of its own, over its public API only (POST/GET/DELETE /sessions, the push WebSocket, WHEP).

Most tests run the service's real processes with the synthetic runtime in its engine core (frames in milliseconds,
``synthetic_service``); the last runs ``python -m apps.serve`` on the CPU engine (random weights, 2 DDIM steps), whose
first frame takes about a minute on two cores: there the pictures the bot shows are its own grey stand-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import aiohttp.web
import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT, REPO

pytest.importorskip("pipecat", reason=INTEGRATIONS_HINT)
pytest.importorskip("aiortc", reason=INTEGRATIONS_HINT)

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from harness.markers import OnsetDetector
from harness.nginx import free_port
from integrations.pipecat_video import DittoVideoService
from tests.integrations.synthetic_service import start, stop
from tests.streaming.synthetic import is_flash, read_index

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TTS_RATE = 24_000
SIZE = (128, 128)
"""The synthetic service's ``anchor`` frames."""


@dataclass
class Service:
    url: str
    process: subprocess.Popen


@pytest.fixture(scope="module")
def synthetic_service() -> Iterator[Service]:
    """The service's front end, engine core and output worker, the core on the synthetic runtime (capacity 4); its
    ``anchor`` speaks what is pushed and flashes where that is loud (``echo``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.integrations.synthetic_service", str(port), TOKEN, "echo"]
    process = start(command, url, env, 60, AUTH)
    yield Service(url, process)
    stop(process)


class Recorder(FrameProcessor):
    """What reaches the transport (pictures, audio and TTS frames, with their arrival time) and every ErrorFrame."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[float, OutputImageRawFrame]] = []
        self.audio: list[tuple[float, OutputAudioRawFrame]] = []
        self.stopped: list[float] = []
        self.errors: list[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        now = time.monotonic()
        if isinstance(frame, OutputImageRawFrame):
            self.images.append((now, frame))
        elif isinstance(frame, OutputAudioRawFrame):
            self.audio.append((now, frame))
        elif isinstance(frame, TTSStoppedFrame):
            self.stopped.append(now)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


class Bot:
    """A pipeline [errors, video, transport stand-in] run on this event loop."""

    def __init__(self, url: str, **options) -> None:
        self.video = DittoVideoService(url=url, avatar=options.pop("avatar", "anchor"), token=TOKEN, **options)
        self.upstream, self.out = Recorder(), Recorder()
        self.task = PipelineTask(Pipeline([self.upstream, self.video, self.out]), params=PipelineParams())
        self.run = asyncio.ensure_future(PipelineRunner(handle_sigint=False).run(self.task))

    async def until(self, condition, seconds: float = 10.0) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def end(self, frame: Frame | None = None) -> None:
        await self.task.queue_frame(frame or EndFrame())
        await asyncio.wait_for(self.run, 30)


def tts(seconds: float, chunk_s: float = 0.04, bursts: tuple[float, ...] = ()) -> list[Frame]:
    """An utterance: TTSStarted, ``seconds`` of a quiet 300 Hz tone at 24 kHz (a loud 1 kHz burst of 0.1 s at each of
    ``bursts`` seconds) in ``chunk_s`` chunks, TTSStopped."""
    t = np.arange(int(seconds * TTS_RATE)) / TTS_RATE
    wave = np.sin(2 * np.pi * 300 * t) * 0.25
    for at in bursts:
        loud = (t >= at) & (t < at + 0.1)
        wave[loud] = 0.9 * np.sin(2 * np.pi * 1000 * t[loud])
    pcm = (wave * 32767).astype(np.int16)
    step = int(chunk_s * TTS_RATE)
    chunks = [TTSAudioRawFrame(pcm[i : i + step].tobytes(), TTS_RATE, 1) for i in range(0, pcm.size, step)]
    return [TTSStartedFrame(), *chunks, TTSStoppedFrame()]


async def session_of(url: str, bot: Bot) -> dict:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with http.get(f"{url}/sessions/{bot.video.backend.session_id}") as answer:
            return await answer.json()


async def sessions(url: str) -> list[dict]:
    async with aiohttp.ClientSession(headers=AUTH) as http, http.get(f"{url}/sessions") as answer:
        return (await answer.json())["sessions"]


def test_pictures_at_25_fps_speech_with_its_audio_and_tts_stopped_after_the_last_speech_frame(
    synthetic_service,
) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        try:
            await bot.until(lambda: bot.video.backend.session_id is not None)
            assert [s["id"] for s in await sessions(synthetic_service.url)] == [bot.video.backend.session_id]
            await asyncio.sleep(2.0)
            assert bot.video.size == SIZE and not bot.out.audio, "idle: pictures, no audio"
            indices = [read_index(np.frombuffer(f.image, np.uint8).reshape(128, 128, 3)) for _, f in bot.out.images]
            assert len(set(indices)) >= 30, "the service's own frames arrive (decoded from WHEP), not a stand-in"

            await bot.task.queue_frames(tts(1.0))
            await bot.until(lambda: bot.out.stopped, 10)
            speech = bot.out.audio
            spoken = bot.video.backend.push.last_finished.position  # a starved machine's service sheds frames
            assert spoken > 0.5 and len(speech) == pytest.approx(spoken * 25, abs=3), "audio of each speech frame"
            assert all(a.sample_rate == 48_000 and a.num_channels == 1 and a.num_frames == 1920 for _, a in speech)
            assert max(np.abs(np.frombuffer(a.audio, np.int16)).max() for _, a in speech) > 1000, "audible"
            assert bot.out.stopped[0] >= speech[-1][0], "TTSStoppedFrame follows the segment's last speech frame"

            slots = [t for t, _ in bot.out.images]
            assert len(slots) / (slots[-1] - slots[0]) == pytest.approx(25, abs=1.0), "the bot's own 25 fps clock"
            steps = [b.pts - a.pts for (_, a), (_, b) in zip(bot.out.images, bot.out.images[1:])]
            assert all(step % 40_000_000 == 0 and step > 0 for step in steps), "pts: the slot index / 25"
            assert steps.count(40_000_000) >= 0.95 * len(steps), "a slot is skipped only when the event loop stalls"
        finally:
            await bot.end()

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", [InterruptionFrame, UserStartedSpeakingFrame])
def test_an_interruption_is_answered_by_the_service_and_ends_speech_at_once(synthetic_service, kind) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        try:
            await bot.until(lambda: bot.video.backend.receiver is not None and bot.out.images)
            await bot.task.queue_frames(tts(2.5))  # within the bot's push lead: all of it is at the service at once
            await bot.until(lambda: len(bot.out.audio) >= 10)
            await bot.task.queue_frame(kind())
            await bot.until(lambda: bot.video.stats.interrupts == 1)
            cut = time.monotonic()
            await bot.until(lambda: bot.video.backend.push.interrupts_answered == 1, 2)
            await asyncio.sleep(1.0)
            late = [round(t - cut, 3) for t, _ in bot.out.audio if t > cut + 0.045]
            assert not late, f"speech audio {late} s after the interruption"
            assert sum(t > cut for t, _ in bot.out.images) >= 20, "pictures go on"
            assert len(bot.out.audio) < 0.5 * 2.5 * 25, "the rest of the utterance was dropped on the service"
        finally:
            await bot.end()

    asyncio.run(scenario())


def test_five_seconds_pushed_at_once_are_taken_without_blocking_and_spoken_in_real_time(synthetic_service) -> None:
    """A TTS faster than real time (what TTS vendors send): the pipeline is not held up, the service takes the audio at
    once without shedding the session, and the avatar speaks it at 25 frames a second."""

    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        try:
            await bot.until(lambda: bot.video.backend.receiver is not None and bot.out.images)
            queued = time.monotonic()
            await bot.task.queue_frames(tts(5.0))
            await bot.until(lambda: bot.video.stats.audio_seconds_in >= 4.99, 1.0)
            while (await session_of(synthetic_service.url, bot))["counters"]["pushed_seconds"] < 4.99:
                assert time.monotonic() < queued + 1.5, "the service takes the pre-fill at once"
                await asyncio.sleep(0.05)
            await bot.until(lambda: bot.out.stopped, 12)
            spoken = [t for t, _ in bot.out.audio]
            assert len(spoken) == pytest.approx(125, abs=2), "every speech frame"
            assert spoken[-1] - spoken[0] == pytest.approx(5.0, abs=0.25), "spoken in real time"
            assert bot.video.backend.push.held_back is None, "within what the service takes ahead"
            assert (await session_of(synthetic_service.url, bot))["counters"]["repeated"] <= 2, "not shed"
            assert all(a.num_frames == 1920 for _, a in bot.out.audio), "never an empty audio frame"
        finally:
            await bot.end()

    asyncio.run(scenario())


def test_an_interruption_during_a_pre_fill_cuts_the_speech_at_once_and_later_speech_is_spoken(
    synthetic_service,
) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        try:
            await bot.until(lambda: bot.video.backend.receiver is not None and bot.out.images)
            await bot.task.queue_frames(tts(5.0)[:-1])
            await bot.until(lambda: len(bot.out.audio) >= 25, 5)
            await bot.task.queue_frame(InterruptionFrame())
            await bot.until(lambda: bot.video.stats.interrupts == 1)
            cut = time.monotonic()
            await bot.until(lambda: bot.video.backend.push.last_finished is not None, 2)
            finished = bot.video.backend.push.last_finished
            assert finished.interrupted and finished.position < 2.5, finished
            await asyncio.sleep(1.0)
            late = [round(t - cut, 3) for t, _ in bot.out.audio if t > cut + 0.045]
            assert not late, f"speech audio {late} s after the interruption"
            before = len(bot.out.audio)
            await bot.task.queue_frames(tts(1.0))
            await bot.until(lambda: bot.out.stopped, 5)
            assert len(bot.out.audio) - before == pytest.approx(25, abs=2), "the next utterance is spoken whole"
        finally:
            await bot.end()

    asyncio.run(scenario())


def test_each_picture_leaves_the_bot_with_its_own_audio(synthetic_service) -> None:
    """The synthetic avatar flashes in the frames whose audio is loud: in what the bot emits, each burst's sound starts
    with its flashing picture (measured: within a slot), and a picture's audio follows it at once."""

    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        try:
            await bot.until(lambda: bot.video.backend.receiver is not None and bot.out.images)
            await bot.task.queue_frames(tts(2.0, bursts=(0.5, 1.23)))
            await bot.until(lambda: bot.out.stopped, 8)
            detector, onsets = OnsetDetector(48_000), []
            for _, audio in bot.out.audio:
                samples = np.frombuffer(audio.audio, np.int16).astype(np.float32) / 32768
                onsets += [o.time for o in detector.feed(samples, audio.pts / 1e9)]
            onsets += [o.time for o in detector.feed(np.zeros(48_000, np.float32), bot.out.audio[-1][1].pts / 1e9 + 1)]
            pictures = [
                (f.pts / 1e9, is_flash(np.frombuffer(f.image, np.uint8).reshape(128, 128, 3)))
                for _, f in bot.out.images
            ]
            flashes = [t for (t, flash), (_, before) in zip(pictures[1:], pictures) if flash and not before]
            assert len(onsets) == len(flashes) == 2, (onsets, flashes)
            offsets = [round((onset - flash) * 1000, 1) for onset, flash in zip(onsets, flashes)]
            assert all(abs(offset) <= 40 for offset in offsets), f"sound against picture: {offsets} ms"
            emitted = {round(f.pts / 4e7): t for t, f in bot.out.images}
            apart = [t - emitted[round(a.pts / 4e7)] for t, a in bot.out.audio]
            assert max(apart) < 0.010, "a picture's audio leaves with it"
        finally:
            await bot.end()

    asyncio.run(scenario())


def test_end_frame_waits_for_the_last_speech_then_deletes_the_session(synthetic_service) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        await bot.until(lambda: bot.video.backend.receiver is not None)
        await bot.task.queue_frames(tts(1.0)[:-1])  # no TTSStoppedFrame: EndFrame closes the segment
        push = bot.video.backend.push
        await bot.end()
        spoken = push.last_finished.position
        assert spoken > 0.5 and len(bot.out.audio) == pytest.approx(spoken * 25, abs=3), "all shown before the end"
        assert await sessions(synthetic_service.url) == []

    asyncio.run(scenario())


def test_cancel_frame_deletes_the_session_at_once(synthetic_service) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        await bot.until(lambda: bot.video.backend.receiver is not None)
        await bot.task.queue_frames(tts(3.0))
        await bot.until(lambda: bot.out.audio)
        cancelled = time.monotonic()
        await bot.task.cancel()
        await asyncio.wait_for(bot.run, 10)
        assert time.monotonic() - cancelled < 2.0
        assert await sessions(synthetic_service.url) == []

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("options", "status", "says"),
    [
        ({"avatar": "nobody"}, 404, "nobody"),
        ({"latency": "instant"}, 400, "latency"),
        ({"avatar": "anna"}, 503, "4"),  # four sessions already hold the synthetic runtime's capacity
    ],
)
def test_a_refused_session_is_an_error_frame_with_the_service_s_reason(
    synthetic_service, options, status, says
) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession(headers=AUTH) as http:
            held = []
            if status == 503:
                for _ in range(4):
                    async with http.post(f"{synthetic_service.url}/sessions", json={"avatar": "anna"}) as answer:
                        held.append((await answer.json())["id"])
            try:
                bot = Bot(synthetic_service.url, **options)
                await bot.until(lambda: bot.upstream.errors)
                message = bot.upstream.errors[0].error
                assert f"({status})" in message and says in message, message
                await bot.end()
            finally:
                for session_id in held:
                    await http.delete(f"{synthetic_service.url}/sessions/{session_id}")

    asyncio.run(scenario())


def test_a_remote_bot_imports_neither_torch_nor_the_engine(synthetic_service, tmp_path) -> None:
    bot = remote_bot(synthetic_service.url, "--out", str(tmp_path / "bot.json"), "--seconds", "2")
    try:
        assert bot.wait(30) == 0
        report = json.loads((tmp_path / "bot.json").read_text())
        assert report["session"] and report["speech_pictures"] > 0, "it spoke through the service"
        assert not report["torch"] and not report["engine_runtime"], report
    finally:
        bot.kill()
        asyncio.run(delete_all(synthetic_service.url))


def test_a_bot_killed_mid_session_frees_its_session_within_seconds(synthetic_service, tmp_path) -> None:
    bot = remote_bot(synthetic_service.url, "--out", str(tmp_path / "bot.json"))
    try:
        session_id = json.loads(bot.stdout.readline())["session"]
        bot.kill()
        bot.wait()

        async def ended_within(seconds: float) -> dict:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                session = next(s for s in await sessions(synthetic_service.url) if s["id"] == session_id)
                if session["state"] == "ended":
                    return session
                await asyncio.sleep(0.25)
            raise AssertionError(f"session {session_id} still {session['state']} {seconds} s after its bot died")

        session = asyncio.run(ended_within(5.0))
        assert "disconnected" in session["error"], "GET says why it ended"
    finally:
        bot.kill()
        asyncio.run(delete_all(synthetic_service.url))


def remote_bot(url: str, *options: str) -> subprocess.Popen:
    """``harness.pipecat_bot`` in a process of its own; its first line on stdout names its session once open."""
    command = [sys.executable, "-m", "harness.pipecat_bot", "--url", url, "--token", TOKEN, *options]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


async def delete_all(url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for session in await sessions(url):
            await http.delete(f"{url}/sessions/{session['id']}")


@pytest.fixture(scope="module")
def cpu_service(tmp_path_factory) -> Iterator[Service]:
    """``python -m apps.serve`` on the CPU engine (random weights, 2 DDIM steps), serving a registered ``anchor``."""
    folder = tmp_path_factory.mktemp("remote-avatars")
    env = {**os.environ, "PYTHONPATH": str(REPO), "DITTO_AVATAR_DIR": str(folder / "avatars")}
    face = os.environ.get("DITTO_FACE_PYTHON", sys._base_executable)
    portrait = (
        "from PIL import Image; from skimage import data; Image.fromarray(data.astronaut()[:320, 64:384]).save('{}')"
    )
    subprocess.run([face, "-c", portrait.format(folder / "face.png")], check=True, timeout=60)
    registered = subprocess.run(
        [face, "-m", "apps.avatars", "register", str(folder / "face.png"), "--name", "anchor"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert registered.returncode == 0, registered.stderr[-2000:]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "apps.serve",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--output-workers",
        "1",
        "--http",
        f"127.0.0.1:{port}",
        "--token",
        TOKEN,
    ]
    process = start(command, url, env, 120, AUTH)
    yield Service(url, process)
    stop(process)


def test_against_apps_serve_on_the_cpu_engine_the_session_lives_and_ends_with_the_bot(cpu_service) -> None:
    async def scenario() -> None:
        bot = Bot(cpu_service.url)
        await bot.until(lambda: bot.video.backend.receiver is not None, 30)
        assert [s["avatar"] for s in await sessions(cpu_service.url)] == ["anchor"]
        await bot.task.queue_frames(tts(0.5))
        await asyncio.sleep(2.0)
        await bot.task.queue_frame(InterruptionFrame())
        await bot.until(lambda: bot.video.backend.push.interrupts_answered == 1, 5)
        slots = [t for t, _ in bot.out.images]
        assert bot.out.images[0][1].size == bot.video.size == (320, 320)
        assert len(slots) / (slots[-1] - slots[0]) == pytest.approx(25, abs=1.5), "25 fps while the engine renders"
        await bot.end()
        assert await sessions(cpu_service.url) == []

    asyncio.run(scenario())


STATS = """async () => {
  const s = {framesDecoded: 0, frameWidth: 0, audioEnergy: 0, ice: pc.iceConnectionState};
  (await pc.getStats()).forEach((r) => {
    if (r.type === 'inbound-rtp' && r.kind === 'video') {
      s.framesDecoded = r.framesDecoded || 0; s.frameWidth = r.frameWidth || 0;
    }
    if (r.type === 'inbound-rtp' && r.kind === 'audio') s.audioEnergy = r.totalAudioEnergy || 0;
  });
  const video = document.getElementById('video');
  const canvas = document.createElement('canvas');
  canvas.width = video.videoWidth; canvas.height = video.videoHeight;
  if (canvas.width) {
    canvas.getContext('2d').drawImage(video, 0, 0);
    s.pixels = Array.from(canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height / 2).data
      .filter((_, i) => i % 64 === 0)).join(',');
  }
  return s;
}"""


def test_the_example_bot_in_headless_chromium_shows_the_avatar_moving_and_speaking(synthetic_service, tmp_path) -> None:
    import importlib.util

    from harness.viewers import CHROMIUM_FLAGS, chromium_path

    chromium = chromium_path()
    if chromium is None:
        pytest.skip("chromium is not installed")
    from playwright.async_api import async_playwright

    spec = importlib.util.spec_from_file_location("pipecat_bot", REPO / "examples" / "pipecat_bot.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    home = tmp_path / "home"
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }

    async def scenario() -> None:
        runner = aiohttp.web.AppRunner(example.bot_app(synthetic_service.url, "anchor", TOKEN, SIZE))
        await runner.setup()
        port = free_port()
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env
                )
                page = await browser.new_page()
                await page.goto(f"http://127.0.0.1:{port}/")
                await page.evaluate("connect(false)")  # no microphone here: the bot speaks its greeting
                first = await until_page(page, "s.framesDecoded > 5 && s.pixels", 20)
                assert first["frameWidth"] == SIZE[0]
                assert [s["avatar"] for s in await sessions(synthetic_service.url)] == ["anchor"]
                await asyncio.sleep(1.0)
                later = await until_page(page, "s.audioEnergy > 0.01", 15)
                assert later["framesDecoded"] - first["framesDecoded"] >= 20, "pictures at the bot's 25 fps"
                assert later["pixels"] != first["pixels"], "the avatar's pictures change"
                await browser.close()
        finally:
            await runner.cleanup()  # the bot stops: its pipeline is cancelled
        assert await sessions(synthetic_service.url) == [], "the stopped bot's session is deleted"

    asyncio.run(scenario())


async def until_page(page, condition: str, seconds: float) -> dict:
    """The page's stats once ``condition`` (on ``s``) holds."""
    deadline = time.monotonic() + seconds
    while True:
        stats = await page.evaluate(STATS)
        if await page.evaluate(f"(s) => Boolean({condition})", stats):
            return stats
        assert time.monotonic() < deadline, f"not within {seconds} s: {condition}; last: { {**stats, 'pixels': '...'} }"
        await asyncio.sleep(0.2)
