"""``python -m bench``: the suite lists every benchmark with what it measures, and runs one by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.common.registry import benchmarks

ROOT = Path(__file__).resolve().parents[3]


def test_every_module_with_a_main_is_listed_with_its_docstrings_first_line() -> None:
    suite = {b.name: b.summary for b in benchmarks()}
    assert {"latency", "compute", "glass_to_glass", "rtmp_sessions", "service", "runtime"} <= set(suite)
    assert suite["latency"].startswith("Latency, glass to glass")
    assert suite["compute"].startswith("GPU compute of the engine's parts")
    assert all(suite.values()), "a benchmark without a docstring"
    assert "common" not in suite and "__main__" not in suite


def test_python_m_bench_lists_the_suite_and_runs_one_by_name() -> None:
    listing = subprocess.run(
        [sys.executable, "-m", "bench"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for benchmark in benchmarks():
        assert f"{benchmark.name} " in listing and benchmark.summary in listing
    run = subprocess.run(
        [sys.executable, "-m", "bench", "latency", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "usage: python -m bench.latency" in run.stdout and "--no-compute" in run.stdout
    unknown = subprocess.run([sys.executable, "-m", "bench", "nothing"], cwd=ROOT, capture_output=True, text=True)
    assert unknown.returncode == 2 and "no benchmark 'nothing'" in unknown.stderr
