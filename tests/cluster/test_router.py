"""The order in which the capacity router offers a new session to the engine replicas."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from cluster.router import FORGET_AFTER, Sent, placement_order  # noqa: E402

FREE = {"a": 2, "b": 0, "c": 1}


def order(refused: tuple[str, ...] = ()) -> list[str]:
    return placement_order(list(FREE), FREE.__getitem__, refused, key=str)


def test_the_replica_with_the_most_room_is_offered_a_session_first() -> None:
    assert order() == ["a", "c", "b"]


def test_a_replica_that_refused_this_post_comes_after_every_one_that_has_not_however_much_room_it_reported() -> None:
    assert order(("a",)) == ["c", "b", "a"]
    assert order(("a", "c")) == ["b", "a", "c"]


def test_when_every_replica_refused_the_order_is_by_room_again() -> None:
    assert order(("a", "b", "c")) == ["a", "c", "b"]


def test_a_session_sent_counts_against_the_replica_until_a_report_has_its_answer_in_it() -> None:
    sent = Sent(count=1, answered=4, seq=7)
    assert sent.pending({"seq": 8, "answered": 4}) == 1, "a report made before the replica answered still lacks it"
    assert sent.pending({"seq": 8, "answered": 5}) == 0


def test_a_send_the_replica_never_answered_is_forgotten_after_a_few_reports() -> None:
    sent = Sent(count=2, answered=0, seq=3)
    assert sent.pending({"seq": 3 + FORGET_AFTER - 1, "answered": 1}) == 1
    assert sent.pending({"seq": 3 + FORGET_AFTER, "answered": 1}) == 0
