"""bench.stitch: the loop's stitching per tick, each session on its own against all sessions in one call."""

from __future__ import annotations

import json

import torch

from bench import stitch


def test_stitching_all_sessions_in_one_call_dispatches_fewer_operators_per_tick() -> None:
    alone, together = (stitch.measure(torch.device("cpu"), 4, 5, 3, batched) for batched in (False, True))
    assert together["ops_per_tick"] < 0.6 * alone["ops_per_tick"]
    assert alone["cpu_ms_p50"] > 0 and together["cpu_ms_p50"] > 0


def test_the_report_names_its_machine_and_both_runs(tmp_path) -> None:
    out = tmp_path / "stitch.json"
    threads = torch.get_num_threads()
    assert stitch.main(["--device", "cpu", "--sessions", "2", "--repeats", "2", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads, "the process keeps its torch threads"
    report = json.loads(out.read_text())
    assert report["sessions"] == 2 and [run["batched"] for run in report["runs"]] == [False, True]
