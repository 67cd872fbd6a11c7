"""Time registering scikit-image's astronaut and loading the cached avatar onto a device.

Run from the repository root: ``python3 -m bench.avatar_load [--device cuda] [--runs 20] [--out FILE]``.
Weights are deterministic random ones in the official layout (the timings do not depend on
the values; the avatar's features are not a face's). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from avatars.cache import load_avatar
from avatars.register import register
from engine.assets import write_demo_portrait
from engine.networks import write_random_checkpoints


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loads(path: Path, device: torch.device, runs: int, verify: bool) -> list[float]:
    """Wall milliseconds of ``runs`` loads (after one untimed warm-up), synchronized on the device."""
    load_avatar(path, device, verify=verify)
    _sync(device)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        avatar = load_avatar(path, device, verify=verify)
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        del avatar
    return times


def summary(times: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(times), 3),
        "p90_ms": round(float(np.percentile(times, 90)), 3),
        "min_ms": round(min(times), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args()
    device = torch.device(args.device)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoints = root / "checkpoints"
        write_random_checkpoints(checkpoints, seed=0, names=("motion_extractor", "appearance_extractor"))
        portrait = write_demo_portrait(root)

        register_s = []
        for _ in range(2):  # the first includes imports and model initialisation
            start = time.perf_counter()
            path = register(portrait, "astronaut", checkpoints, device=device, cache_dir=root / "cache", progress=False)
            _sync(device)
            register_s.append(round(time.perf_counter() - start, 3))

        result = {
            "benchmark": "avatar_load",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "avatar": "skimage astronaut 512x512, 1 frame",
            "cache_bytes": (path / "tensors.safetensors").stat().st_size,
            "runs": args.runs,
            "load_verified": summary(time_loads(path, device, args.runs, verify=True)),
            "load_unverified": summary(time_loads(path, device, args.runs, verify=False)),
            "register_s": {"first": register_s[0], "second": register_s[1]},
            "weights": "random (official layout); not a face",
        }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
