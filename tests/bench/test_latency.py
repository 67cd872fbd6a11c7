"""bench.latency measures a GPU; without one it says what runs on a CPU instead."""

from __future__ import annotations

import pytest
import torch

from bench import latency


def test_without_a_gpu_it_points_at_the_benches_that_run_on_a_cpu(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert latency.main([]) == 2
    error = capsys.readouterr().err
    assert "torch sees none here" in error
    assert "python -m bench.loop_ops --avatar DIR" in error and "python -m bench.stitch --device cpu" in error
