"""bench.compute measures a GPU; without one it says what runs on a CPU instead, and its table reads the targets."""

from __future__ import annotations

import pytest
import torch

from bench import compute
from bench.common.stats import summary
from bench.common.targets import LMDM_WINDOW_MS, RENDER_MS_PER_FRAME


def test_without_a_gpu_it_points_at_the_benches_that_run_on_a_cpu(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compute.main([]) == 2
    error = capsys.readouterr().err
    assert "torch sees none here" in error
    assert "python -m bench.loop_ops --avatar DIR" in error and "python -m bench.stitch --device cpu" in error


def test_the_table_shows_the_best_render_batch_and_the_readme_targets() -> None:
    render = {f"b{batch}": summary([ms]) for batch, ms in ((5, 15.0), (16, 40.0))}
    for batch, stats in ((5, render["b5"]), (16, render["b16"])):
        stats["ms_per_frame"] = stats["p50_ms"] / batch
        stats["frames_per_s"] = 1000 / stats["ms_per_frame"]
    result = {
        "hardware": {"gpu": "test GPU"},
        "ceilings": {"fp16_matmul_tflops": 700.0, "copy_gbps": 3000.0},
        "steps": 25,
        "lmdm_window": {"graphed": summary([11.0, 13.0]), "graphed_b4": summary([14.0]), "eager": summary([30.0])},
        "render": render,
    }
    lines = compute.table(result).splitlines()
    render_line = next(line for line in lines if line.startswith("render best"))
    assert "2.50, 400" in render_line and f"<= {RENDER_MS_PER_FRAME}" in render_line
    lmdm_line = next(line for line in lines if line.startswith("LMDM window 25 steps"))
    assert "12.00 / 12.98" in lmdm_line and f"<= {LMDM_WINDOW_MS}" in lmdm_line
