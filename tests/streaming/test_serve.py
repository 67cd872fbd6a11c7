"""The server's command line: loopback by default, a token beyond it, one name per session."""

from __future__ import annotations

import pytest

from streaming.serve import is_loopback, numbered, parse_args, resolve_token


def test_defaults_bind_loopback_and_demo_turns_on_the_preview() -> None:
    args = parse_args(["--avatar", "anna"])
    assert args.http == ("127.0.0.1", 8080) and args.webrtc is None
    assert args.encoder == "auto" and args.sessions == 1 and args.overlap == 75
    demo = parse_args(["--demo"])
    assert demo.webrtc == ("127.0.0.1", 8080)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--avatar is required"),
        (["--avatar", "a", "--audio", "x.wav", "--listen"], "not allowed with"),
        (["--demo", "--listen"], "takes no --audio"),
        (["--avatar", "a", "--webrtc", "8080"], "HOST:PORT"),
        (["--avatar", "a", "--sessions", "0"], "at least 1"),
        (["--avatar", "a", "--encoder", "vp8"], "invalid choice"),
    ],
)
def test_bad_command_lines_say_what_is_wrong(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_token_is_required_beyond_loopback() -> None:
    assert resolve_token("127.0.0.1", None) == (None, False)
    assert resolve_token("localhost", "given") == ("given", False)
    assert resolve_token("0.0.0.0", "given") == ("given", False)
    token, generated = resolve_token("0.0.0.0", None)
    assert generated and len(token) >= 16
    assert resolve_token("::", None)[1] and not is_loopback("192.0.2.7") and is_loopback("::1")


def test_each_session_gets_its_own_url_and_file() -> None:
    assert numbered("rtmp://h/live/key", 0, 3) == "rtmp://h/live/key"
    assert numbered("rtmp://h/live/key", 2, 3) == "rtmp://h/live/key-2"
    assert numbered("out/rec.mp4", 1, 2) == "out/rec-1.mp4"
    assert numbered("out/rec.mp4", 1, 1) == "out/rec.mp4"
