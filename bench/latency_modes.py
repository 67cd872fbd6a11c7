"""What the low-latency mode costs against the faithful one: the same audio, avatar and seed through both.

``python -m bench.latency_modes [--checkpoints DIR --avatar NAME] [--seconds S] [--device cuda] [--out FILE.json]``

Reports, per mode: the speech depth by construction (audio that must follow a frame before it is
final), the keypoint jitter (mean frame-to-frame acceleration of the 265-d motion each frame was
rendered from, and of its 63 keypoint dims alone), the frame PSNR of the low mode against the
faithful one (same frame index, full-size RGB), and the GPU milliseconds per session per 200 ms
hop, modelled from LMDM and render bucket costs measured by ``bench.runtime`` (a results file:
``--costs``) at several session counts, with the capacity each mode admits. Latency on the wire
is ``bench.glass_to_glass --latency low``. With random weights (the default) the quality figures
check the plumbing only.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common.comparison import add_comparison_arguments, comparison_inputs, session_frames
from bench.common.stats import psnr, psnr_summary
from engine.diffusion.windows import MotionWindows
from engine.engine import Engine
from engine.latency import FAITHFUL, LOW, MODES, LatencyMode
from engine.motion.vector import MOTION_DIM, SMOOTHED_DIMS
from engine.runtime import RuntimeConfig, admission
from engine.runtime.pacing import speech_depth
from engine.timebase import DEFAULT_STEPS, FPS, SEQ_FRAMES

CPU_SECONDS = 0.8
"""Seconds of speech through both modes on the CPU by default."""
COSTS = Path(__file__).parent / "results" / "2026-12-01_h200_runtime_12_sessions_loop_baseline.json"
RANDOM_NOTE = "RANDOM WEIGHTS: jitter and PSNR check the plumbing only; rerun with --checkpoints and --avatar."


def run_mode(
    engine: Engine, avatar, audio: np.ndarray, rate: int, seed: int, latency: str
) -> tuple[np.ndarray, np.ndarray]:
    """Frames (N,H,W,3) uint8 and the motion (N,265) each was rendered from, for one session in ``latency`` mode."""
    frames = session_frames(engine, avatar, audio, rate, seed=seed, latency=latency)
    images = np.stack([f.image.cpu().numpy() for f in frames])
    motion = torch.stack([f.motion for f in frames]).float().cpu().numpy()
    return images, motion


def depth_frames(mode: LatencyMode) -> float:
    """The mode's speech depth at its own overlap, as a live session of it computes it."""
    windows = MotionWindows(torch.zeros(MOTION_DIM), mode.overlap, early_release=mode.early_release)
    return speech_depth(windows.valid, windows.held, mode.hop_frames)


def jitter(motion: np.ndarray) -> float:
    """Mean over frames of the norm of the second difference (acceleration per frame²) of a (N, D) track."""
    if len(motion) < 3:
        return float("nan")
    return float(np.linalg.norm(np.diff(motion.astype(np.float64), n=2, axis=0), axis=1).mean())


def modelled_costs(costs: dict, counts: list[int]) -> dict:
    """GPU ms per session per 200 ms hop at each session count, and the capacity, per mode (from measured bucket
    costs)."""
    window = {int(k): v for k, v in costs["window_ms"].items()}
    render = {int(k): v for k, v in costs["render_ms"].items()}
    utilization = RuntimeConfig().utilization
    table = {}
    for mode in MODES.values():
        valid = SEQ_FRAMES - mode.overlap
        table[mode.name] = {
            "ms_per_session_per_hop": {
                n: round(admission.load_cost({valid: n}, window, render) / n, 2) for n in counts
            },
            "capacity": admission.capacity(mode.overlap, window, render, utilization),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_modes", description=__doc__.splitlines()[0])
    add_comparison_arguments(parser, CPU_SECONDS)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument(
        "--costs",
        type=Path,
        default=COSTS,
        help="a bench.runtime result with window_ms and render_ms (default: the H200's)",
    )
    args = parser.parse_args(argv)
    device, audio, rate, avatar = comparison_inputs(parser, args, CPU_SECONDS)
    engine = Engine.from_checkpoints(args.checkpoints, device=device, steps=args.steps, compile_networks=False)
    runs = {}
    for mode in (FAITHFUL, LOW):
        started = time.perf_counter()
        runs[mode.name] = run_mode(engine, avatar, audio, rate, args.seed, mode.name)
        print(
            f"{mode.name}: {len(runs[mode.name][0])} frames in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
    faithful_images, low_images = runs["faithful"][0], runs["low"][0]
    per_frame = [psnr(a, b) for a, b in zip(low_images, faithful_images)]
    costs = json.loads(args.costs.read_text())
    result = {
        "benchmark": "latency_modes",
        "weights": "official" if args.checkpoints else "random (plumbing check only)",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "audio_seconds": len(audio) / rate,
        "frames": len(per_frame),
        "steps": args.steps,
        "seed": args.seed,
        "modes": {
            mode.name: {
                "hop_frames": mode.hop_frames,
                "overlap": mode.overlap,
                "speech_depth_ms": round(depth_frames(mode) / FPS * 1000, 1),
                "jitter_motion": jitter(runs[mode.name][1]),
                "jitter_keypoints": jitter(runs[mode.name][1][:, SMOOTHED_DIMS:]),
            }
            for mode in (FAITHFUL, LOW)
        },
        "low_vs_faithful_psnr_db": psnr_summary(per_frame),
        "gpu_cost_model": {
            "from": str(args.costs.name),
            "gpu": costs.get("gpu"),
            **modelled_costs(costs, [1, 4, 8, 12]),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\nfaithful vs low latency, same audio ({result['audio_seconds']:.2f} s, {result['frames']} frames) and "
        f"seed, {result['device']}"
    )
    print(
        "| mode | hop | overlap | speech depth ms | jitter (265-d) | jitter (keypoints) | GPU ms/session/hop at "
        "1/4/8/12 | capacity |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, row in result["modes"].items():
        model = result["gpu_cost_model"][name]
        per = " / ".join(str(v) for v in model["ms_per_session_per_hop"].values())
        print(
            f"| {name} | {row['hop_frames']} frames | {row['overlap']} | {row['speech_depth_ms']} | "
            f"{row['jitter_motion']:.4f} | "
            f"{row['jitter_keypoints']:.4f} | {per} | {model['capacity']} |"
        )
    mean = result["low_vs_faithful_psnr_db"]["mean"]
    print(
        f"frame PSNR, low against faithful: mean {mean if mean is None else round(mean, 2)} dB, min "
        f"{result['low_vs_faithful_psnr_db']['min']}"
    )
    print(f"GPU cost modelled from the bucket costs in {args.costs.name} ({costs.get('gpu')})")
    if not args.checkpoints:
        print(RANDOM_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
