"""The start-up timeline: each process's steps against the launch, in one line."""

from __future__ import annotations

import time
from pathlib import Path

from serving.timeline import describe, process_age, process_started, since


def test_marks_are_seconds_after_the_launch() -> None:
    assert since(100.0, {"spawned": 102.104, "ready": 110.0}) == {"spawned": 2.1, "ready": 10.0}


def test_the_line_names_each_core_step_and_the_workers_span() -> None:
    core = {"spawned": 102.1, "imported": 104.0, "networks loaded": 106.5, "warmed up": 110.0, "ready": 110.1}
    line = describe(100.0, 114.2, core, [{"ready": 106.2}, {"imported": 103.0}, {"ready": 105.0}])
    assert line == (
        "service ready 14.2 s after launch: engine core spawned 2.1, imported 4.0, networks loaded 6.5, warmed up "
        "10.0, "
        "ready 10.1; 2 output worker(s) ready 5.0-6.2 s"
    )
    assert describe(100.0, 101.0, {}, []) == "service ready 1.0 s after launch: engine core no steps reported"


def test_this_process_started_before_now_and_after_the_machine() -> None:
    age = process_age()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert 0 < age < uptime
    assert abs(process_started() - (time.time() - age)) < 0.05
