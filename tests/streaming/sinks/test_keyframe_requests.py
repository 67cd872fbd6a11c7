"""The route of a browser's keyframe requests past aiortc's own encoder (``streaming.sinks.keyframe_requests``)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("aiortc")

from streaming.sinks import keyframe_requests


class Sender:
    """An aiortc sender as aiortc 1.16 has it: a PLI or FIR calls its ``_send_keyframe``."""

    def _send_keyframe(self) -> None:
        raise AssertionError("aiortc's own keyframe request: it never reaches the shared encoder")


def test_a_pli_reaches_the_callback_and_a_release_without_the_hook_is_named_in_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    requests = []
    sender = Sender()
    keyframe_requests.route_keyframe_requests(sender, lambda: requests.append(1))
    sender._send_keyframe()  # what aiortc does on a PLI
    assert requests == [1] and not caplog.records

    monkeypatch.setattr(keyframe_requests, "_warned", False)
    changed = object.__new__(type("ChangedSender", (), {}))
    with caplog.at_level(logging.WARNING):
        keyframe_requests.route_keyframe_requests(changed, lambda: None)
        keyframe_requests.route_keyframe_requests(changed, lambda: None)
    assert [r.message.split(":")[0] for r in caplog.records] == ["aiortc's RTCRtpSender has no _send_keyframe"], "once"
