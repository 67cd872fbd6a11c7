"""A pipecat bot in a process of its own, a thin client of the live service, measured from inside:
``python -m harness.pipecat_bot --url URL [--token T] --out REPORT.json``.

Its pipeline is ``[DittoVideoService(url=...), Sink]`` (the remote mode: no torch in the process). It speaks as a TTS
service does: utterances of the bundled speech, made quiet, with a timing marker (``harness.markers``) at the start and
one in the middle, as ``TTSStartedFrame``, ``TTSAudioRawFrame`` chunks on a real-time clock, ``TTSStoppedFrame``, then
an idle gap, on loop. With ``--interrupt-every S`` an ``InterruptionFrame`` comes at random (seeded) moments, S s apart
on average; one that falls in an utterance cuts it there and, as pipecat's TTS services do, sends no
``TTSStoppedFrame`` for it. The sink records every picture and audio frame the video service emits (when, which slot)
and every ``TTSStoppedFrame`` that passes, and finds the markers in the emitted audio: a marker's latency is from the
moment the chunk starting it entered the pipeline to the moment the bot emitted the audio carrying it.

It prints one JSON line once its session is open (``{"event": "open", "session": ...}``; ``"error"`` when refused).
``SIGUSR1`` starts the measured window (without it: the first picture); ``SIGINT``, ``SIGTERM`` or ``--seconds`` end
it: the feed sends the rest of the utterance in progress and stops, the stops still held by the video service and
the window's markers may come back for ``--drain`` s, the report is written to ``--out`` and the pipeline ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
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
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from engine.assets import demo_audio
from engine.timebase import FPS
from harness.markers import OnsetDetector, pair, utterance
from integrations.pipecat_video import DittoVideoService

NS = 1_000_000_000
END_TIMEOUT_S = 15.0
"""How long the pipeline may take to end after the report (EndFrame waits for the last speech frames)."""


@dataclass
class Window:
    """The measured window and the counters read at its start."""

    start: float | None = None
    end: float | None = None
    repeats_before: int = 0
    cpu_before: float = 0.0


@dataclass
class Fed:
    """What the feed sent into the pipeline."""

    segments: int = 0
    stops: list[int] = field(default_factory=list)
    """The ids of the TTSStoppedFrames sent."""
    cut: int = 0
    """Segments an interruption cut before their TTSStoppedFrame."""
    interrupts: list[float] = field(default_factory=list)
    markers: list[float] = field(default_factory=list)
    """When the chunk starting each marker entered the pipeline (marker n at index n)."""
    marker_segments: list[int] = field(default_factory=list)
    """The segment (1, 2, ... as started) each marker was sent in."""
    cut_segments: set[int] = field(default_factory=set)
    audio_seconds: float = 0.0
    events: list[tuple[float, str]] = field(default_factory=list)
    """(when, what): each segment started, cut or stopped, each interruption."""

    def note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))


class Errors(FrameProcessor):
    """The pipeline's head: keeps the message of every ErrorFrame that comes upstream (a refused session)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            self.errors.append(str(frame.error))
        await self.push_frame(frame, direction)


class Sink(FrameProcessor):
    """The transport's place: records the pictures, the audio (finding the markers in it) and the TTSStoppedFrames
    that reach it; ``on_first_picture`` is called with the first picture's arrival."""

    def __init__(self, on_first_picture) -> None:
        super().__init__()
        self.on_first_picture = on_first_picture
        self.pictures: list[tuple[float, int]] = []
        """(arrival, slot) of every OutputImageRawFrame."""
        self.audio: list[tuple[float, int, int]] = []
        """(arrival, slot, samples) of every OutputAudioRawFrame."""
        self.stops: list[tuple[float, int]] = []
        self.empty_audio = 0
        """Audio frames without a sample (pipecat's transports choke on them)."""
        self.av_offsets: list[float] = []
        """Seconds from each speech picture's arrival here to its audio's (the same slot)."""
        self.onsets: list[tuple[object, float]] = []
        """(marker onset, arrival of the audio frame it starts in)."""
        self._detector: OnsetDetector | None = None
        self._arrivals: dict[int, float] = {}

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        now = time.monotonic()
        if isinstance(frame, OutputImageRawFrame):
            if not self.pictures:
                self.on_first_picture(now)
            self.pictures.append((now, round(frame.pts * FPS / NS)))
        elif isinstance(frame, OutputAudioRawFrame):
            self._on_audio(frame, now)
        elif isinstance(frame, TTSStoppedFrame):
            self.stops.append((now, frame.id))
        await self.push_frame(frame, direction)

    def _on_audio(self, frame: OutputAudioRawFrame, now: float) -> None:
        samples = np.frombuffer(frame.audio, np.int16)
        slot = round(frame.pts * FPS / NS)
        self.empty_audio += samples.size == 0
        if self.pictures and self.pictures[-1][1] == slot:
            self.av_offsets.append(now - self.pictures[-1][0])
        self.audio.append((now, slot, samples.size))
        self._arrivals[slot] = now
        if self._detector is None:
            self._detector = OnsetDetector(frame.sample_rate)
        for onset in self._detector.feed(samples.astype(np.float32) / 32768, frame.pts / NS):
            self.onsets.append((onset, self._arrivals.get(int(onset.time * FPS + 1e-6), now)))


