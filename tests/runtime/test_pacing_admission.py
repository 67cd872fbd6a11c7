"""The live clock and admission: silence only just in time, capacity from measured costs."""

from __future__ import annotations

from engine.runtime.admission import capacity, hop_cost
from engine.runtime.pacing import SPEECH_HOLD_FRAMES, frame_deadline, frames_due, needs_idle

RENDER_MS = {5: 23.6, 10: 42.2, 20: 81.4, 40: 151.2}
WINDOW_MS = {1: 26.9, 2: 28.2, 4: 30.1, 8: 36.9, 16: 56.1}


def test_the_clock_starts_at_the_first_ready_frame() -> None:
    assert frames_due(10.0, None) == 0
    assert frames_due(11.0, 10.0) == 25
    assert frame_deadline(10.0, 50) == 12.0


def test_idle_silence_comes_only_when_the_frames_run_short() -> None:
    assert needs_idle(produced=10, due=8.0, min_lead=3, speech_tail=False)
    assert not needs_idle(produced=11, due=8.0, min_lead=3, speech_tail=False)


def test_a_late_pusher_is_not_padded_until_the_deadline_is_close() -> None:
    assert needs_idle(produced=10, due=7.5, min_lead=3, speech_tail=False)
    assert not needs_idle(produced=10, due=7.5, min_lead=3, speech_tail=True)
    assert needs_idle(produced=10, due=10 - SPEECH_HOLD_FRAMES + 0.5, min_lead=3, speech_tail=True)


def test_capacity_is_the_most_sessions_whose_hop_fits_the_budget() -> None:
    cap = capacity(75, WINDOW_MS, RENDER_MS, utilization=0.8)
    assert hop_cost(cap, 75, WINDOW_MS, RENDER_MS) <= 160 < hop_cost(cap + 1, 75, WINDOW_MS, RENDER_MS)
    assert cap == 5
    assert capacity(75, WINDOW_MS, {k: v / 2 for k, v in RENDER_MS.items()}, 0.8) > cap


def test_a_lower_overlap_samples_fewer_windows_per_hop() -> None:
    assert hop_cost(4, 10, WINDOW_MS, RENDER_MS) < hop_cost(4, 75, WINDOW_MS, RENDER_MS)
