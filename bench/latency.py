"""Latency, glass to glass: a marker pushed -> the frame that speaks it, decoded; the GPU compute of the parts beside
it.

``python -m bench.latency [--latency faithful|low] [--no-compute] --out FILE.json [any bench.glass_to_glass option]``
runs ``bench.glass_to_glass`` (the real server, nginx-rtmp, an RTMP reader and a WebRTC viewer),
then, on a GPU and once that server has stopped, ``bench.compute`` (an LMDM window, render per
frame) in this process, and prints both with their targets (docs/benchmarks.md) and whether each was met.
Writes ``{"glass_to_glass": ..., "compute": ..., "targets": [...]}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from bench import compute, glass_to_glass
from bench.common.glass_report import table as glass_table
from bench.common.targets import FIRST_PUSH_MS, GLASS_P99_MS
from harness.live_server import run_keeping_server_log


def verdicts(glass: dict) -> list[dict]:
    """Each measured path's p99 (and first push, where a target is set) against the target of the run's latency mode."""
    mode = glass["latency"]
    rows = []
    for name, path in glass["paths"].items():
        kind = "rtmp" if name == "rtmp" else "webrtc"
        rows.append({"what": f"{path['label']}, p99", "ms": path["p99_ms"], "target_ms": GLASS_P99_MS[mode][kind]})
        if mode in FIRST_PUSH_MS:
            rows.append(
                {"what": f"{path['label']}, first push", "ms": path["first_push_ms"], "target_ms": FIRST_PUSH_MS[mode]}
            )
    for row in rows:
        row["met"] = row["ms"] is not None and row["ms"] <= row["target_ms"]
    return rows


def targets_table(rows: list[dict]) -> str:
    """One line per target: measured, target, met or not."""
    width = max((len(row["what"]) for row in rows), default=0)
    return "\n".join(
        f"{row['what']:<{width}}  {row['ms']} ms  (target <= {row['target_ms']:.0f} ms: "
        f"{'met' if row['met'] else 'NOT met'})"
        for row in rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.splitlines()[0])
    parser.add_argument("--no-compute", action="store_true", help="skip the compute split (it runs only on a GPU)")
    args = glass_to_glass.parse_args(argv, parser)
    result: dict = {"glass_to_glass": run_keeping_server_log(glass_to_glass.measure, args, "latency-")}
    result["targets"] = verdicts(result["glass_to_glass"])
    if not args.no_compute and torch.cuda.is_available():
        result["compute"] = compute.measure(compute.parse_args(["--steps", str(args.steps)]))
    args.out.write_text(json.dumps(result, indent=2))
    print(glass_table(result["glass_to_glass"]))
    print(
        "\ncompute of the parts: "
        + ("\n" + compute.table(result["compute"]) if "compute" in result else "not measured (no GPU, or --no-compute)")
    )
    print("\ntargets (docs/benchmarks.md):\n" + targets_table(result["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