class Bot:
    """The pipeline, its feed and its measurements."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.video = DittoVideoService(
            url=args.url, avatar=args.avatar, token=args.token, seed=args.seed, latency=args.latency
        )
        self.errors = Errors()
        self.sink = Sink(self._first_picture)
        self.task = PipelineTask(
            Pipeline([self.errors, self.video, self.sink]), params=PipelineParams(), idle_timeout_secs=None
        )
        self.fed = Fed()
        self.window = Window()
        self.stop = asyncio.Event()
        self._random = random.Random(args.seed)
        self._next_interrupt: float | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.end_window)
        loop.add_signal_handler(signal.SIGUSR1, self.start_window)
        runner = asyncio.ensure_future(PipelineRunner(handle_sigint=False).run(self.task))
        if not await self._opened(runner):
            await self._end(runner)
            return 1
        if self.args.seconds:
            loop.call_later(self.args.seconds, self.end_window)
        await self._feed()
        if self.window.start is None:
            self.start_window(self.window.end)
        report = self._counters()
        await self._drain()
        report.update(self._report())
        Path(self.args.out).write_text(json.dumps(report, indent=1))
        await self._end(runner)
        return 0

    def start_window(self, at: float | None = None) -> None:
        """Start (or restart) the measured window at ``at`` (default now): the counters the report subtracts are read
        here."""
        self.window.start = time.monotonic() if at is None else at
        self.window.repeats_before = self.video.stats.repeats
        self.window.cpu_before = cpu_seconds()

    def end_window(self) -> None:
        """End the measured window now and stop the feed once its utterance in progress is sent whole."""
        if self.window.end is None:
            self.window.end = time.monotonic()
        self.stop.set()

    def _first_picture(self, at: float) -> None:
        if self.window.start is None:
            self.start_window(at)

    async def _opened(self, runner: asyncio.Future) -> bool:
        """Wait for the session (or a refusal) and say which on stdout."""
        backend = self.video.backend
        while backend.receiver is None and not self.errors.errors and not runner.done() and not self.stop.is_set():
            await asyncio.sleep(0.02)
        if backend.receiver is None:
            say({"event": "error", "message": "; ".join(self.errors.errors) or "no session"})
            return False
        say({"event": "open", "session": backend.session_id, "size": list(backend.size), "pid": os.getpid()})
        return True

    async def _end(self, runner: asyncio.Future) -> None:
        await self.task.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(runner, END_TIMEOUT_S)
        except TimeoutError:
            await self.task.cancel()

    # -- the feed --------------------------------------------------------------------------------

    async def _feed(self) -> None:
        """Utterances in real time, gaps between them, interruptions, until ``stop``."""
        speech, rate = demo_audio()
        chunk = round(self.args.chunk_ms / 1000 * rate)
        clock = time.monotonic()
        if self.args.interrupt_every:
            self._next_interrupt = clock + self._interval()
        while not self.stop.is_set():
            shift = (len(self.fed.markers) // 2 % 5) / FPS  # the middle marker walks through the model's 200 ms hop
            spoken = utterance(speech, rate, len(self.fed.markers), self.args.utterance, chunk, shift)
            marks = dict(zip(spoken.marker_offsets, range(len(self.fed.markers), len(self.fed.markers) + 2)))
            await self.task.queue_frame(TTSStartedFrame())
            self.fed.segments += 1
            self.fed.note("started")
            cut = False
            for lo in range(0, spoken.samples.size, chunk):
                if await self._wait_until(clock):
                    cut = True
                    break
                if lo in marks:
                    self.fed.markers.append(time.monotonic())
                    self.fed.marker_segments.append(self.fed.segments)
                piece = spoken.samples[lo : lo + chunk]
                pcm = (np.clip(piece, -1, 1) * 32767).astype("<i2").tobytes()
                await self.task.queue_frame(TTSAudioRawFrame(pcm, rate, 1))
                self.fed.audio_seconds += piece.size / rate
                clock += piece.size / rate
            if cut:
                self.fed.cut += 1
                self.fed.cut_segments.add(self.fed.segments)
                self.fed.note("cut")
                clock = time.monotonic()
            else:
                stop = TTSStoppedFrame()
                await self.task.queue_frame(stop)
                self.fed.stops.append(stop.id)
                self.fed.note("stop sent")
            clock += self.args.gap
            while not self.stop.is_set() and time.monotonic() < clock:
                await self._wait_until(clock)

    def _interval(self) -> float:
        return self._random.uniform(0.5, 1.5) * self.args.interrupt_every

    async def _wait_until(self, deadline: float) -> bool:
        """Sleep until ``deadline`` (or ``stop`` in a gap); True when an interruption fell due and was sent meanwhile.
        After ``stop`` none is sent: the utterance in progress ends whole, so its markers come back."""
        while True:
            now = time.monotonic()
            due = None if self.stop.is_set() else self._next_interrupt
            if due is not None and due <= now:
                await self.task.queue_frame(InterruptionFrame())
                self.fed.interrupts.append(now)
                self.fed.note("interrupt")
                self._next_interrupt = now + self._interval()
                return True
            until = deadline if due is None else min(deadline, due)
            if until <= now:
                return False
            if self.stop.is_set():
                await asyncio.sleep(until - now)
                continue
            try:
                await asyncio.wait_for(self.stop.wait(), until - now)
            except TimeoutError:
                pass

    async def _drain(self) -> None:
        """Let the stops the video service still holds pass and the window's last markers come back (their speech is
        still on the way when the feed ends)."""
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline:
            if len(self.sink.stops) >= len(self.fed.stops) and not self._markers()["not_found"]:
                return
            await asyncio.sleep(0.05)

    # -- the report ------------------------------------------------------------------------------

    def _counters(self) -> dict:
        """What the window saw, read at its end."""
        start, end = self.window.start, self.window.end
        seconds = end - start
        pictures = [(t, slot) for t, slot in self.sink.pictures if start <= t <= end]
        audio = [(t, slot, n) for t, slot, n in self.sink.audio if start <= t <= end]
        slots = np.diff([slot for _, slot in pictures])
        repeats = self.video.stats.repeats - self.window.repeats_before
        cpu = cpu_seconds() - self.window.cpu_before
        return {
            "session": self.video.backend.session_id,
            "pid": os.getpid(),
            "size": list(self.video.size or ()),
            "window_s": round(seconds, 2),
            "slots": len(pictures),
            "fps": round(len(pictures) / seconds, 3) if seconds > 0 else None,
            "slots_skipped": int(np.sum(np.clip(slots - 1, 0, None))),
            "repeats": repeats,
            "repeat_share": round(repeats / len(pictures), 5) if pictures else None,
            "speech_pictures": len(audio),
            "audio_seconds_out": round(sum(n for _, _, n in audio) / self.video.backend.audio_rate, 2),
            "cpu_seconds": round(cpu, 2),
            "cores": round(cpu / seconds, 4) if seconds > 0 else None,
        }

    def _report(self) -> dict:
        """The counts over the bot's life (after the drain), the markers, the process."""
        passed = [stop_id for _, stop_id in self.sink.stops]
        sent = set(self.fed.stops)
        push = self.video.backend.push
        return {
            "segments_started": self.fed.segments,
            "stops_sent": len(self.fed.stops),
            "stops_passed": sum(stop_id in sent for stop_id in passed),
            "stops_duplicated": len(passed) - len(set(passed)),
            "stops_missing": len(sent - set(passed)),
            "segments_cut": self.fed.cut,
            "interrupts": len(self.fed.interrupts),
            "interrupts_answered": push.interrupts_answered if push is not None else None,
            "audio_seconds_in": round(self.fed.audio_seconds, 2),
            "markers": self._markers(),
            "empty_audio_frames": self.sink.empty_audio,
            "av_offset_ms_max": round(max(self.sink.av_offsets, default=0.0) * 1000, 2),
            "backend": self._backend(),
            "timeline": self._timeline(),
            "errors": self.errors.errors,
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "torch": "torch" in sys.modules,
            "engine_runtime": "engine.runtime" in sys.modules,
        }

    def _backend(self) -> dict:
        """What the remote backend let go or silenced, and the playout line it showed pictures on."""
        backend = self.video.backend
        stats = getattr(backend, "stats", None)
        receiver = getattr(backend, "receiver", None)
        return {
            **(vars(stats) if stats is not None else {}),
            "untagged": receiver.untagged if receiver is not None else None,
            "margin_ms": round(receiver.playout.margin * 1000, 2) if receiver is not None else None,
        }

    def _timeline(self) -> list[tuple[float, str]]:
        """The feed's events and each TTSStoppedFrame passed, in seconds from the window's start."""
        passed = [(at, "stop passed") for at, _ in self.sink.stops]
        return [(round(at - self.window.start, 3), what) for at, what in sorted(self.fed.events + passed)]

    def _markers(self) -> dict:
        """Each marker sent in the window, paired with its onset in the emitted audio: the latency in ms; every marker
        not found is counted with its reason (``cut``: an interruption came after it was sent, in its segment). The
        send time of every marker (``time.monotonic()``, marker n at index n) and the window, for a witness to pair."""
        onsets = [onset for onset, _ in self.sink.onsets]
        arrived = [at for _, at in self.sink.onsets]
        latencies = {}
        for number, at in zip(pair(onsets, self.fed.markers, arrived), arrived):
            if number is not None:
                latencies[number] = (at - self.fed.markers[number]) * 1000
        in_window = [n for n, t in enumerate(self.fed.markers) if self.window.start <= t <= self.window.end]
        values = [round(latencies[n], 1) for n in in_window if n in latencies]
        missing = [n for n in in_window if n not in latencies]
        cut = [n for n in missing if self.fed.marker_segments[n] in self.fed.cut_segments]
        summary = {
            "sent": len(in_window),
            "found": len(values),
            "lost": {"cut": len(cut), "not_found": len(missing) - len(cut)},
            "not_found": [n for n in missing if n not in cut],
            "latency_ms": values,
            "by_marker": {n: round(latencies[n], 1) for n in in_window if n in latencies},
            "sent_at": self.fed.markers,
            "window": [self.window.start, self.window.end],
        }
        if values:
            summary.update({f"p{q}_ms": round(float(np.percentile(values, q)), 1) for q in (50, 95, 99)})
        return summary


