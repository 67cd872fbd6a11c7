"""The service's start-up as one line: when each process reached each step, in seconds after the launch.

A start is several processes at once (the front end, the engine core, the output workers), so where its time goes
is only visible side by side: the core and every worker stamp their steps with the wall clock (``time.time()``,
shared by all processes of the machine) and the front end logs them against its own launch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

Marks = Mapping[str, float]
"""Step name -> wall-clock time (seconds since the epoch) it was reached, in the order the steps happened."""


def since(launched: float, marks: Marks) -> dict[str, float]:
    """Each mark in seconds after ``launched``, to 10 ms."""
    return {name: round(at - launched, 2) for name, at in marks.items()}


def describe(launched: float, ready: float, core: Marks, workers: Sequence[Marks]) -> str:
    """'service ready 14.2 s after launch: core started 2.1, imported 4.0, ...; 8 workers ready 3.0-6.2 s'."""
    steps = ", ".join(f"{name} {at:.1f}" for name, at in since(launched, core).items())
    text = f"service ready {ready - launched:.1f} s after launch: engine core {steps or 'no steps reported'}"
    finished = sorted(marks["ready"] - launched for marks in workers if "ready" in marks)
    if finished:
        text += f"; {len(finished)} output worker(s) ready {finished[0]:.1f}-{finished[-1]:.1f} s"
    return text


def process_age() -> float:
    """Seconds since this process started, its interpreter's start and imports included (Linux /proc; 0 elsewhere)."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def process_started() -> float:
    """When this process started (wall clock)."""
    return time.time() - process_age()
