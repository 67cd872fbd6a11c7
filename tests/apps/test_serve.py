"""python -m apps.serve: what its command line takes and refuses (``--ray`` included; the cluster itself is tested in
tests/cluster/test_app.py, the server it runs in tests/serving/test_server.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.serve import CPU_DEMO_SECONDS, EXAMPLES, deploy_options, parse_args, server_options
from serving.server import AVATAR_AT_START


def test_defaults_bind_loopback_and_demo_turns_on_the_preview() -> None:
    args = parse_args(["--avatar", "anna"])
    assert args.http == ("127.0.0.1", 8080) and args.webrtc is None
    assert args.sessions == 1 and not args.no_admission
    assert args.latency == "faithful" and args.overlap is None, "the latency mode picks the overlap (75 faithful)"
    assert args.output_workers >= 1
    demo = parse_args(["--demo"])
    assert demo.webrtc == ("127.0.0.1", 8080)
    service = parse_args([])
    assert service.avatar is None and not service.demo, "no avatar: the service starts with zero sessions"


def test_the_examples_of_the_help_are_command_lines_it_takes() -> None:
    examples = [line.split()[3:] for line in EXAMPLES.splitlines() if line.startswith("  python -m apps.serve")]
    assert len(examples) == 3
    for argv in examples:
        parse_args(argv)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rtmp", "rtmp://h/live/k"], "--avatar is required"),
        (["--avatar", "a", "--output-workers", "0"], "at least 1"),
        (["--avatar", "a", "--audio", "x.wav", "--listen"], "not allowed with"),
        (["--demo", "--listen"], "takes no --audio"),
        (["--avatar", "a", "--webrtc", "8080"], "HOST:PORT"),
        (["--avatar", "a", "--sessions", "-1"], "at least 0"),
        (["--avatar", "a", "--latency", "fast"], "invalid choice"),
        (["--avatar", "a", "--output", "preset=placebo"], '"output.preset": one of ultrafast'),
        (["--avatar", "a", "--output", "size"], "KEY=VALUE pairs"),
        (["--output", "size=720p"], "--avatar is required"),
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
    assert demo.at_start.demo_audio and demo.at_start.first.preview and demo.duration == CPU_DEMO_SECONDS
    bare = server_options(parse_args(["--http", "0.0.0.0:9000", "--token", "t0k3n"]))
    assert bare.at_start is None and (bare.host, bare.port, bare.token) == ("0.0.0.0", 9000, "t0k3n")
    assert not bare.service.loopback_only
    deploy = deploy_options(parse_args(["--ray", "--avatar", "anchor", "--output-workers", "3"]))
    assert deploy.device is None and deploy.service.workers == 3
    assert deploy.service.avatars == {AVATAR_AT_START: "anchor"}


def test_output_sets_how_the_sessions_at_start_are_encoded() -> None:
    argv = ["--avatar", "anchor.png", "--device", "cpu", "--output", "size=720p,bitrate_kbps=3000,audio_channels=1"]
    output = server_options(parse_args(argv)).at_start.first.output
    assert (output.size, output.bitrate_kbps, output.audio_channels, output.preset) == ("720p", 3000, 1, "veryfast")
    json_given = parse_args(["--avatar", "a", "--output", '{"size": "1080p", "preset": "superfast"}']).output
    assert (json_given.size, json_given.preset) == ("1080p", "superfast")
    assert server_options(parse_args(["--avatar", "a", "--device", "cpu"])).at_start.first.output.size == "avatar"


def test_mp4_at_start_records_into_its_folder_and_recordings_names_the_clients_folder(tmp_path) -> None:
    options = server_options(parse_args(["--avatar", "a.png", "--mp4", str(tmp_path / "live.mp4"), "--device", "cpu"]))
    assert (options.service.recordings, options.at_start.first.mp4) == (str(tmp_path), "live.mp4")
    options = server_options(parse_args(["--recordings", str(tmp_path), "--device", "cpu"]))
    assert options.service.recordings == str(tmp_path) and options.at_start is None
    assert server_options(parse_args(["--device", "cpu"])).service.recordings is None, "no recordings unless asked"


def test_ray_hands_every_service_option_of_the_single_server_to_its_replicas() -> None:
    argv = ["--avatar", "anchor", "--device", "cpu", "--steps", "2", "--plans", "plans/x", "--no-admission"]
    argv += ["--output-workers", "3"]
    single = server_options(parse_args([*argv, "--sessions", "0"])).service
    deploy = deploy_options(parse_args(["--ray", *argv, "--replicas", "3", "--gpus-per-replica", "0.5"]))
    assert replace(deploy.service, launched=None) == replace(single, launched=None)
    assert (deploy.replicas, deploy.gpus_per_replica, deploy.device) == (3, 0.5, "cpu")
    assert not deploy_options(parse_args(["--ray", "--http", "0.0.0.0:8000"])).service.loopback_only


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ray", "--latency", "low"], "--latency apply to sessions opened at start"),
        (["--ray", "--seed", "3", "--overlap", "70"], "--overlap, --seed apply"),
        (["--ray", "--yaw", "3"], "the controls apply"),
        (["--ray", "--avatar", "a", "--output", "size=720p"], "--output apply"),
        (["--ray", "--replicas", "0"], "at least 1"),
        (["--replicas", "2"], "add --ray"),
        (["--ray", "--allow-origin", "https://player.example"], "--allow-origin is the single server's"),
    ],
)
def test_ray_refuses_the_flags_of_sessions_at_start_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
