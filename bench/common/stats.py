"""The benchmarks' statistics and timing: one latency summary, one PSNR, one wall-clock timer."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch


def summary(ms: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """n, p50, p90, p99, min and max of milliseconds (numpy's linear percentiles), rounded to ``digits``; None when
    empty."""
    if not len(ms):
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "min_ms": None, "max_ms": None}
    values = np.asarray(ms, np.float64)
    pick = lambda value: round(float(value), digits)  # noqa: E731
    return {
        "n": int(values.size),
        "p50_ms": pick(np.percentile(values, 50)),
        "p90_ms": pick(np.percentile(values, 90)),
        "p99_ms": pick(np.percentile(values, 99)),
        "min_ms": pick(values.min()),
        "max_ms": pick(values.max()),
    }


def psnr(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio of two images (or stacks) in dB, in float64; inf when they are identical.

    ``peak`` is the largest value a pixel can take: 255 for uint8 images, 1 for images in [0, 1].
    """
    if isinstance(a, torch.Tensor):
        mse = (a.double() - b.double()).pow(2).mean().item()
    else:
        mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


def wall_times(fn: Callable[[], object], device: torch.device, runs: int, warmup: int = 3) -> list[float]:
    """Wall milliseconds per call of ``fn``, synchronized on ``device`` (works on the CPU too), after ``warmup``
    calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def wall_ms(fn: Callable[[], object], device: torch.device, runs: int, warmup: int) -> float:
    """Median of ``wall_times``."""
    return statistics.median(wall_times(fn, device, runs, warmup))


def psnr_summary(per_frame: list[float]) -> dict:
    """Mean (over frames that differ), min and count of identical frames of per-frame PSNRs."""
    finite = [p for p in per_frame if np.isfinite(p)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "min": min(per_frame) if per_frame else None,
        "identical_frames": len(per_frame) - len(finite),
    }
