"""bench.latency: glass-to-glass figures held against the targets (docs/benchmarks.md) of the run's latency mode."""

from __future__ import annotations

from bench.latency import targets_table, verdicts


def path(label: str, p99: float | None, first: float | None) -> dict:
    return {"label": label, "p99_ms": p99, "first_push_ms": first}


def test_faithful_runs_are_held_to_600_ms_on_rtmp_and_560_on_webrtc() -> None:
    glass = {
        "latency": "faithful",
        "paths": {"rtmp": path("RTMP", 583.2, 528.0), "aiortc_video": path("aiortc", 561.0, 527.0)},
    }
    rows = verdicts(glass)
    assert [(r["target_ms"], r["met"]) for r in rows] == [(600.0, True), (560.0, False)]
    assert "NOT met" in targets_table(rows).splitlines()[1]


def test_low_latency_runs_check_the_first_push_too_and_a_missing_figure_is_not_met() -> None:
    glass = {"latency": "low", "paths": {"rtmp": path("RTMP", 289.1, None)}}
    rows = verdicts(glass)
    assert [(r["what"], r["target_ms"], r["met"]) for r in rows] == [
        ("RTMP, p99", 400.0, True),
        ("RTMP, first push", 400.0, False),
    ]
