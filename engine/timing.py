"""GPU timing with CUDA events, shared by the runtime's warm-up and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable

import torch


def gpu_time(fn: Callable[[], object], repeat: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call of ``fn`` timed with CUDA events on the current stream, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times
