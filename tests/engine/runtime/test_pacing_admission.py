"""The live clock and admission: silence only just in time, speech as early as it can be ready, capacity from measured
costs."""

from __future__ import annotations

import pytest

from engine.runtime.admission import capacity, hop_cost, hop_latency
from engine.runtime.pacing import (
    Lead,
    frame_deadline,
    frames_due,
    needs_idle,
    on_grid,
    speech_depth,
    speech_start,
    window_due,
    window_due_at,
)

RENDER_MS = {5: 23.6, 10: 42.2, 20: 81.4, 40: 151.2}
WINDOW_MS = {1: 26.9, 2: 28.2, 4: 30.1, 8: 36.9, 16: 56.1}


def test_the_clock_starts_at_the_first_ready_frame() -> None:
    assert frames_due(10.0, None) == 0
    assert frames_due(11.0, 10.0) == 25
    assert frame_deadline(10.0, 50) == 12.0


LEAD = Lead(compute=1.0, margin=0.5)


def test_idle_silence_comes_only_when_the_frames_run_short() -> None:
    assert needs_idle(produced=10, due=8.6, lead=LEAD, speech_tail=False)
    assert not needs_idle(produced=10, due=8.5, lead=LEAD, speech_tail=False)


def test_a_late_pusher_is_not_padded_until_half_the_margin_is_used_up() -> None:
    assert needs_idle(produced=10, due=8.7, lead=LEAD, speech_tail=False)
    assert not needs_idle(produced=10, due=8.7, lead=LEAD, speech_tail=True), "half the margin is the late pusher's"
    assert needs_idle(produced=10, due=8.8, lead=LEAD, speech_tail=True)


def test_a_window_runs_once_the_clock_is_within_the_lead_of_its_first_frame_as_idle_silence_comes() -> None:
    assert not window_due(produced=10, due=8.5, lead=LEAD)
    assert window_due(produced=10, due=8.6, lead=LEAD)
    assert window_due(produced=10, due=30.0, lead=LEAD), "a late window runs at once"
    for due in (8.4, 8.6):
        assert window_due(10, due, LEAD) == needs_idle(10, due, LEAD, speech_tail=False), (
            "silence and its window come together"
        )


def test_a_window_falls_due_at_the_instant_the_clock_comes_within_the_lead_of_it() -> None:
    at = window_due_at(anchor=100.0, produced=10, lead=LEAD)
    assert at == pytest.approx(100.0 + 8.5 / 25)
    assert not window_due(10, frames_due(at - 1e-6, 100.0), LEAD)
    assert window_due(10, frames_due(at + 1e-6, 100.0), LEAD)


def test_a_clock_starts_on_the_next_point_of_the_grid() -> None:
    assert on_grid(10.05, origin=3.0, period=0.2) == pytest.approx(10.2)
    assert on_grid(10.2, origin=3.0, period=0.2) == pytest.approx(10.2), "a point on the grid stays"
    assert on_grid(2.95, origin=3.0, period=0.2) == pytest.approx(3.0)


def test_a_frame_is_final_485_ms_of_audio_after_it_at_overlap_75() -> None:
    assert speech_depth(valid=5, held=5) == 12.125
    assert speech_depth(valid=70, held=10) == 82.125
    assert speech_depth(valid=3, held=3) == 3 + 3 + 4 + 2.125, (
        "a window that is not whole hops waits for the rest of a hop"
    )


def test_speech_goes_right_after_the_committed_audio_when_that_is_far_enough_ahead() -> None:
    depth = speech_depth(5, 5)
    assert speech_start(committed=640 * 40, due=20.0, lead=LEAD, depth=depth) == 640 * 40


def test_speech_never_starts_sooner_than_its_frames_can_be_final() -> None:
    depth = speech_depth(5, 5)
    start = speech_start(committed=640 * 25, due=20.0, lead=LEAD, depth=depth)
    assert start == pytest.approx(640 * (20.0 + 12.125 + 1.5), abs=1)
    assert start - 640 * 20.0 >= 640 * (depth + LEAD.frames), (
        "its latency is exactly depth + lead, whatever was committed"
    )


def test_capacity_is_the_most_sessions_whose_hop_fits_the_budget() -> None:
    cap = capacity(75, WINDOW_MS, RENDER_MS, utilization=0.8)
    assert hop_cost(cap, 75, WINDOW_MS, RENDER_MS) <= 160 < hop_cost(cap + 1, 75, WINDOW_MS, RENDER_MS)
    assert cap == 5
    assert capacity(75, WINDOW_MS, {k: v / 2 for k, v in RENDER_MS.items()}, 0.8) > cap


def test_a_lower_overlap_samples_fewer_windows_per_hop() -> None:
    assert hop_cost(4, 10, WINDOW_MS, RENDER_MS) < hop_cost(4, 75, WINDOW_MS, RENDER_MS)


def test_the_lead_covers_one_hop_of_every_live_session_batched() -> None:
    assert hop_latency(1, WINDOW_MS, RENDER_MS) == pytest.approx(26.9 + 23.6)
    assert hop_latency(4, WINDOW_MS, RENDER_MS) == pytest.approx(30.1 + 81.4)
    assert hop_latency(4, WINDOW_MS, RENDER_MS) >= hop_cost(4, 75, WINDOW_MS, RENDER_MS)


def test_the_low_latency_mode_needs_two_fifths_of_the_audio_after_a_frame() -> None:
    assert speech_depth(valid=3, held=0, hop=3) == 5.125, "a 3-frame hop, nothing held, the look-ahead: 205 ms"
    assert speech_depth(valid=5, held=5, hop=5) == 12.125, "faithful: 485 ms"
