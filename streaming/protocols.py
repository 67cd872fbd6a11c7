"""Which network protocols this process can publish to: the ones built into the FFmpeg that PyAV bundles.

PyAV's wheels bundle their own FFmpeg, and its build decides what a session may send to: RTMP and RTMPS
are in it, SRT (libsrt) is not in the wheels this project pins. The service asks once at start-up and
says so, and refuses ``srt://`` outputs with that reason instead of failing when the stream starts.
"""

from __future__ import annotations

import ctypes
import functools

from streaming.sinks.rtmp_io import ffmpeg


@functools.cache
def output_protocols() -> frozenset[str]:
    """The protocols PyAV's libavformat can write to (``avio_enum_protocols``)."""
    names, state = [], ctypes.c_void_p()
    while (name := ffmpeg().enum_protocols(ctypes.byref(state), 1)) is not None:
        names.append(name.decode())
    return frozenset(names)


def srt_unavailable() -> str | None:
    """Why ``srt://`` outputs are refused here, or None when this FFmpeg can send SRT (a line for the start-up log)."""
    if "srt" in output_protocols():
        return None
    return (
        "SRT outputs are unavailable: the FFmpeg bundled with PyAV was built without libsrt; publish to an rtmp:// "
        "or rtmps:// URL (a media server that speaks both, such as MediaMTX or SRS, can relay it as SRT)"
    )
