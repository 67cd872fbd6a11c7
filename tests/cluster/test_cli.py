"""``python -m streaming.serve --ray``: what the flag takes (the cluster itself is tested in test_app.py)."""

from __future__ import annotations

import pytest

from streaming.serve import parse_args


def test_ray_serves_only_sessions_opened_through_the_api() -> None:
    assert parse_args(["--ray", "--avatar", "anchor"]).ray
    assert not parse_args([]).ray
    for start in (["--demo"], ["--avatar", "a", "--listen"], ["--avatar", "a", "--rtmp", "rtmp://h/l/k"]):
        with pytest.raises(SystemExit):
            parse_args(["--ray", *start])
