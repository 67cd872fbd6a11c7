"""bench.common.stats: the one latency summary and the one PSNR every benchmark reports."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench.common.stats import psnr, summary


def test_summary_reports_linear_percentiles_in_milliseconds_rounded() -> None:
    assert summary([100.0, 200.0, 300.0], digits=1) == {
        "n": 3,
        "p50_ms": 200.0,
        "p90_ms": 280.0,
        "p99_ms": 298.0,
        "min_ms": 100.0,
        "max_ms": 300.0,
    }
    assert summary([1.23456]) == {
        "n": 1,
        "p50_ms": 1.235,
        "p90_ms": 1.235,
        "p99_ms": 1.235,
        "min_ms": 1.235,
        "max_ms": 1.235,
    }


def test_summary_of_nothing_is_empty_not_an_error() -> None:
    empty = summary([])
    assert empty["n"] == 0 and empty["p99_ms"] is None


def test_psnr_is_infinite_for_equal_frames_and_20_db_for_an_rms_error_of_a_tenth_of_full_scale() -> None:
    frame = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    assert psnr(frame, frame) == math.inf
    assert psnr(np.zeros((4, 4), np.uint8), np.full((4, 4), 25.5)) == pytest.approx(20.0)


def test_psnr_takes_tensors_and_a_peak_of_one_for_images_in_the_unit_range() -> None:
    a = torch.zeros(2, 3, 4, 4)
    assert psnr(a, a + 0.1, peak=1.0) == pytest.approx(20.0)
    assert psnr((a * 255).to(torch.uint8), torch.full_like(a, 25.5)) == pytest.approx(20.0)
