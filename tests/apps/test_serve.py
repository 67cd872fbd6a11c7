"""python -m apps.serve: what its command line takes and refuses (``--ray`` included; the cluster itself is tested in
tests/cluster/test_app.py, the server it runs in tests/serving/test_server.py)."""

from __future__ import annotations

import pytest

from apps.serve import CPU_DEMO_SECONDS, deploy_options, parse_args, server_options
from serving.server import AVATAR_AT_START


def test_defaults_bind_loopback_and_demo_turns_on_the_preview() -> None:
    args = parse_args(["--avatar", "anna"])
    assert args.http == ("127.0.0.1", 8080) and args.webrtc is None
    assert args.encoder == "auto" and args.sessions == 1 and not args.no_admission
    assert args.latency == "faithful" and args.overlap is None, "the latency mode picks the overlap (75 faithful)"
    assert args.output_workers >= 1
    demo = parse_args(["--demo"])
    assert demo.webrtc == ("127.0.0.1", 8080)
    service = parse_args([])
    assert service.avatar is None and not service.demo, "no avatar: the service starts with zero sessions"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rtmp", "rtmp://h/live/k"], "--avatar is required"),
        (["--avatar", "a", "--output-workers", "0"], "at least 1"),
        (["--avatar", "a", "--encoder", "nvenc"], "x264"),
        (["--avatar", "a", "--audio", "x.wav", "--listen"], "not allowed with"),
        (["--demo", "--listen"], "takes no --audio"),
        (["--avatar", "a", "--webrtc", "8080"], "HOST:PORT"),
        (["--avatar", "a", "--sessions", "-1"], "at least 0"),
        (["--avatar", "a", "--encoder", "vp8"], "invalid choice"),
    ],
)
def test_bad_command_lines_say_what_is_wrong(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_ray_serves_only_sessions_opened_through_the_api() -> None:
    assert parse_args(["--ray", "--avatar", "anchor"]).ray
    assert not parse_args([]).ray
    for start in (["--demo"], ["--avatar", "a", "--listen"], ["--avatar", "a", "--rtmp", "rtmp://h/l/k"]):
        with pytest.raises(SystemExit):
            parse_args(["--ray", *start])


def test_the_command_line_becomes_the_options_of_the_libraries() -> None:
    demo = server_options(parse_args(["--demo", "--device", "cpu"]))
    assert demo.service.checkpoints is None and demo.service.avatars == {AVATAR_AT_START: None}
    assert demo.at_start.demo_audio and demo.at_start.preview and demo.duration == CPU_DEMO_SECONDS
    bare = server_options(parse_args(["--http", "0.0.0.0:9000", "--token", "t0k3n"]))
    assert bare.at_start is None and (bare.host, bare.port, bare.token) == ("0.0.0.0", 9000, "t0k3n")
    assert not bare.service.loopback_only
    deploy = deploy_options(parse_args(["--ray", "--avatar", "anchor", "--output-workers", "3"]))
    assert deploy.device is None and deploy.service.workers == 3
    assert deploy.service.avatars == {AVATAR_AT_START: "anchor"}
