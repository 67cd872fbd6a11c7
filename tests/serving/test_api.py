"""The session API's shared definitions: importable without torch, one error shape, states and push messages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving.api import ErrorKind, RenderState, SessionError, SessionState, error_body
from streaming import push_messages as push


def test_a_client_imports_the_api_and_the_push_messages_without_torch_or_numpy() -> None:
    code = (
        "import sys, serving.api, streaming.push_messages; "
        "heavy = [m for m in ('torch', 'numpy', 'aiohttp', 'zmq') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_error_is_one_shape_and_every_kind_has_a_status() -> None:
    assert error_body("full", ErrorKind.ADMISSION) == {"error": "full", "kind": "admission"}
    assert {kind.status for kind in ErrorKind} <= {400, 401, 403, 404, 409, 413, 415, 500, 502, 503, 504}
    assert ErrorKind.of_status(404) is ErrorKind.NOT_FOUND and ErrorKind.of_status(418) is ErrorKind.INVALID
    assert SessionError("gone", "closed").kind is ErrorKind.CLOSED, "a kind given as its value becomes the enum"
    with pytest.raises(ValueError):
        SessionError("?", "no such kind")


def test_states_say_whether_a_session_holds_resources_and_whether_a_job_has_ended() -> None:
    assert [s for s in SessionState if s.live] == ["starting", "live", "ending"]
    assert [s for s in RenderState if s.ended] == ["done", "failed", "cancelled"]


@pytest.mark.parametrize(
    "message",
    [
        push.Ready(24000, 1, "s16le", "low"),
        push.ControlsApplied({"yaw": 10}),
        push.SegmentEnded(None),
        push.Interrupted(3),
        push.Ended(),
        push.Error("bad"),
        push.AheadLimit(9.8, 10.0),
        push.PlaybackStarted(0),
        push.PlaybackFinished(0, 1.24, False),
        push.OutputFailed("mp4", "disk full"),
        push.SessionFailed("the worker died"),
        push.BehindRealTime(6.0),
        push.KeepsUp(1.0),
    ],
)
def test_a_server_message_reads_back_as_itself(message: push.PushMessage) -> None:
    assert message.to_json()["type"] == message.TYPE
    assert push.server_message(message.to_json()) == message
    assert push.server_message({**message.to_json(), "from_a_newer_server": 1}) == message


def test_client_messages_read_back_and_anything_else_is_refused_by_name() -> None:
    assert push.client_message({"type": "controls", "yaw": 5}) == push.Controls({"yaw": 5})
    assert push.client_message(push.Format(16000).to_json()) == push.Format(16000, 1, "s16le")
    assert push.client_message({"type": "interrupt"}) == push.Interrupt()
    with pytest.raises(push.PushMessageError, match="unknown message type 'speak'"):
        push.client_message({"type": "speak"})
    with pytest.raises(push.PushMessageError, match="unknown field"):
        push.client_message({"type": "format", "rate": 16000})
    with pytest.raises(push.PushMessageError, match="JSON object"):
        push.client_message(["format"])
    assert push.playback_event("playback_started", {"segment": 2}) == push.PlaybackStarted(2)
