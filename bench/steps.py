"""What 25 DDIM steps cost in quality against the reference's 50: the same audio, avatar and seed rendered both ways.

``python -m bench.steps [--checkpoints DIR --avatar NAME] [--seconds S] [--device cuda] [--out FILE.json]``

Reports the PSNR of each 25-step frame against the 50-step frame of the same index (full-size
RGB after paste-back) and the Pearson correlation over time of the driving keypoints the
renderer received (x_d after stitching, per coordinate, averaged over the 63). With random
weights (the default) the numbers check the plumbing only: they say nothing about the quality
of 25 steps until the official checkpoints and a registered avatar are given.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.common.stats import psnr
from engine.assets import demo_audio
from engine.engine import OFFLINE_OVERLAP, Engine
from engine.runtime import Runtime, RuntimeConfig
from engine.timebase import DEFAULT_STEPS

REFERENCE_STEPS = 50
"""The reference implementation's own default step count, the one the engine's default is compared with."""
CPU_SECONDS = 0.4
"""Seconds of speech rendered on the CPU by default (10 frames: minutes there)."""
RANDOM_NOTE = (
    "RANDOM WEIGHTS: these numbers check the plumbing only (same audio, avatar and seed rendered end to end at "
    "both step counts); they say nothing about the quality of 25 steps. Rerun with --checkpoints and --avatar."
)


def keypoint_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over coordinates of the Pearson correlation across frames of two (N, K, 3) keypoint tracks."""
    if a.shape != b.shape or a.shape[0] < 2:
        raise ValueError(f"need two tracks of the same shape with at least 2 frames, got {a.shape} and {b.shape}")
    x, y = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    x, y = x - x.mean(0), y - y.mean(0)
    spread = np.sqrt((x**2).sum(0) * (y**2).sum(0))
    moving = spread > 0
    if not moving.any():
        raise ValueError("no keypoint coordinate moves in both tracks")
    return float(((x * y).sum(0)[moving] / spread[moving]).mean())


def load_bench_avatar(name: str | None, device: torch.device):
    """A cached avatar, or scikit-image's astronaut registered now (random weights)."""
    from avatars.cache import load_avatar

    if name:
        return load_avatar(name, device)
    from avatars.register import register
    from engine.assets import write_demo_portrait
    from engine.engine import random_checkpoints

    folder = Path(tempfile.mkdtemp())
    cache = register(write_demo_portrait(folder), "bench", random_checkpoints(), device=device, cache_dir=folder, random_weights=True)
    return load_avatar(cache, device)


def psnr_summary(per_frame: list[float]) -> dict:
    """Mean (over frames that differ), min and count of identical frames of per-frame PSNRs."""
    finite = [p for p in per_frame if np.isfinite(p)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "min": min(per_frame) if per_frame else None,
        "identical_frames": len(per_frame) - len(finite),
    }


def session_frames(engine: Engine, avatar, audio: np.ndarray, rate: int, warm: Callable[[], None] | None = None, **session) -> list:
    """Every frame of one offline session speaking ``audio`` (``session``: ``open_session``'s keywords); ``warm`` is
    called once the runtime has warmed up, before the session opens."""
    with Runtime(engine, RuntimeConfig(progress=False, admission=False, max_lead_seconds=len(audio) / rate + 1)) as runtime:
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
    parser.add_argument("--seconds", type=float, help=f"the first S seconds of the bundled speech (default all; CPU {cpu_seconds})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")


def comparison_inputs(parser: argparse.ArgumentParser, args: argparse.Namespace, cpu_seconds: float):
    """(device, audio, rate, avatar) of a comparison: the bundled speech, cut to ``--seconds`` (``cpu_seconds`` on the CPU)."""
    if args.checkpoints and not args.avatar:
        parser.error("--checkpoints needs --avatar: an avatar registered with those weights")
    device = torch.device(args.device)
    audio, rate = demo_audio()
    seconds = args.seconds or (cpu_seconds if device.type == "cpu" else None)
    if seconds:
        audio = audio[: int(seconds * rate)]
    return device, audio, rate, load_bench_avatar(args.avatar, device)


def render(engine: Engine, avatar, audio: np.ndarray, rate: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Frames (N, H, W, 3) uint8 and the driving keypoints (N, 21, 3) the renderer was given, for one session."""
    backend = engine.backend
    seen: list[torch.Tensor] = []
    original: Callable = backend.render

    def recording(feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        seen.append(kp_driving.detach().float().cpu())
        return original(feature_3d, kp_source, kp_driving)

    def record() -> None:
        backend.render = recording

    try:
        frames = session_frames(engine, avatar, audio, rate, record, overlap=OFFLINE_OVERLAP, seed=seed)
    finally:
        vars(backend).pop("render", None)
    images = np.stack([f.image.cpu().numpy() for f in frames])
    keypoints = torch.cat(seen).numpy() if seen else np.zeros((0, 21, 3), np.float32)
    if len(keypoints) != len(images):
        raise RuntimeError(
            f"recorded {len(keypoints)} keypoint frames for {len(images)} images: the session no longer renders "
            "through backend.render(feature, kp_source, kp_driving); update bench/steps.py"
        )
    return images, keypoints


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__.splitlines()[0])
    add_comparison_arguments(parser, CPU_SECONDS)
    parser.add_argument("--steps", type=int, nargs=2, default=[DEFAULT_STEPS, REFERENCE_STEPS], metavar=("FEW", "MANY"))
    args = parser.parse_args(argv)
    device, audio, rate, avatar = comparison_inputs(parser, args, CPU_SECONDS)
    runs = {}
    for steps in args.steps:
        engine = Engine.from_checkpoints(args.checkpoints, device=device, steps=steps, compile_networks=False)
        started = time.perf_counter()
        runs[steps] = render(engine, avatar, audio, rate, args.seed)
        print(f"{steps} steps: {len(runs[steps][0])} frames in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        del engine
    (few_images, few_kp), (many_images, many_kp) = runs[args.steps[0]], runs[args.steps[1]]
    per_frame = [psnr(a, b) for a, b in zip(few_images, many_images)]
    result = {
        "benchmark": "steps",
        "weights": "official" if args.checkpoints else "random (plumbing check only)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "audio_seconds": len(audio) / rate,
        "frames": len(per_frame),
        "steps": args.steps,
        "seed": args.seed,
        "psnr_db": psnr_summary(per_frame),
        "keypoint_correlation": keypoint_correlation(few_kp, many_kp),
        "keypoint_max_abs_diff": float(np.abs(few_kp - many_kp).max()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    few, many = args.steps
    print(f"\n{few} vs {many} DDIM steps, same audio ({result['audio_seconds']:.2f} s, {result['frames']} frames) and seed")
    mean = result["psnr_db"]["mean"]
    print(f"frame PSNR, {few} against {many}: mean {mean if mean is None else round(mean, 2)} dB, min {result['psnr_db']['min']:.2f} dB")
    print(f"driving keypoints: correlation over time {result['keypoint_correlation']:.4f}, max |diff| {result['keypoint_max_abs_diff']:.4f}")
    if not args.checkpoints:
        print(RANDOM_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
