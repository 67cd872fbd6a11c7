"""The reference implementation's own modules timed beside ours, in one process on one device.

``DITTO_REFERENCE_DIR=/path/to/ditto-talkinghead python -m bench.reference [--device cuda] [--out FILE.json]``

Every "N x faster" in this project is a ratio printed here: both sides run the same weights
(random ones in the official layout unless --checkpoints) on the same inputs, one after the
other. What is timed (wall milliseconds, synchronized, median after warm-up):

* render per frame: warp + decode of one frame. The reference through its own wrappers
  (``core.models.warp_network.WarpNetwork`` and ``core.models.decoder.Decoder``: numpy in,
  fp16 autocast, numpy out, as its pipelines call them once per frame) and its bare modules
  on device tensors under the same autocast (on a CPU: bare modules in fp32 only); ours
  through the engine's backend at batch 1 and at ``--batch`` frames per call.
* LMDM window: one 80-frame window sampled at ``--steps`` DDIM steps with guidance: the
  reference's ``core.models.lmdm.LMDM`` (fp32, its own DDIM loop), ours the engine's sampler
  (CUDA graph on a GPU).

The reference runs under PyTorch's default math flags (no TF32 matmuls, no cuDNN autotuning),
as in its own process; ours as the engine sets them up (torch.compile, TF32 LMDM matmuls).

Without DITTO_REFERENCE_DIR it prints why and exits 0 (nothing measured); a folder that is not
a checkout is an error (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from bench.common.parts import engine_window_sampler
from bench.common.stats import wall_ms
from engine.engine import Engine, models_dir, random_checkpoints
from engine.motion.vector import MOTION_DIM
from engine.networks import OFFICIAL_FILENAMES
from engine.timebase import DEFAULT_STEPS, SEQ_FRAMES
from harness.reference_code import ENV, ReferenceUnavailable, import_reference, reference_root

FEATURE_SHAPE = (32, 16, 64, 64)
NUM_KP = 21


def render_inputs(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An appearance volume and source/driving keypoints, float32 numpy as the reference keeps them."""
    rng = np.random.default_rng(seed)
    feature = rng.standard_normal((batch, *FEATURE_SHAPE), dtype=np.float32) * 0.5
    kp_source = (rng.random((batch, NUM_KP, 3), dtype=np.float32) * 1.4 - 0.7).astype(np.float32)
    kp_driving = (kp_source + 0.02 * rng.standard_normal(kp_source.shape)).astype(np.float32)
    return feature, kp_source, kp_driving


def reference_checkout_version(root: Path) -> str:
    """The checkout's commit, or a note that it is not a git checkout.

    Only a checkout whose top level is ``root`` counts: git answers for the repository around a plain
    folder too, and a copy inside this project's checkout would record the project's commit as its own.
    """
    try:
        top, commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, ValueError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return commit if Path(top).resolve() == Path(root).resolve() else "unknown (not a git checkout)"


