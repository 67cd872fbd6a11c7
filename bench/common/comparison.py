"""A same-audio, same-seed comparison of two ways to run the engine (bench.steps, bench.latency_modes): its options,
its inputs, one offline session's frames."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common.sessions import load_bench_avatar
from engine.assets import demo_audio
from engine.engine import Engine
from engine.runtime import Runtime, RuntimeConfig


def session_frames(
    engine: Engine, avatar, audio: np.ndarray, rate: int, warm: Callable[[], None] | None = None, **session
) -> list:
    """Every frame of one offline session speaking ``audio`` (``session``: ``open_session``'s keywords); ``warm`` is
    called once the runtime has warmed up, before the session opens."""
    with Runtime(
        engine, RuntimeConfig(progress=False, admission=False, max_lead_seconds=len(audio) / rate + 1)
    ) as runtime:
        if warm is not None:
            warm()
        handle = runtime.open_session(avatar, live=False, **session)
        handle.push_audio(audio, rate, block=True)
        handle.end()
        frames = []
        while (frame := handle.next_frame()) is not None:
            frames.append(frame)
    return frames


def add_comparison_arguments(parser: argparse.ArgumentParser, cpu_seconds: float) -> None:
    """The options of a same-audio, same-seed comparison: weights, avatar, device, clip length, seed, output."""
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: random weights)")
    parser.add_argument("--avatar", help="cached avatar name or folder (default: register the astronaut)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--seconds", type=float, help=f"the first S seconds of the bundled speech (default all; CPU {cpu_seconds})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")


def comparison_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace, cpu_seconds: float):
    """(device, audio, rate, avatar) of a comparison: the bundled speech, cut to ``--seconds`` (``cpu_seconds`` on the
    CPU)."""
    if args.checkpoints and not args.avatar:
        parser.error("--checkpoints needs --avatar: an avatar registered with those weights")
    device = torch.device(args.device)
    audio, rate = demo_audio()
    seconds = args.seconds or (cpu_seconds if device.type == "cpu" else None)
    if seconds:
        audio = audio[: int(seconds * rate)]
    return device, audio, rate, load_bench_avatar(args.avatar, device)