def cpu_seconds() -> float:
    """User and system CPU time of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.pipecat_bot", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the live service, http://HOST:PORT")
    parser.add_argument("--token", help="the service's token")
    parser.add_argument("--avatar", default="anchor", help="a registered avatar's name on the service")
    parser.add_argument("--out", type=Path, required=True, help="write the report here (JSON)")
    parser.add_argument("--seconds", type=float, help="stop after this long (default: at SIGINT or SIGTERM)")
    parser.add_argument("--seed", type=int, default=0, help="the session's seed and the interruptions'")
    parser.add_argument("--latency", default="faithful", help="the session's latency mode: faithful or low")
    parser.add_argument("--interrupt-every", type=float, help="mean seconds between interruptions (default: none)")
    parser.add_argument("--utterance", type=float, default=4.0, help="seconds of each utterance")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds of silence after each utterance")
    parser.add_argument("--chunk-ms", type=float, default=40.0, help="milliseconds of audio per TTSAudioRawFrame")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds held TTSStoppedFrames may take at the end")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from loguru import logger

    logger.remove()  # pipecat logs every pipeline link at DEBUG; the bot's CPU is measured
    logger.add(sys.stderr, level="WARNING")
    return asyncio.run(Bot(parse_args(argv)).run())


if __name__ == "__main__":
    raise SystemExit(main())
