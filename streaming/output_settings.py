"""A session's output settings: picture size, video bitrate and buffer, x264 preset and tune, GOP, profile, audio.

One typed value per session, read from the ``output`` object of ``POST /sessions`` by ``from_json`` (every
error names its field, for a 400) and shown by ``describe`` in ``GET /sessions/{id}``. Defaults follow the
ingest recommendations broadcast platforms publish for H.264 at 25-30 fps: a 2 s closed GOP (YouTube Live
and Twitch both ask for 2 s keyframes), constant bitrate (Twitch requires CBR; YouTube recommends it), High
profile (YouTube's recommendation; Twitch prefers Main, one setting away), AAC stereo at 48 kHz, and a
bitrate per size inside YouTube Live's recommended range and at or under the top of Twitch's 3-6 Mbit/s
(1080p 6000, 720p 3500, 540p 2000, 512x512 1500 kbit/s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from engine.timebase import FPS
from streaming.encoders.h264 import PROFILES, H264Settings, level_for, max_buffer

AVATAR = "avatar"
SIZES = {"1080p": 1080, "720p": 720, "540p": 540}
"""Named sizes: the short side in pixels (1920x1080 for a 16:9 avatar, 1080x1920 for a 9:16 one)."""
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium")
"""x264 presets offered; medium already takes about 80 ms a 1080p frame on two cores (admission counts it), and
slower ones would need several cores per stream."""
TUNES = ("zerolatency", "film", "animation", "stillimage")
"""x264 tunes; the psy ones are combined with zerolatency (a live frame's packet must come back at once)."""
RATE_CONTROLS = ("cbr", "capped")
"""``cbr``: constant bitrate with filler and HRD timing (RTMP ingest); ``capped``: an average capped by the VBV."""
AUDIO_CHANNELS = (1, 2)
BITRATE_KBPS = (300, 12_000)
"""The video bitrates offered: from a small preview up to YouTube Live's top recommendation for 1080p."""
BUFFER_SECONDS = (0.25, 2.0)
"""The VBV buffer in seconds of the bitrate: shorter is lower latency and less even quality."""
KEYFRAME_SECONDS = (0.5, 4.0)
"""Keyframe intervals offered: YouTube Live accepts up to 4 s, Twitch asks for 2 s."""
DEFAULT_KBPS = ((1080, 6000), (720, 3500), (540, 2000), (0, 1500))
"""(short side at least, default kbps): YouTube Live / Twitch ingest recommendations for 25-30 fps."""


class OutputSettingsError(ValueError):
    """A bad output setting; the message starts with the request field it names (``output.bitrate_kbps``, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f'"output.{field}": {message}')
        self.field = f"output.{field}"


def output_size(width: int, height: int, size: str) -> tuple[int, int]:
    """The (width, height) of ``size`` for an avatar of ``width`` x ``height``: the short side at the named size, the
    aspect kept, both even; the avatar's own size for ``avatar``. OutputSettingsError for an upscale."""
    if size == AVATAR:
        return width, height
    short = SIZES[size]
    if short > min(width, height):
        raise OutputSettingsError(
            "size",
            f"{size} is larger than the avatar's {width}x{height}; scaling up adds no detail, only bitrate: "
            f"register the avatar at {size} or choose a smaller size",
        )
    scale = short / min(width, height)
    return _even(width * scale), _even(height * scale)


def default_kbps(width: int, height: int) -> int:
    """The default video bitrate for a picture of this size (see DEFAULT_KBPS)."""
    return next(kbps for short, kbps in DEFAULT_KBPS if min(width, height) >= short)


@dataclass(frozen=True)
class OutputSettings:
    """How a session's stream is encoded; ``None`` bitrate and buffer take the defaults of the output's size."""

    size: str = AVATAR
    bitrate_kbps: int | None = None
    buffer_kbits: int | None = None
    rate_control: str = "cbr"
    preset: str = "veryfast"
    tune: str = "zerolatency"
    keyframe_seconds: float = 2.0
    profile: str = "high"
    audio_channels: int = 2

    def __post_init__(self) -> None:
        _choice("size", self.size, (AVATAR, *SIZES))
        _choice("rate_control", self.rate_control, RATE_CONTROLS)
        _choice("preset", self.preset, PRESETS)
        _choice("tune", self.tune, TUNES)
        _choice("profile", self.profile, PROFILES)
        _choice("audio_channels", self.audio_channels, AUDIO_CHANNELS)
        if self.bitrate_kbps is not None:
            _integer("bitrate_kbps", self.bitrate_kbps, *BITRATE_KBPS, "kbit/s")
        if self.buffer_kbits is not None:
            low, high = BUFFER_SECONDS
            _integer(
                "buffer_kbits", self.buffer_kbits, round(BITRATE_KBPS[0] * low), round(BITRATE_KBPS[1] * high), "kbit"
            )
        _number("keyframe_seconds", self.keyframe_seconds, *KEYFRAME_SECONDS)
        frames = self.keyframe_seconds * FPS
        if abs(frames - round(frames)) > 1e-9:
            raise OutputSettingsError(
                "keyframe_seconds", f"a whole number of frames at {FPS} fps, got {self.keyframe_seconds}"
            )

    @classmethod
    def from_json(cls, value: Any) -> OutputSettings:
        """The settings in a request's ``output`` object (absent or null: the defaults); OutputSettingsError naming
        the first bad field."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError('"output": an object of output settings (size, bitrate_kbps, preset, ...)')
        known = {f.name for f in fields(cls)}
        for name in value:
            if name not in known:
                raise OutputSettingsError(str(name), f"unknown setting; the settings are {', '.join(sorted(known))}")
        return cls(**value)

    @classmethod
    def from_text(cls, text: str) -> OutputSettings:
        """The settings a command line gives: ``KEY=VALUE,...`` (``size=720p,bitrate_kbps=3500,preset=veryfast``;
        numbers are read as numbers) or the JSON object itself; ValueError naming the first bad field."""
        if text.lstrip().startswith("{"):
            try:
                return cls.from_json(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f'"output": not a JSON object ({exc})') from None
        settings: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f'"output": KEY=VALUE pairs separated by commas (size=720p,preset=fast), got {item!r}')
            settings[key.strip()] = _number_or_text(value.strip())
        return cls.from_json(settings)

    def frame_size(self, width: int, height: int) -> tuple[int, int]:
        """The stream's (width, height) for an avatar of ``width`` x ``height``."""
        return output_size(width, height, self.size)

    def video(self, width: int, height: int) -> H264Settings:
        """The H.264 settings of the stream from an avatar of ``width`` x ``height``; OutputSettingsError when the
        buffer does not fit the bitrate or the size's level (every offered bitrate fits level 3.1 and up)."""
        out_width, out_height = self.frame_size(width, height)
        kbps = self.bitrate_kbps or default_kbps(out_width, out_height)
        kbits = self.buffer_kbits or kbps
        low, high = BUFFER_SECONDS
        if not low * kbps <= kbits <= high * kbps:
            raise OutputSettingsError(
                "buffer_kbits",
                f"between {low} and {high} s of the bitrate "
                f"({round(low * kbps)}-{round(high * kbps)} kbit), got {kbits}",
            )
        level = level_for(out_width, out_height)
        limit = max_buffer(level, self.profile)
        if kbits * 1000 > limit:
            raise OutputSettingsError(
                "buffer_kbits", f"{kbits} kbit is over H.264 level {level}'s {limit // 1000} for {self.profile}"
            )
        return H264Settings(
            bitrate=kbps * 1000,
            keyframe_seconds=self.keyframe_seconds,
            preset=self.preset,
            profile=self.profile,
            tune=self.tune,
            buffer=kbits * 1000,
            cbr=self.rate_control == "cbr",
        )

    def describe(self, width: int | None = None, height: int | None = None) -> dict[str, Any]:
        """The settings as ``GET /sessions/{id}`` shows them; given the avatar's size, also what they resolve to (the
        stream's size, level, bitrate and buffer)."""
        described: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        if width is None or height is None:
            return described
        out_width, out_height = self.frame_size(width, height)
        video = self.video(width, height)
        return described | {
            "width": out_width,
            "height": out_height,
            "bitrate_kbps": video.bitrate // 1000,
            "buffer_kbits": video.buffer // 1000,
            "level": str(level_for(out_width, out_height)),
            "gop_frames": video.gop,
            "audio": f"AAC {self.audio_channels} channel{'s' if self.audio_channels > 1 else ''} 48 kHz",
        }


def _number_or_text(value: str) -> int | float | str:
    """A command line's value: an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _even(value: float) -> int:
    """The nearest even integer (4:2:0 needs even sides)."""
    return 2 * round(value / 2)


def _choice(field: str, value: Any, allowed: tuple) -> None:
    if not any(type(value) is type(option) and value == option for option in allowed):
        raise OutputSettingsError(field, f"one of {', '.join(map(str, allowed))}, got {value!r}")


def _integer(field: str, value: Any, low: int, high: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OutputSettingsError(field, f"a whole number of {unit} from {low} to {high}, got {value!r}")


def _number(field: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise OutputSettingsError(field, f"a number of seconds from {low} to {high}, got {value!r}")
