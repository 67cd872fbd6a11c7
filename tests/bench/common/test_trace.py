"""The trace read back: a repeat is put down to the first stage its frame was late at; ticks give the GPU's idle."""

from __future__ import annotations

from pathlib import Path

from bench.common.trace import summary
from engine.trace import Trace


def write(path: Path, *records: tuple[str, float, dict]) -> None:
    trace = Trace(path)
    for kind, t, fields in records:
        trace.record(kind, t, **fields)
    trace.close()


def test_a_repeat_is_put_down_to_the_first_stage_its_frame_was_late_at(tmp_path: Path) -> None:
    slot = 100.0
    write(
        tmp_path / "publisher-1.jsonl",
        ("take", slot - 0.030, {"s": "a", "i": 10, "n": 4, "live": True}),  # frames 10-13 in time
        ("commit", slot - 0.020, {"s": "a", "i": 10, "n": 4, "due": slot}),
        ("take", slot + 0.005, {"s": "b", "i": 20, "n": 2, "live": True}),  # frame 20's GPU work ran past the slot
        ("commit", slot + 0.008, {"s": "b", "i": 20, "n": 2, "due": slot}),
        ("take", slot - 0.010, {"s": "c", "i": 5, "n": 1, "live": True}),
        ("commit", slot + 0.002, {"s": "c", "i": 5, "n": 1, "due": slot}),  # staged past it
    )
    write(
        tmp_path / "output-2.jsonl",
        ("prepared", slot + 0.004, {"s": "a", "i": 11, "due": slot}),  # the worker took it late
        ("prepared", slot + 0.010, {"s": "b", "i": 20, "due": slot}),
        ("prepared", slot + 0.003, {"s": "c", "i": 5, "due": slot}),
        ("repeat", slot, {"s": "a", "slot": 7, "deadline": slot, "shift": 0.0, "expected": 11}),
        ("repeat", slot, {"s": "b", "slot": 7, "deadline": slot, "shift": 0.0, "expected": 20}),
        ("repeat", slot, {"s": "c", "slot": 7, "deadline": slot, "shift": 0.0, "expected": 5}),
        ("repeat", slot, {"s": "d", "slot": 7, "deadline": slot, "shift": 0.0, "expected": 1}),
    )

    found = summary(tmp_path)

    assert found["repeats"] == 4
    assert {r["session"]: r["stage"] for r in found["repeated"]} == {
        "a": "worker",
        "b": "gpu",
        "c": "publisher",
        "d": "unknown",
    }
    a = next(r for r in found["repeated"] if r["session"] == "a")
    assert (a["taken_ms"], a["committed_ms"], a["prepared_ms"]) == (-30.0, -20.0, 4.0), "ms after the slot"


def test_the_ticks_give_the_gpus_busy_share_and_its_idle_gaps(tmp_path: Path) -> None:
    tick = {"wall": 1.0, "cpu": 1.0, "gpu": 10.0, "rows": {"render": [8, 2]}}
    write(
        tmp_path / "core-1.jsonl",
        ("tick", 10.000, {**tick, "gpu_from": 10.001, "gpu_to": 10.011}),
        ("tick", 10.020, {**tick, "gpu_from": 10.021, "gpu_to": 10.031}),  # 10 ms idle before it
    )

    ticks = summary(tmp_path)["ticks"]

    assert ticks["n"] == 2 and ticks["rows"] == {"render": [16, 4]}
    assert ticks["gpu_idle_ms_total"] == 10.0 and ticks["gpu_busy"] == round(20 / 30, 4)
    assert ticks["gpu_start_after_host_ms"]["p50_ms"] == 1.0
