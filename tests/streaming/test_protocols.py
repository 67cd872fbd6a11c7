"""What this process can publish to: PyAV's FFmpeg has RTMP and RTMPS; SRT is refused, with the reason, up front."""

from __future__ import annotations

import pytest

from streaming.protocols import output_protocols, srt_unavailable
from streaming.targets import TargetError, check_srt_url

SRT_BUILT_IN = "srt" in output_protocols()


def test_pyav_ffmpeg_publishes_rtmp_and_rtmps() -> None:
    assert {"rtmp", "rtmps", "file"} <= output_protocols()


@pytest.mark.skipif(SRT_BUILT_IN, reason="this PyAV's FFmpeg was built with libsrt")
def test_without_libsrt_the_start_up_line_says_srt_is_unavailable_and_what_to_use() -> None:
    reason = srt_unavailable()
    assert reason is not None and "without libsrt" in reason and "rtmp://" in reason


@pytest.mark.skipif(SRT_BUILT_IN, reason="this PyAV's FFmpeg was built with libsrt")
def test_without_libsrt_a_well_formed_srt_url_is_refused_with_that_reason() -> None:
    with pytest.raises(TargetError, match='^"srt": SRT outputs are unavailable') as error:
        check_srt_url("srt://ingest.example.com:9000?streamid=live/anchor")
    assert error.value.field == "srt"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("rtmp://ingest.example.com/live", "an srt://host:port URL"),
        (["srt://a:1"], "an srt://host:port URL"),
        ("srt://ingest.example.com", "SRT has no default port"),
        ("srt://:9000", "a URL with a server host"),
        ("srt://host:9000/\nx", "printable ASCII"),
        ("srt://host:99999", "not a URL"),
    ],
)
def test_a_malformed_srt_url_is_refused_naming_the_field_before_anything_else(url: object, says: str) -> None:
    with pytest.raises(TargetError, match=f'^"srt": .*{says}'):
        check_srt_url(url)


@pytest.mark.skipif(not SRT_BUILT_IN, reason="this PyAV's FFmpeg has no SRT")
def test_with_libsrt_a_well_formed_srt_url_is_accepted() -> None:
    assert srt_unavailable() is None
    assert check_srt_url("srt://ingest.example.com:9000") == "srt://ingest.example.com:9000"
