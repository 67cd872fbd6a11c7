"""Tick times of the runtime's loop: wall, the loop thread's CPU, and GPU (read back from events once they are done)."""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

HISTORY = 4096
"""Ticks kept for the percentiles."""
RECENT = 64
"""Ticks whose slowest is reported as ``tick_wall_ms_recent_max`` (what a health check allows a tick to take)."""


class TickTimes:
    """The times of the last ``HISTORY`` ticks that did work; ``cuda``: also time them on the GPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.wall: deque[float] = deque(maxlen=HISTORY)
        self.cpu: deque[float] = deque(maxlen=HISTORY)
        self.gpu: deque[float] = deque(maxlen=HISTORY)
        self.busy: deque[tuple[float, float]] = deque(maxlen=HISTORY)
        self._events: deque[tuple[torch.cuda.Event, torch.cuda.Event, float]] = deque()

    def begin(self) -> tuple[float, float, torch.cuda.Event | None]:
        """Mark a tick's start (wall, thread CPU, a GPU event)."""
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return time.perf_counter(), time.thread_time(), event

    def end(self, started: tuple[float, float, torch.cuda.Event | None], worked: bool) -> None:
        """Record the tick begun at ``started`` if it ``worked``; read back the GPU times of earlier ticks now done."""
        wall_start, cpu_start, start = started
        if worked:
            self.wall.append((time.perf_counter() - wall_start) * 1000)
            self.cpu.append((time.thread_time() - cpu_start) * 1000)
            if start is not None:
                stop = torch.cuda.Event(enable_timing=True)
                stop.record()
                self._events.append((start, stop, time.monotonic()))
        while self._events and self._events[0][1].query():
            start_event, stop_event, at = self._events.popleft()
            ms = start_event.elapsed_time(stop_event)
            self.gpu.append(ms)
            self.busy.append((at, ms))

    def gpu_idle(self) -> bool:
        """Whether the GPU has finished the work of every tick recorded so far (always, on the CPU)."""
        return not self._events or self._events[-1][1].query()

    def summary(self) -> dict[str, float | None]:
        """p50 and p99 of each tick time, and the slowest of the last ``RECENT`` ticks' wall times, in ms."""
        wall, cpu, gpu = list(self.wall), list(self.cpu), list(self.gpu)
        return {
            "tick_wall_ms_recent_max": round(max(wall[-RECENT:]), 2) if wall else None,
            "tick_wall_ms_p50": percentile(wall, 50),
            "tick_wall_ms_p99": percentile(wall, 99),
            "tick_cpu_ms_p50": percentile(cpu, 50),
            "tick_cpu_ms_p99": percentile(cpu, 99),
            "tick_gpu_ms_p50": percentile(gpu, 50),
            "tick_gpu_ms_p99": percentile(gpu, 99),
        }

    def gpu_busy(self, window: float = 10.0) -> float | None:
        """Share of the last ``window`` seconds the loop's GPU work was running (None on the CPU)."""
        if not self.cuda or not self.busy:
            return None
        now = time.monotonic()
        recent = [ms for at, ms in self.busy if now - at <= window]
        return round(min(sum(recent) / 1000 / window, 1.0), 4)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile of ``values`` (None when empty), rounded to 0.01."""
    if not values:
        return None
    return round(float(np.percentile(values, q)), 2)
