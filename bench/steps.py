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
import time
from collections.abc import Callable

import numpy as np
import torch

from bench.common.comparison import add_comparison_arguments, comparison_inputs, session_frames
from bench.common.stats import psnr, psnr_summary
from engine.engine import Engine
from engine.timebase import DEFAULT_STEPS, OFFLINE_OVERLAP

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
    print(
        f"\n{few} vs {many} DDIM steps, same audio ({result['audio_seconds']:.2f} s, {result['frames']} frames) and "
        "seed"
    )
    mean = result["psnr_db"]["mean"]
    print(
        f"frame PSNR, {few} against {many}: mean {mean if mean is None else round(mean, 2)} dB, min "
        f"{result['psnr_db']['min']:.2f} dB"
    )
    print(
        f"driving keypoints: correlation over time {result['keypoint_correlation']:.4f}, max |diff| "
        f"{result['keypoint_max_abs_diff']:.4f}"
    )
    if not args.checkpoints:
        print(RANDOM_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
