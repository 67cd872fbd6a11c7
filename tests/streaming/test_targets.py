"""Output targets a client names: MP4 files confined to the operator's recordings folder, RTMP URLs to servers only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streaming.targets import (
    MAX_RTMP_OUTPUTS,
    MAX_URL_LENGTH,
    TargetError,
    check_rtmp_url,
    check_rtmp_urls,
    masked_rtmp_url,
    resolve_mp4_target,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "recordings"
    folder.mkdir()
    return folder


def test_an_mp4_name_resolves_inside_the_recordings_folder(root: Path) -> None:
    assert resolve_mp4_target("clip.mp4", root) == root.resolve() / "clip.mp4"
    assert resolve_mp4_target("day1/clip.mp4", root) == root.resolve() / "day1" / "clip.mp4"
    assert resolve_mp4_target("./y.mp4", root) == root.resolve() / "y.mp4"


@pytest.mark.parametrize(
    "name, message",
    [
        ("../escape.mp4", "without '..'"),
        ("day1/../../escape.mp4", "without '..'"),
        ("/etc/cron.d/x.mp4", "relative to the server's recordings folder"),
        ("clip\x00.mp4", "no control characters (nor NUL)"),
        ("clip\n.mp4", "no control characters"),
        ("notes.txt", "ending in .mp4"),
        (".mp4", "ending in .mp4"),
        ("a" * 300 + ".mp4", "at most 255 bytes"),
        ("", "a file name ending in .mp4"),
        (["clip.mp4"], "a file name ending in .mp4"),
    ],
)
def test_an_mp4_name_that_is_not_a_plain_relative_name_is_refused_naming_its_field(root: Path, name, message) -> None:
    with pytest.raises(TargetError) as error:
        resolve_mp4_target(name, root)
    assert str(error.value).startswith('"mp4": ') and message in str(error.value)
    assert error.value.field == "mp4"


def test_an_ffmpeg_protocol_prefix_is_only_part_of_a_file_name(root: Path) -> None:
    for name in ("file:clip.mp4", "tee:a.mp4", "concat:a.mp4", "pipe:1.mp4"):
        assert resolve_mp4_target(name, root) == root.resolve() / name


def test_a_link_out_of_the_recordings_folder_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "out").symlink_to(outside)
    with pytest.raises(TargetError, match="leads out of the server's recordings folder"):
        resolve_mp4_target("out/clip.mp4", root)
    (root / "loop.mp4").symlink_to(outside / "victim.mp4")
    with pytest.raises(TargetError, match="leads out"):
        resolve_mp4_target("loop.mp4", root)


def test_an_existing_name_of_any_kind_is_never_replaced(root: Path) -> None:
    (root / "kept.mp4").write_bytes(b"an earlier recording")
    (root / "folder.mp4").mkdir()
    os.mkfifo(root / "fifo.mp4")
    (root / "link.mp4").symlink_to(root / "absent.mp4")
    for name in ("kept.mp4", "folder.mp4", "fifo.mp4", "link.mp4"):
        with pytest.raises(TargetError, match="exists; a recording never replaces anything"):
            resolve_mp4_target(name, root)
    assert (root / "kept.mp4").read_bytes() == b"an earlier recording"


def test_a_missing_recordings_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="recordings folder cannot be used"):
        resolve_mp4_target("clip.mp4", tmp_path / "absent")


def test_rtmp_urls_to_a_server_are_taken() -> None:
    assert check_rtmp_url("rtmp://127.0.0.1/live/key") == "rtmp://127.0.0.1/live/key"
    secure = "rtmps://live.example.com:443/app/stream?token=a%20b"
    assert check_rtmp_url(secure) == secure
    assert check_rtmp_urls("rtmp://a/live/1") == ("rtmp://a/live/1",)
    assert check_rtmp_urls(["rtmp://a/live/1", "rtmps://b/live/2"]) == ("rtmp://a/live/1", "rtmps://b/live/2")


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://example.com/live", "an rtmp:// or rtmps:// URL"),
        ("file:/etc/passwd", "an rtmp:// or rtmps:// URL"),
        ("tee:rtmp://a/live|file:/tmp/x", "an rtmp:// or rtmps:// URL"),
        ("RTMP://a/live", "an rtmp:// or rtmps:// URL"),
        ("rtmp:///live/key", "with a server host"),
        ("rtmp://a/live\nINFO forged log line", "without spaces or control characters"),
        ("rtmp://a/live key=value", "without spaces"),
        ("rtmp://a:99999/live", "not a URL"),
        ("rtmp://a/" + "k" * MAX_URL_LENGTH, f"at most {MAX_URL_LENGTH} characters"),
        (7, "an rtmp:// or rtmps:// URL"),
    ],
)
def test_an_rtmp_url_that_is_not_a_plain_server_url_is_refused_naming_the_field(url, message: str) -> None:
    with pytest.raises(TargetError) as error:
        check_rtmp_url(url)
    assert str(error.value).startswith('"rtmp": ') and message in str(error.value)


def test_a_session_has_a_bounded_number_of_rtmp_outputs() -> None:
    assert len(check_rtmp_urls([f"rtmp://a/live/{i}" for i in range(MAX_RTMP_OUTPUTS)])) == MAX_RTMP_OUTPUTS
    with pytest.raises(TargetError, match=f"at most {MAX_RTMP_OUTPUTS} URLs per session, got 200"):
        check_rtmp_urls([f"rtmp://a/live/{i}" for i in range(200)])
    with pytest.raises(TargetError, match="a list of them"):
        check_rtmp_urls({"url": "rtmp://a/live"})


def test_an_rtmp_url_is_shown_without_its_stream_key() -> None:
    assert masked_rtmp_url("rtmp://live.example/app/sk_live_123") == "rtmp://live.example/app/***"
    assert masked_rtmp_url("rtmps://live.example:443/app/key?auth=abc") == "rtmps://live.example:443/app/***?***"
    assert masked_rtmp_url("rtmp://live.example/") == "rtmp://live.example/"
