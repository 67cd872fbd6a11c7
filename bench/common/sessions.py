"""What the benchmarks that drive runtime sessions in this process share: the bundled speech looped, the hop clock
that pushes it, the avatar they speak with."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.assets import demo_audio
from engine.runtime import Backpressure
from engine.runtime.session import Session
from engine.timebase import FPS, HOP_FRAMES

HOP = HOP_FRAMES / FPS
"""Seconds of speech per push: one encoder hop."""


def speech(seconds: float) -> tuple[np.ndarray, int]:
    """The bundled clip, looped to ``seconds``."""
    audio, rate = demo_audio()
    reps = math.ceil(seconds * rate / len(audio))
    return np.concatenate([audio] * reps)[: int(seconds * rate)], rate


def push_schedule(sessions: int, pushes: int, stagger: bool) -> list[tuple[float, int, int]]:
    """(seconds from the start, hop k, session i) of every push, in time order; staggered, session i runs i/sessions of
    a hop late."""
    offsets = [i * HOP / sessions if stagger else 0.0 for i in range(sessions)]
    return sorted((k * HOP + offsets[i], k, i) for k in range(pushes) for i in range(sessions))


def push_in_real_time(
    sessions: list[Session], audio: np.ndarray, rate: int, pushes: int, stagger: bool = False
) -> tuple[float, int]:
    """Push ``pushes`` hops of ``audio`` into every session on the hop clock; (seconds taken, pushes refused).

    ``stagger``: session i pushes ``i / len(sessions)`` of a hop later than session 0, as independent clients do.
    """
    hop = int(HOP * rate)
    started = time.monotonic()
    refused = 0
    for at, k, i in push_schedule(len(sessions), pushes, stagger):
        time.sleep(max(0.0, started + at - time.monotonic()))
        try:
            sessions[i].push_audio(audio[k * hop : (k + 1) * hop], rate)
        except Backpressure:
            refused += 1
    time.sleep(max(0.0, started + pushes * HOP - time.monotonic()))
    return time.monotonic() - started, refused


def load_bench_avatar(name: str | None, device: torch.device):
    """A cached avatar, or scikit-image's astronaut registered now (random weights)."""
    from avatars.cache import load_avatar

    if name:
        return load_avatar(name, device)
    from avatars.register import register
    from engine.assets import write_demo_portrait
    from engine.engine import random_checkpoints

    folder = Path(tempfile.mkdtemp())
    cache = register(
        write_demo_portrait(folder), "bench", random_checkpoints(), device=device, cache_dir=folder, random_weights=True
    )
    return load_avatar(cache, device)
