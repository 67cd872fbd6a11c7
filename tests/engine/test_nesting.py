"""Plain data from outside is refused past a nesting depth, with a clear error and never a RecursionError."""

from __future__ import annotations

import pytest

from engine.nesting import load_json, nested_over


def test_json_within_the_depth_is_read() -> None:
    assert load_json('{"a": [[1, 2], {"b": null}]}', 3, "a message") == {"a": [[1, 2], {"b": None}]}
    assert not nested_over({"a": [[1]]}, 3) and nested_over({"a": [[[1]]]}, 3)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 100_000 + "]" * 100_000, "a message is nested too deep"),
        ('{"a": [[[[]]]]}', "a message is nested more than 4 deep"),
        ("{not json", "Expecting property name"),
    ],
)
def test_json_past_the_depth_or_broken_is_a_value_error_naming_what_it_is(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_json(text, 4, "a message")
