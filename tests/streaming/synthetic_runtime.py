"""A synthetic runtime for the service tests: the engine core's runtime contract with no model behind it.

The service's core process builds it in place of the engine's (``ServiceOptions.runtime``), so the
tests run the real processes (front end, core, output workers), sockets and shared memory on two
CPU cores in seconds. Each avatar name gives frames of its own size; frames are the streaming
tests' synthetic pictures (index bits, flashes) on the session's live clock, ``LEAD`` ahead. ``anchor1080`` makes
1920x1080 frames, one a second (a CPU converts a 1080p frame to I420 in a good part of a second; the stream repeats it
meanwhile, and its encoder settings are what the broadcast tests read).
A session whose avatar is ``slow`` makes frames at half speed (the overload case), ``crawl`` one frame every 2 s
(the engine on a CPU), ``late`` its first frame only FIRST_LATE seconds after its opening (the engine's first window on
a CPU); ``late``'s portrait is PORTRAIT (the others' black). ``echo`` speaks what was pushed: its speech frames carry
the pushed audio itself (at 48 kHz), its idle frames silence, and a frame flashes where its audio is loud, so the
timing markers of ``harness.markers`` pushed in come out where a viewer can find them, each with the picture that
speaks it. A service may serve a synthetic avatar under another name (``avatars={"anchor": "echo"}``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import soxr
import torch

from engine.controls import Controls
from engine.runtime import AdmissionError, Backpressure, SessionClosed
from engine.runtime.session import Frame
from engine.timebase import FPS
from harness.markers import THRESHOLD
from serving.protocol import CoreConfig
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from tests.streaming.synthetic import picture, sound

AVATARS = {
    "anna": (64, 64),
    "ben": (96, 64),
    "slow": (64, 64),
    "crawl": (128, 128),
    "late": (128, 128),
    "anchor1080": (1920, 1080),
    "echo": (128, 128),
}
LEAD = 0.2
OFFLINE_SPEED = 10
"""Times real time a session that is not live (a render job) makes its frames."""
CAPACITY = 4
FIRST_LATE = 4.0
PORTRAIT = (200, 60, 60)


class FakeAvatar:
    def __init__(self, name: str) -> None:
        width, height = AVATARS.get(name, (128, 128))
        self.name, self.frames = name, torch.zeros(1, height, width, 3, dtype=torch.uint8)
        if name == "late":
            self.frames[:] = torch.tensor(PORTRAIT, dtype=torch.uint8)


class FakeAvatars:
    """The synthetic avatars, and those the service was started with (128 x 128 frames)."""

    def __init__(self, given: dict[str, str]) -> None:
        self.given = given

    def get(self, name: str) -> FakeAvatar:
        if name not in AVATARS and name not in self.given:
            raise LookupError(f"no avatar {name!r}; avatars available: {', '.join(self.names())}")
        return FakeAvatar(self.given[name] if self.given.get(name) in AVATARS else name)

    def names(self) -> list[str]:
        return sorted({*AVATARS, *self.given})


class FakeSession:
    """Frames on a live clock from its opening (half speed for ``slow``, one every 2 s for ``crawl``, one a second for
    ``anchor1080``); takes pushed audio as a live session does: up to 5 s ahead of its clock, then ``Backpressure``
    until the clock catches up. Pushed audio becomes speech frames (one per 40 ms pushed), numbered by segment as the
    engine's frames are."""

    audio_rate = AUDIO_RATE

    def __init__(self, avatar: FakeAvatar, seed: int, live: bool = True) -> None:
        self.avatar, self.seed, self.live = avatar, seed, live
        self.opened = time.monotonic()
        self.pushed_samples = 0
        self.height, self.width = avatar.frames.shape[1:3]
        self._anchor = time.monotonic() + LEAD + (FIRST_LATE if avatar.name == "late" else 0.0)
        self.period = {"slow": 2 / FPS, "crawl": 2.0, "anchor1080": 1.0}.get(avatar.name, 1 / FPS)
        self.next_index = 0
        self.pushed_seconds = 0.0
        self.ending_at: int | None = None
        self.closed = False
        self.interrupts = 0
        self.controls = Controls()
        self.speaking: deque[int] = deque()
        """The segment of each speech frame pushed and not yet made."""
        self.segment = 0
        self.segment_has_audio = False
        self.closed_log: list[tuple[int, bool]] = []
        self.echo = Echo() if avatar.name == "echo" else None
        self._lock = threading.Lock()

    @property
    def clock_anchor(self) -> float | None:
        """When frame 0 is shown; None until its first frame is ready, as the engine's runtime starts its clock."""
        if not self.live:
            return None
        return self._anchor if time.monotonic() >= self._anchor - LEAD else None

    @property
    def finished(self) -> bool:
        return self.closed or (self.ending_at is not None and self.next_index >= self.ending_at)

    def take_ready(self, limit: int | None = None) -> list[Frame]:
        with self._lock:
            frames = []
            due = (time.monotonic() - self._anchor + LEAD) / self.period
            if not self.live:  # a render job: OFFLINE_SPEED times real time, as far as its audio goes
                due = min(
                    (time.monotonic() - self.opened) * FPS * OFFLINE_SPEED, len(self.speaking) + self.next_index - 1
                )
            while self.next_index <= due and not self.finished and (limit is None or len(frames) < limit):
                i = self.next_index
                speech = bool(self.speaking)
                segment = self.speaking.popleft() if speech else self.segment
                if self.echo is None:
                    frames.append(
                        Frame(i, picture(i, self.width, self.height), sound(i), speech=speech, segment=segment)
                    )
                else:
                    audio = self.echo.take() if speech else np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)
                    image = picture(i, self.width, self.height, flash=bool(np.abs(audio).max() > THRESHOLD))
                    frames.append(Frame(i, image, audio, speech=speech, segment=segment))
                self.next_index += 1
            return frames

    def next_frame(self, timeout: float | None = None):
        if self.finished:
            return None
        raise TimeoutError

    def push_audio(self, pcm: np.ndarray, sample_rate: int, channels=None, block: bool = False) -> None:
        self._check_open()
        if self.live and self.pushed_seconds - (time.monotonic() - self._anchor) > 5.0:
            raise Backpressure("the synthetic session holds 5 s of audio not yet spoken")
        self.pushed_seconds += pcm.size / sample_rate
        if not self.live:  # a file's frames: its length at 25 fps, the last one started
            before = math.ceil(self.pushed_samples * FPS / sample_rate)
            self.pushed_samples += pcm.size
            with self._lock:
                self.speaking.extend([self.segment] * (math.ceil(self.pushed_samples * FPS / sample_rate) - before))
            return
        with self._lock:
            frames = (
                max(1, round(pcm.size / sample_rate * FPS)) if self.echo is None else self.echo.add(pcm, sample_rate)
            )
            self.speaking.extend([self.segment] * frames)
            self.segment_has_audio = True

    def update_controls(self, **changes: Any) -> Controls:
        self._check_open()
        self.controls = self.controls.replace(**changes)
        return self.controls

    def interrupt(self) -> int | None:
        self.interrupts += 1
        with self._lock:
            self.speaking.clear()
            if self.echo is not None:
                self.echo.clear()
            return self._close_segment(interrupted=True)

    def end_segment(self) -> int | None:
        self._check_open()
        with self._lock:
            return self._close_segment(interrupted=False)

    def closed_segments(self) -> list[tuple[int, bool]]:
        with self._lock:
            closed, self.closed_log = self.closed_log, []
            return closed

    def _close_segment(self, interrupted: bool) -> int | None:
        if not self.segment_has_audio:
            return None
        if self.echo is not None:
            self.speaking.extend([self.segment] * self.echo.flush())
        closed, self.segment, self.segment_has_audio = self.segment, self.segment + 1, False
        self.closed_log.append((closed, interrupted))
        return closed

    def end(self) -> None:
        self._check_open()
        with self._lock:
            self._close_segment(interrupted=False)
            self.ending_at = self.next_index + len(self.speaking) + (FPS // 5 if self.live else 0)

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed or self.ending_at is not None:
            raise SessionClosed("this session has ended")

    def stats(self) -> dict[str, float]:
        return {
            "frames_generated": self.next_index,
            "pushed_seconds": round(self.pushed_seconds, 3),
            "interrupts": self.interrupts,
        }


class Echo:
    """The pushed audio of an ``echo`` session at 48 kHz, in frames of AUDIO_SAMPLES_PER_FRAME."""

    def __init__(self) -> None:
        self._rate: int | None = None
        self._resampler: soxr.ResampleStream | None = None
        self._pending = np.zeros(0, np.float32)
        self._frames: deque[np.ndarray] = deque()

    def add(self, pcm: np.ndarray, rate: int) -> int:
        """Take pushed mono float32 audio; how many whole frames it completed."""
        if rate != self._rate:
            self._rate, self._resampler = rate, soxr.ResampleStream(rate, AUDIO_RATE, 1, dtype="float32")
        self._pending = np.concatenate((self._pending, self._resampler.resample_chunk(np.asarray(pcm, np.float32))))
        return self._cut()

    def flush(self) -> int:
        """The segment ends: the resampler's tail and the last partial frame (padded with silence) become frames; how
        many."""
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            self._pending = np.concatenate((self._pending, tail))
            self._rate = self._resampler = None
        if self._pending.size % AUDIO_SAMPLES_PER_FRAME:
            self._pending = np.pad(self._pending, (0, -self._pending.size % AUDIO_SAMPLES_PER_FRAME))
        return self._cut()

    def take(self) -> np.ndarray:
        return self._frames.popleft() if self._frames else np.zeros(AUDIO_SAMPLES_PER_FRAME, np.float32)

    def clear(self) -> None:
        self._frames.clear()
        self._pending = np.zeros(0, np.float32)
        self._rate = self._resampler = None

    def _cut(self) -> int:
        whole = self._pending.size // AUDIO_SAMPLES_PER_FRAME
        for k in range(whole):
            self._frames.append(self._pending[k * AUDIO_SAMPLES_PER_FRAME : (k + 1) * AUDIO_SAMPLES_PER_FRAME])
        self._pending = self._pending[whole * AUDIO_SAMPLES_PER_FRAME :]
        return whole


class FakeRuntime:
    default_controls = Controls()
    warmup_seconds = 0.0
    window_ms: dict = {}
    render_ms: dict = {}

    def __init__(self, admission: bool) -> None:
        self.admission = admission
        self.sessions: deque[FakeSession] = deque()

    def capacity(self) -> int:
        return CAPACITY

    def open_session(
        self,
        avatar: FakeAvatar,
        live: bool,
        overlap: int | None,
        seed: int,
        controls: Controls,
        latency: str = "faithful",
    ) -> FakeSession:
        self.sessions = deque(s for s in self.sessions if not s.finished)  # as the engine's, it keeps no ended one
        if live and self.admission and sum(s.live for s in self.sessions) >= CAPACITY:
            raise AdmissionError(f"this synthetic runtime serves at most {CAPACITY} live sessions")
        session = FakeSession(avatar, seed, live)
        self.sessions.append(session)
        return session

    def metrics(self) -> dict[str, Any]:
        return {"sessions": sum(not s.finished for s in self.sessions), "capacity": CAPACITY}

    def close(self) -> None:
        for session in self.sessions:
            session.close()


def build(config: CoreConfig) -> tuple[FakeRuntime, FakeAvatars]:
    """The core's runtime and avatars (``ServiceOptions(runtime="tests.streaming.synthetic_runtime:build")``)."""
    return FakeRuntime(config.admission), FakeAvatars(config.avatars)


def build_slowly(config: CoreConfig) -> tuple[FakeRuntime, FakeAvatars]:
    """``build`` after a minute: a core still warming up (the compile of a cold start)."""
    time.sleep(60)
    return build(config)


class BusyRuntime(FakeRuntime):
    """A runtime whose loop is inside a long tick when it is closed, as the engine's on a CPU (a window in a minute):
    its close waits a minute for the tick, and spends it in torch's C++ code with the GIL released, as the engine's
    ticks do (a thread there when the process ends must not be unwound through that code)."""

    def close(self) -> None:
        super().close()
        square = torch.ones(256, 256)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            square @ square


def build_busy(config: CoreConfig) -> tuple[FakeRuntime, FakeAvatars]:
    """``build`` with a runtime whose close waits a minute for its tick."""
    return BusyRuntime(config.admission), FakeAvatars(config.avatars)
