"""A session's output settings: sizes that keep the aspect, defaults per size, and errors that name the field."""

from __future__ import annotations

import pytest

from streaming.output_settings import OutputSettings, OutputSettingsError, default_kbps, output_size


def test_named_sizes_set_the_short_side_keep_the_aspect_and_stay_even() -> None:
    assert output_size(1920, 1080, "1080p") == (1920, 1080)
    assert output_size(1920, 1080, "720p") == (1280, 720)
    assert output_size(1920, 1080, "540p") == (960, 540)
    assert output_size(1080, 1920, "720p") == (720, 1280), "a vertical avatar stays vertical"
    assert output_size(1440, 1080, "540p") == (720, 540)
    width, height = output_size(1918, 1078, "720p")
    assert (width % 2, height % 2) == (0, 0) and height == 720
    assert output_size(512, 512, "avatar") == (512, 512)


def test_a_size_above_the_avatar_is_refused_naming_the_field() -> None:
    with pytest.raises(OutputSettingsError, match=r'^"output.size": 720p is larger than the avatar\'s 512x512'):
        OutputSettings(size="720p").frame_size(512, 512)


def test_defaults_follow_the_ingest_recommendations_for_the_output_size() -> None:
    assert [default_kbps(*size) for size in ((1920, 1080), (1280, 720), (960, 540), (512, 512))] == [
        6000,
        3500,
        2000,
        1500,
    ]
    video = OutputSettings().video(1920, 1080)
    assert (video.bitrate, video.buffer, video.cbr) == (6_000_000, 6_000_000, True)
    assert (video.profile, video.preset, video.tune, video.gop) == ("high", "veryfast", "zerolatency", 50)
    assert OutputSettings(size="720p").video(1920, 1080).bitrate == 3_500_000
    assert OutputSettings().video(512, 512).bitrate == 1_500_000


def test_from_json_reads_every_field_and_null_means_the_defaults() -> None:
    request = {
        "size": "720p",
        "bitrate_kbps": 4000,
        "buffer_kbits": 2000,
        "rate_control": "capped",
        "preset": "superfast",
        "tune": "film",
        "keyframe_seconds": 1,
        "profile": "main",
        "audio_channels": 1,
    }
    settings = OutputSettings.from_json(request)
    assert settings.describe() == request
    video = settings.video(1920, 1080)
    assert (video.bitrate, video.buffer, video.cbr, video.gop, video.tune) == (4_000_000, 2_000_000, False, 25, "film")
    assert OutputSettings.from_json(None) == OutputSettings()


@pytest.mark.parametrize(
    ("request_json", "field", "says"),
    [
        ({"size": "4k"}, "size", "one of avatar, 1080p, 720p, 540p"),
        ({"bitrate_kbps": 50_000}, "bitrate_kbps", "from 300 to 12000"),
        ({"bitrate_kbps": "6000"}, "bitrate_kbps", "a whole number of kbit/s"),
        ({"buffer_kbits": 10}, "buffer_kbits", "from 75 to 24000"),
        ({"preset": "placebo"}, "preset", "one of ultrafast, superfast, veryfast, faster, fast, medium"),
        ({"tune": "grain"}, "tune", "one of zerolatency, film"),
        ({"keyframe_seconds": 10}, "keyframe_seconds", "from 0.5 to 4.0"),
        ({"keyframe_seconds": 1.01}, "keyframe_seconds", "a whole number of frames at 25 fps"),
        ({"profile": "high10"}, "profile", "one of baseline, main, high"),
        ({"audio_channels": 6}, "audio_channels", "one of 1, 2"),
        ({"audio_channels": True}, "audio_channels", "one of 1, 2"),
        ({"rate_control": "vbr"}, "rate_control", "one of cbr, capped"),
        ({"bitrate": 6000}, "bitrate", "unknown setting"),
    ],
)
def test_a_bad_setting_raises_an_error_naming_it(request_json: dict, field: str, says: str) -> None:
    with pytest.raises(OutputSettingsError, match=f'^"output.{field}": .*{says}') as error:
        OutputSettings.from_json(request_json)
    assert error.value.field == f"output.{field}"


def test_output_must_be_an_object() -> None:
    with pytest.raises(ValueError, match='^"output": an object'):
        OutputSettings.from_json("1080p")


def test_the_buffer_must_fit_the_bitrate_and_the_size_s_level() -> None:
    with pytest.raises(OutputSettingsError, match=r'"output.buffer_kbits": between 0.25 and 2.0 s of the bitrate'):
        OutputSettings(bitrate_kbps=6000, buffer_kbits=1000).video(1920, 1080)
    with pytest.raises(
        OutputSettingsError, match=r'"output.buffer_kbits": 20000 kbit is over H.264 level 3.1\'s 17500'
    ):
        OutputSettings(size="720p", bitrate_kbps=12000, buffer_kbits=20000).video(1920, 1080)
    with pytest.raises(
        OutputSettingsError, match=r'"output.buffer_kbits": 16000 kbit is over H.264 level 3.1\'s 14000 for main'
    ):
        OutputSettings(profile="main", bitrate_kbps=8000, buffer_kbits=16000).video(1280, 720)


def test_describe_shows_what_the_settings_resolve_to_for_the_avatar() -> None:
    shown = OutputSettings(size="720p").describe(1920, 1080)
    assert shown["size"] == "720p" and (shown["width"], shown["height"]) == (1280, 720)
    assert (shown["bitrate_kbps"], shown["buffer_kbits"], shown["level"], shown["gop_frames"]) == (
        3500,
        3500,
        "3.1",
        50,
    )
    assert shown["audio"] == "AAC 2 channels 48 kHz"
    assert OutputSettings().describe()["bitrate_kbps"] is None, "without the avatar: the request as given"


def test_a_command_line_gives_key_value_pairs_or_the_json_object() -> None:
    settings = OutputSettings.from_text("size=720p, bitrate_kbps=3500,keyframe_seconds=1.2,profile=main")
    assert settings == OutputSettings(size="720p", bitrate_kbps=3500, keyframe_seconds=1.2, profile="main")
    assert OutputSettings.from_text('{"audio_channels": 1}') == OutputSettings(audio_channels=1)
    assert OutputSettings.from_text("") == OutputSettings()
    with pytest.raises(OutputSettingsError, match=r'"output.bitrate_kbps": a whole number'):
        OutputSettings.from_text("bitrate_kbps=fast")
    with pytest.raises(ValueError, match="KEY=VALUE pairs"):
        OutputSettings.from_text("720p")