@contextlib.contextmanager
def torch_defaults() -> Iterator[None]:
    """PyTorch's default math flags, as the reference runs in its own process (our backend turns TF32 matmuls on)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = (
        False,
        True,
        False,
    )
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def bench_reference(folder: Path, device: torch.device, cond_width: int, steps: int, runs: int, warmup: int) -> dict:
    """The reference's warp+decode per frame (wrappers and bare modules) and its LMDM window, in ms.

    On a CPU its wrappers' fp16 autocast takes minutes a frame, so there only the bare modules run, in fp32.
    """
    warp_network = import_reference("core.models.warp_network")
    decoder = import_reference("core.models.decoder")
    lmdm = import_reference("core.models.lmdm")
    name = device.type  # the reference takes a device string and autocasts on its first four letters
    warp = warp_network.WarpNetwork(str(folder / OFFICIAL_FILENAMES["warp_network"]), device=name)
    decode = decoder.Decoder(str(folder / OFFICIAL_FILENAMES["decoder"]), device=name)
    feature, kp_source, kp_driving = render_inputs(1)
    out: dict[str, float | None] = {"render_ms_per_frame_wrappers": None}
    if device.type == "cuda":
        out["render_ms_per_frame_wrappers"] = wall_ms(
            lambda: decode(warp(feature, kp_source, kp_driving)), device, runs, warmup
        )
    tensors = [torch.from_numpy(a).to(device) for a in (feature, kp_source, kp_driving)]

    def bare() -> torch.Tensor:
        with torch.no_grad(), torch.autocast(device_type=name, dtype=torch.float16, enabled=device.type == "cuda"):
            return decode.model(warp.model(*tensors))

    out["render_ms_per_frame_bare"] = wall_ms(bare, device, runs, warmup)
    sampler = lmdm.LMDM(
        str(folder / OFFICIAL_FILENAMES["lmdm"]), device=name, motion_feat_dim=MOTION_DIM, audio_feat_dim=cond_width
    )
    sampler.model.device = name  # the reference's LMDM wrapper ignores the device it was given and defaults to 'cuda'
    rng = np.random.default_rng(1)
    kp_cond = rng.standard_normal((1, MOTION_DIM), dtype=np.float32) * 0.5
    aud_cond = rng.standard_normal((1, SEQ_FRAMES, cond_width), dtype=np.float32)
    out["lmdm_window_ms"] = wall_ms(
        lambda: sampler(kp_cond, aud_cond, steps), device, max(1, runs // 2), min(warmup, 1)
    )
    return out


def bench_ours(engine: Engine, batch: int, runs: int, warmup: int) -> dict:
    """Our backend's warp+decode per frame at batch 1 and ``batch``, and one LMDM window, in ms."""
    device, backend = engine.device, engine.backend
    out = {}
    for size in sorted({1, batch}):
        feature, kp_source, kp_driving = (torch.from_numpy(a).to(device) for a in render_inputs(size))
        ms = wall_ms(lambda: backend.render(feature, kp_source, kp_driving), device, runs, warmup)
        out[f"render_ms_per_frame_b{size}"] = ms / size
    generator = torch.Generator().manual_seed(1)
    cond_frame = (torch.randn(1, MOTION_DIM, generator=generator) * 0.5).to(device)
    cond = torch.randn(1, SEQ_FRAMES, engine.cond_width, generator=generator).to(device)
    sampler = engine_window_sampler(engine, (1,))
    out["lmdm_window_ms"] = wall_ms(lambda: sampler(cond_frame, cond), device, max(1, runs // 2), min(warmup, 1))
    return out


def print_table(result: dict) -> None:
    """What was measured, side by side, with the ratios."""
    ref, ours, batch = result["reference"], result["ours"], result["batch"]
    print(
        f"\nSide by side on {result['hardware']['device']}, {result['weights']} weights, {result['steps']} DDIM steps"
    )
    print(f"reference: {result['reference_dir']} (commit {result['reference_commit']})")
    print(f"{'measured (median wall ms)':<52} {'reference':>10} {'ours':>10} {'ratio':>8}")
    rows = [
        (
            "render per frame, wrappers vs ours at batch 1",
            ref["render_ms_per_frame_wrappers"],
            ours["render_ms_per_frame_b1"],
        ),
        (
            "render per frame, bare modules vs ours at batch 1",
            ref["render_ms_per_frame_bare"],
            ours["render_ms_per_frame_b1"],
        ),
    ]
    if batch != 1:
        rows.append(
            (
                f"render per frame, wrappers vs ours at batch {batch}",
                ref["render_ms_per_frame_wrappers"],
                ours[f"render_ms_per_frame_b{batch}"],
            )
        )
    rows.append((f"LMDM 80-frame window, {result['steps']} steps", ref["lmdm_window_ms"], ours["lmdm_window_ms"]))
    for label, theirs, mine in rows:
        if theirs is None:
            print(f"{label:<52} {'n/a':>10} {mine:>10.2f} {'':>8}")
        else:
            print(f"{label:<52} {theirs:>10.2f} {mine:>10.2f} {theirs / mine:>7.1f}x")
    if result["hardware"]["device_type"] != "cuda":
        print("CPU run: a plumbing check. The reference's wrappers autocast to fp16, which a CPU runs at a crawl, so")
        print("only its bare modules ran, in fp32; our CPU backend is fp32 too. Compare speeds on a GPU.")
    print("ratio = reference ms / our ms, both measured in this run; random weights time like real ones.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: random weights)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--batch", type=int, help="our render batch (default 16 on a GPU, 1 on a CPU)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    try:
        root = reference_root()
    except ReferenceUnavailable as unavailable:
        print(f"bench.reference skipped, nothing measured: {unavailable}", file=sys.stderr)
        return 2 if os.environ.get(ENV) else 0  # a wrong folder is an error, no folder a skip
    device = torch.device(args.device)
    batch = args.batch or (16 if device.type == "cuda" else 1)
    folder = models_dir(args.checkpoints) if args.checkpoints else random_checkpoints()
    engine = Engine.from_checkpoints(args.checkpoints, device=device, steps=args.steps)
    result = {
        "benchmark": "reference side by side",
        "hardware": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "device_type": device.type,
        },
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "weights": "official" if args.checkpoints else "random",
        "reference_dir": str(root),
        "reference_commit": reference_checkout_version(root),
        "steps": args.steps,
        "batch": batch,
        "ours_config": {
            "backend": "torch",
            "dtype": str(engine.backend.dtype),
            "cuda_graphs": device.type == "cuda",
            "torch_compile": device.type
            == "cuda",  # Engine.from_checkpoints compiles on CUDA, as bench.compute runs it
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    result["ours"] = bench_ours(engine, batch, args.runs, args.warmup)
    with torch_defaults():
        result["reference"] = bench_reference(folder, device, engine.cond_width, args.steps, args.runs, args.warmup)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
