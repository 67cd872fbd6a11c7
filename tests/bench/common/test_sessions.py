"""bench.common.sessions: the push clock of the benchmarks that drive live sessions; every session pushes every hop,
together or on its own phase."""

from __future__ import annotations

import pytest

from bench.common.sessions import HOP, push_schedule


def test_sessions_in_phase_push_every_hop_at_the_same_instant() -> None:
    schedule = push_schedule(3, 2, stagger=False)
    assert [(at, k) for at, k, _ in schedule] == [(0.0, 0)] * 3 + [(HOP, 1)] * 3
    assert sorted(i for *_, i in schedule) == [0, 0, 1, 1, 2, 2]


def test_staggered_sessions_spread_their_pushes_evenly_over_the_hop() -> None:
    schedule = push_schedule(4, 2, stagger=True)
    assert [at for at, *_ in schedule] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35])
    assert [i for *_, i in schedule] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [k for _, k, _ in schedule] == [0, 0, 0, 0, 1, 1, 1, 1]
