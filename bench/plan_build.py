"""Build time and size of the TensorRT-RTX plans per network and target set, on this machine (no GPU needed).

``python -m bench.plan_build [--checkpoints DIR] [--networks ...] [--work DIR] [--out FILE.json]``
exports the graphs once (random weights unless --checkpoints), derives and proves the FP16 graphs
once, then builds the plans for sm_89, for sm_120 and for both, each into its own directory,
through ``python -m compile.build_plans``.
It prints a table last and writes every number (with the machine) to JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from compile import build_plans
from engine.engine import random_checkpoints
from engine.plans.manifest import ONNX_DIR, plan_dirs, read_manifest

TARGET_SETS = (("sm_89",), ("sm_120",), ("sm_89", "sm_120"))


def _run(*args: str) -> str:
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        status = build_plans.main(list(args))
    if status != 0:
        raise SystemExit(f"build_plans {' '.join(args)} failed:\n{log.getvalue()}")
    return log.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_build", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=Path, help="official checkpoints (default: deterministic random weights)")
    parser.add_argument("--networks", nargs="+", default=["decoder", "warp_network", "lmdm"])
    parser.add_argument("--work", type=Path, help="where the graphs and plans go (default: a temporary folder)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    checkpoints = args.checkpoints or random_checkpoints()
    work = args.work or Path(tempfile.mkdtemp(prefix="plan_build-"))
    base = ["--checkpoints", str(checkpoints), "--networks", *args.networks]
    start = time.perf_counter()
    _run(*base, "--out", str(work / "graphs"), "--onnx-only")
    export_s = time.perf_counter() - start
    rows, graphs = [], work / "graphs" / ONNX_DIR
    for targets in TARGET_SETS:
        out = work / "-".join(targets)
        shutil.copytree(graphs, out / ONNX_DIR, dirs_exist_ok=True)
        graphs = out / ONNX_DIR  # with the FP16 graphs the first build derived and proved
        start = time.perf_counter()
        _run(*base, "--out", str(out), "--builder", "rtx", "--arch", *targets)
        total_s = time.perf_counter() - start
        (plan_dir,) = plan_dirs(out)
        onnx = read_manifest(out / ONNX_DIR)
        for name, entry in read_manifest(plan_dir).graphs.items():
            derived = onnx.graphs.get(name + build_plans.FP16_SUFFIX)
            rows.append(
                {
                    "targets": list(targets),
                    "network": name,
                    "precision": entry.precision,
                    "build_s": entry.seconds,
                    "plan_bytes": (plan_dir / entry.file).stat().st_size,
                    "fp16_graph_and_proof_s": derived.seconds if derived else None,
                    "run_total_s": round(total_s, 1),
                }
            )
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "builder": read_manifest(plan_dirs(work / "sm_89")[0]).builder_version,
        "export_all_s": round(export_s, 1),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"TensorRT-RTX {result['builder']}, {result['machine']['cores']} cores; ONNX export {export_s:.1f} s")
    print(f"{'targets':16s} {'network':14s} {'prec':5s} {'build s':>8s} {'plan MB':>8s} {'fp16 graph+proof s':>19s}")
    for row in rows:
        fp16 = "" if row["fp16_graph_and_proof_s"] is None else f"{row['fp16_graph_and_proof_s']:.1f}"
        print(
            f"{'+'.join(row['targets']):16s} {row['network']:14s} {row['precision']:5s} "
            f"{row['build_s']:8.1f} {row['plan_bytes'] / 1e6:8.1f} {fp16:>19s}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
