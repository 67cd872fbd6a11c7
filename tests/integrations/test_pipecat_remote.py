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
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import numpy as np
import pytest

from tests.integrations.conftest import INTEGRATIONS_HINT, REPO

pytest.importorskip("pipecat", reason=INTEGRATIONS_HINT)
pytest.importorskip("aiortc", reason=INTEGRATIONS_HINT)

from pipecat.frames.frames import (
    CancelFrame,
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

from harness.nginx import free_port
from integrations.pipecat_video import DittoVideoService
from tests.streaming.synthetic import read_index

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TTS_RATE = 24_000
SIZE = (128, 128)
"""The synthetic service's ``anchor`` frames."""


@dataclass
class Service:
    url: str
    process: subprocess.Popen


def start(command: list[str], url: str, env: dict[str, str], ready_s: float) -> subprocess.Popen:
    """Start a service process and wait until its session API answers."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-3000:]
        try:
            import urllib.request

            request = urllib.request.Request(f"{url}/sessions", headers=AUTH)
            with urllib.request.urlopen(request, timeout=1):
                return process
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError(f"{command} did not answer within {ready_s} s")


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def synthetic_service() -> Iterator[Service]:
    """The service's front end, engine core and output worker, the core on the synthetic runtime (capacity 4)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = start([sys.executable, "-m", "tests.integrations.synthetic_service", str(port), TOKEN], url, env, 60)
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


def tts(seconds: float, chunk_s: float = 0.04) -> list[Frame]:
    """An utterance: TTSStarted, ``seconds`` of a 300 Hz tone at 24 kHz in ``chunk_s`` chunks, TTSStopped."""
    t = np.arange(int(seconds * TTS_RATE)) / TTS_RATE
    pcm = (np.sin(2 * np.pi * 300 * t) * 8000).astype(np.int16)
    step = int(chunk_s * TTS_RATE)
    chunks = [TTSAudioRawFrame(pcm[i : i + step].tobytes(), TTS_RATE, 1) for i in range(0, pcm.size, step)]
    return [TTSStartedFrame(), *chunks, TTSStoppedFrame()]


async def sessions(url: str) -> list[dict]:
    async with aiohttp.ClientSession(headers=AUTH) as http, http.get(f"{url}/sessions") as answer:
        return (await answer.json())["sessions"]


def test_pictures_at_25_fps_speech_with_its_audio_and_tts_stopped_after_the_last_speech_frame(synthetic_service) -> None:
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
            assert len(speech) == pytest.approx(25, abs=2), "1 s of TTS: a second of speech frames, each with audio"
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
            assert sum(t > cut for t, _ in bot.out.images) >= 23, "pictures go on"
            assert len(bot.out.audio) < 0.5 * 2.5 * 25, "the rest of the utterance was dropped on the service"
        finally:
            await bot.end()

    asyncio.run(scenario())


def test_end_frame_waits_for_the_last_speech_then_deletes_the_session(synthetic_service) -> None:
    async def scenario() -> None:
        bot = Bot(synthetic_service.url)
        await bot.until(lambda: bot.video.backend.receiver is not None)
        await bot.task.queue_frames(tts(1.0)[:-1])  # no TTSStoppedFrame: EndFrame closes the segment
        await bot.end()
        assert len(bot.out.audio) == pytest.approx(25, abs=2), "every speech frame was shown before the end"
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
def test_a_refused_session_is_an_error_frame_with_the_service_s_reason(synthetic_service, options, status, says) -> None:
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


def test_a_remote_bot_imports_neither_torch_nor_the_engine(synthetic_service) -> None:
    bot = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.remote_bot", synthetic_service.url, TOKEN],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        report = json.loads(bot.stdout.readline())
        assert report["session"] and not report["torch"] and not report["engine_runtime"], report
    finally:
        bot.kill()
        bot.wait()
        asyncio.run(delete_all(synthetic_service.url))


@pytest.mark.xfail(
    reason="the service keeps a session whose push client and WHEP viewer are gone: it needs to end a session when its "
    "last push connection closes without 'end' (see docs/voice-agents.md)",
    strict=False,
)
def test_a_bot_killed_mid_session_frees_its_session_within_seconds(synthetic_service) -> None:
    bot = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.remote_bot", synthetic_service.url, TOKEN],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        session_id = json.loads(bot.stdout.readline())["session"]
        bot.kill()
        bot.wait()

        async def gone_within(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if session_id not in [s["id"] for s in await sessions(synthetic_service.url)]:
                    return True
                await asyncio.sleep(0.5)
            return False

        assert asyncio.run(gone_within(5.0))
    finally:
        bot.kill()
        asyncio.run(delete_all(synthetic_service.url))


async def delete_all(url: str) -> None:
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for session in await sessions(url):
            await http.delete(f"{url}/sessions/{session['id']}")
