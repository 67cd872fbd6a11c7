"""A stand-in for ``python -m apps.serve`` that runs the real HTTP app, encoder and sinks over an echo session.

The echo session keeps the runtime's contract (frames at 25 fps on its own clock, each with
the 48 kHz audio it speaks) but has no model: pushed audio is spoken ``DELAY_FRAMES`` frames
after the frame due when it arrived, or right after the audio already placed. The benchmark's
harness (nginx, the RTMP reader, Chromium, the aiortc viewer, the markers, the split) can so
be checked on the CPU in seconds, against a delay known in advance.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
from aiohttp import web

from engine.audio.pcm import StreamingResampler
from engine.latency import FAITHFUL
from engine.runtime.session import Frame
from engine.timebase import FPS
from harness.live_server import LiveServer
from harness.nginx import wait_listening
from serving.server import numbered
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from streaming.output import SessionOutput
from streaming.sinks.rtmp import RtmpSink
from streaming.sinks.webrtc import WebRtcPreview
from tests.serving.inprocess import Stream, create_app
from tests.streaming.synthetic import picture

DELAY_FRAMES = 5


class EchoSession:
    """Live frames whose audio is what was pushed, ``DELAY_FRAMES`` frames later than the frame due at the push."""

    def __init__(self, size: int = 128) -> None:
        self.size = size
        self.audio = np.zeros(0, np.float32)
        self.next_index = 0
        self.start: float | None = None
        self.resampler: StreamingResampler | None = None
        self.ended = False
        self.latency = FAITHFUL
        self._lock = threading.Lock()

    @property
    def clock_anchor(self) -> float | None:
        """When its clock shows frame 0: the first ``next_frame`` call (frames are ready 0.1 s ahead of it)."""
        return self.start

    def next_frame(self, timeout: float | None = None) -> Frame | None:
        with self._lock:
            if self.ended:
                return None
            if self.start is None:
                self.start = time.monotonic()
            index = self.next_index
            wait = self.start + index / FPS - 0.1 - time.monotonic()
        if timeout is not None and wait > timeout:
            time.sleep(timeout)
            raise TimeoutError
        time.sleep(max(wait, 0.0))
        with self._lock:
            self.next_index += 1
            lo = index * AUDIO_SAMPLES_PER_FRAME
            audio = np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)
            have = self.audio[lo : lo + AUDIO_SAMPLES_PER_FRAME]
            audio[: have.size] = have
        return Frame(index, picture(index, self.size, self.size), audio, speech=bool(np.any(audio)))

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels: int | None = None, block: bool = False) -> None:
        with self._lock:
            if self.resampler is None or self.resampler.sample_rate != sample_rate:
                self.resampler = StreamingResampler(sample_rate, channels or 1, AUDIO_RATE)
            samples = self.resampler.push(pcm)
            due = 0 if self.start is None else int((time.monotonic() - self.start) * FPS)
            place = max(self.audio.size, (due + DELAY_FRAMES) * AUDIO_SAMPLES_PER_FRAME)
            self.audio = np.concatenate([self.audio, np.zeros(place - self.audio.size, np.float32), samples])

    def interrupt(self) -> None:
        pass

    def end(self) -> None:
        self.ended = True

    def close(self) -> None:
        self.ended = True

    def stats(self) -> dict[str, int]:
        return {"frames_generated": self.next_index, "deadline_misses": 0, "frames_dropped": 0}


class EchoServer(LiveServer):
    """LiveServer's interface over echo sessions, served in this process (``--rtmp``, ``--webrtc``, ``--sessions`` from
    the args)."""

    def __init__(self, args: list[str], http_port: int, log: Path) -> None:
        super().__init__(args, http_port, log)
        self.rtmp = args[args.index("--rtmp") + 1]
        self.sessions = int(args[args.index("--sessions") + 1]) if "--sessions" in args else 1
        self.webrtc = "--webrtc" in args
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._parts: tuple | None = None

    def start(self) -> EchoServer:
        self.started_at = time.monotonic()
        self.log.write_text("echo server\n")
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(30)
        return self

    async def _serve(self) -> None:
        streams = []
        for i in range(self.sessions):
            session = EchoSession()
            output = SessionOutput(session, encoder="x264", name=str(i))
            output.add_sink(RtmpSink(numbered(self.rtmp, i, self.sessions), output.request_keyframe))
            preview = WebRtcPreview(asyncio.get_running_loop(), output.request_keyframe) if self.webrtc else None
            if preview is not None:
                output.add_sink(preview)
            streams.append(Stream(str(i), session, output, preview, push=True))
        runtime = {"tick_wall_ms_p50": 0.0, "tick_wall_ms_p99": 0.0}
        runner = web.AppRunner(create_app(streams, runtime_metrics=lambda: runtime))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.http_port).start()
        for stream in streams:
            stream.output.start()
        self._parts = (streams, runner)

    def wait_ready(self, timeout: float):
        wait_listening(self.http_port, timeout)
        return self.fetch_metrics()

    def stop(self, timeout: float = 60.0) -> int | None:
        if self._parts is None:
            return None
        streams, runner = self._parts
        self._parts = None
        for stream in streams:
            stream.session.end()
            stream.output.stop()

        async def close() -> None:
            for stream in streams:
                if stream.preview is not None:
                    await stream.preview.aclose()
            await runner.cleanup()
            await asyncio.sleep(0.5)  # let the closed peer connections' callbacks run

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        return 0
