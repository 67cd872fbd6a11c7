"""Tick times of the runtime's loop: wall, the loop thread's CPU, and GPU (read back from events once they are done);
with a trace on (``engine.trace``), each tick's times and work as a record, its GPU span on the host's clock."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import torch

from engine.trace import Trace

HISTORY = 4096
"""Ticks kept for the percentiles."""
RECENT = 64
"""Ticks whose slowest is reported as ``tick_wall_ms_recent_max`` (what a health check allows a tick to take)."""


class TickTimes:
    """The times of the last ``HISTORY`` ticks that did work; ``cuda``: also time them on the GPU; ``trace``: record
    each of them there once its GPU times are known."""

    def __init__(self, cuda: bool, trace: Trace | None = None) -> None:
        self.cuda = cuda
        self.trace = trace
        self._origin: tuple[torch.cuda.Event, float] | None = None
        self.wall: deque[float] = deque(maxlen=HISTORY)
        self.cpu: deque[float] = deque(maxlen=HISTORY)
        self.gpu: deque[float] = deque(maxlen=HISTORY)
        self.busy: deque[tuple[float, float]] = deque(maxlen=HISTORY)
        self._events: deque[tuple[torch.cuda.Event, torch.cuda.Event, float, dict[str, Any] | None]] = deque()

    def anchor(self) -> None:
        """Tie the GPU's timeline to the host's clock (an event on an idle GPU and the host time it was reached), so
        that traced ticks say when their GPU work ran; only with a trace on CUDA."""
        if self.cuda and self.trace is not None and self.trace.on:
            torch.cuda.synchronize()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            event.synchronize()
            self._origin = (event, time.monotonic())

    def begin(self) -> tuple[float, float, torch.cuda.Event | None]:
        """Mark a tick's start (wall, thread CPU, a GPU event)."""
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return time.perf_counter(), time.thread_time(), event

    def end(
        self, started: tuple[float, float, torch.cuda.Event | None], worked: bool, work: dict[str, Any] | None = None
    ) -> None:
        """Record the tick begun at ``started`` if it ``worked`` (``work``: what it did, for the trace); read back the
        GPU times of earlier ticks now done."""
        wall_start, cpu_start, start = started
        if worked:
            wall = (time.perf_counter() - wall_start) * 1000
            cpu = (time.thread_time() - cpu_start) * 1000
            self.wall.append(wall)
            self.cpu.append(cpu)
            traced = None
            if self.trace is not None and self.trace.on:
                traced = {
                    "at": time.monotonic() - wall / 1000,
                    "wall": round(wall, 3),
                    "cpu": round(cpu, 3),
                    **(work or {}),
                }
            if start is not None:
                stop = torch.cuda.Event(enable_timing=True)
                stop.record()
                self._events.append((start, stop, time.monotonic(), traced))
            elif traced is not None:
                self.trace.record("tick", traced.pop("at"), **traced)
        while self._events and self._events[0][1].query():
            start_event, stop_event, at, traced = self._events.popleft()
            ms = start_event.elapsed_time(stop_event)
            self.gpu.append(ms)
            self.busy.append((at, ms))
            if traced is not None:
                self._record(traced, start_event, stop_event, ms)

    def _record(self, traced: dict[str, Any], start: torch.cuda.Event, stop: torch.cuda.Event, ms: float) -> None:
        """A tick's trace record: its host times and work, its GPU time and (anchored) when its GPU work ran."""
        gpu: dict[str, float] = {"gpu": round(ms, 3)}
        if self._origin is not None:
            origin, host = self._origin
            gpu["gpu_from"] = round(host + origin.elapsed_time(start) / 1000, 6)
            gpu["gpu_to"] = round(host + origin.elapsed_time(stop) / 1000, 6)
        self.trace.record("tick", traced.pop("at"), **traced, **gpu)

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
