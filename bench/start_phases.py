"""Where a start of the runtime goes on CUDA, phase by phase (imports to warmed-up runtime), with or without packages.

The phases: imports, the CUDA context, loading the networks, checking and loading the compiled packages (each network
and package timed in the log), HuBERT, and the warm-up that captures every bucket.

``python -m bench.start_phases [--plans DIR] [--out FILE.json] [--profile FILE.txt]`` (random weights; without
``--plans`` the warm-up compiles; ``--profile`` also writes cProfile's 40 costliest calls, by cumulative time.)
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import pstats  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from engine.backends.torch_backend import TorchBackend  # noqa: E402
from engine.engine import Engine, hubert_runner, random_checkpoints  # noqa: E402
from engine.plans.packages import hash_checkpoints_ahead  # noqa: E402
from engine.runtime import Runtime, RuntimeConfig  # noqa: E402
from engine.timebase import DEFAULT_STEPS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.start_phases", description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=Path, help="a plans folder with the torch backend's compiled packages")
    parser.add_argument("--out", type=Path, help="also write the phases here as JSON")
    parser.add_argument("--profile", type=Path, help="also write cProfile's costliest calls of the start here")
    args = parser.parse_args(argv)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms %(name)s: %(message)s")
    for timed in ("engine.plans.packages", "engine.backends.torch_backend"):  # each package and network, timed
        logging.getLogger(timed).setLevel(logging.DEBUG)
    phases: dict[str, float] = {"imports": time.perf_counter() - STARTED}

    def phase(name: str, since: float) -> float:
        torch.cuda.synchronize()
        now = time.perf_counter()
        phases[name] = round(now - since, 2)
        return now

    mark = time.perf_counter()
    torch.zeros(1, device="cuda")
    mark = phase("CUDA context", mark)
    folder = random_checkpoints()
    mark = phase("random checkpoints (written on a first run)", mark)
    if args.plans is not None:  # as Engine.from_checkpoints does: the packages' checkpoint hashes beside the loading
        hash_checkpoints_ahead(folder)
    backend = TorchBackend(folder, device=torch.device("cuda"), compile_networks=True)
    mark = phase("networks loaded", mark)
    if args.plans is not None:
        backend.load_packages(args.plans, DEFAULT_STEPS)
        mark = phase("packages checked and loaded", mark)
    engine = Engine(backend, hubert_runner(None, backend.device), steps=DEFAULT_STEPS)
    mark = phase("HuBERT", mark)
    runtime = Runtime(engine, RuntimeConfig(admission=False))
    phase("warm-up (capture every bucket)", mark)
    phases["total from process start"] = round(time.perf_counter() - STARTED, 2)
    if profiler:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        args.profile.write_text(text.getvalue())
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "packages": backend.packages_status,
        "phases_s": phases,
        "window_ms": runtime.window_ms,
        "render_ms": runtime.render_ms,
    }
    runtime.close()
    print("\n| phase | seconds |\n|---|---|")
    for name, seconds in phases.items():
        print(f"| {name} | {seconds:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
