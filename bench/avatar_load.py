"""Time registering scikit-image's astronaut and loading the cached avatar onto a device.

Run from the repository root: ``python -m bench.avatar_load [--device cuda] [--runs 20] [--out FILE]``.
Weights are deterministic random ones in the official layout (the timings do not depend on
the values; the avatar's features are not a face's). Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from avatars.register import register
from bench.common.parts import sync, time_loads
from bench.common.stats import summary
from bench.common.targets import AVATAR_LOAD_MS
from engine.assets import write_demo_portrait
from engine.networks import write_random_checkpoints


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
            sync(device)
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
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


def table(result: dict) -> str:
    """The short table: registration and load times against its target (docs/benchmarks.md)."""
    verified, unverified = result["load_verified"], result["load_unverified"]
    return "\n".join(
        [
            f"{result['device']}, torch {result['torch']}, {result['avatar']}, cache {result['cache_bytes']} bytes",
            f"register, first / second call: {result['register_s']['first']} / {result['register_s']['second']} s",
            f"load, CRC checked: p50 {verified['p50_ms']} ms, p90 {verified['p90_ms']} ms (target < "
            f"{AVATAR_LOAD_MS:.0f} ms)",
            f"load, unchecked:   p50 {unverified['p50_ms']} ms, p90 {unverified['p90_ms']} ms",
        ]
    )


if __name__ == "__main__":
    main()
