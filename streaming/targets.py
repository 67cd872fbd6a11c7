"""Where a client may send a session's outputs: MP4 files only inside the folder the operator names, RTMP only to
``rtmp://`` and ``rtmps://`` servers, and only a few of them; SRT only to ``srt://`` servers, and only where this
process's FFmpeg can send SRT (``streaming.protocols``).

A client's MP4 target is a name relative to the operator's recordings folder, never a path of its own choosing nor an
FFmpeg URL (``file:``, ``tee:``, ``pipe:``, ...): the sink opens the file itself and hands PyAV a file object. A
recording never replaces anything: a name that exists (a file, a folder, a FIFO, a link) is refused, and the sink
creates the file exclusively, so nothing that appears between the check and the write is replaced either.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from streaming.protocols import srt_unavailable

MP4_SUFFIX = ".mp4"
MAX_NAME_BYTES = 255
"""The longest MP4 target name (UTF-8 bytes): one file name's length on the common filesystems."""
MAX_RTMP_OUTPUTS = 8
"""RTMP URLs per session at most: each is a connection and a thread in the output worker."""
MAX_URL_LENGTH = 2048
RTMP_SCHEMES = ("rtmp", "rtmps")
"""The schemes ``streaming.sinks.rtmp_io`` publishes to (FFmpeg's native RTMP client, plain and over TLS)."""
SRT_SCHEMES = ("srt",)
_URL_CHARACTERS = re.compile(r"[\x21-\x7e]+")
"""Printable ASCII without spaces: no control character (a newline forged log lines) and no FFmpeg option syntax."""


class TargetError(ValueError):
    """An output target a client may not use; the message starts with the request field it names (``rtmp``, ``mp4``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f'"{field}": {message}')
        self.field = field


def resolve_mp4_target(name: Any, root: Path) -> Path:
    """The absolute path of MP4 target ``name`` inside the recordings folder ``root``; TargetError when ``name`` is
    not a relative ``.mp4`` name, leaves ``root`` (``..``, a link out), or names something that exists."""
    if not isinstance(name, str) or not name:
        raise TargetError("mp4", f"a file name ending in {MP4_SUFFIX}, relative to the server's recordings folder")
    if not name.isprintable():
        raise TargetError("mp4", "a file name holds no control characters (nor NUL)")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise TargetError("mp4", f"a file name of at most {MAX_NAME_BYTES} bytes")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise TargetError("mp4", "a name relative to the server's recordings folder, without '..'")
    if relative.suffix != MP4_SUFFIX or relative.name == MP4_SUFFIX:
        raise TargetError("mp4", f"a file name ending in {MP4_SUFFIX}, got {name!r}")
    try:
        folder = root.resolve(strict=True)
    except OSError as exc:
        raise TargetError("mp4", f"the server's recordings folder cannot be used ({exc.strerror})") from None
    target = (folder / relative).resolve()
    if not target.is_relative_to(folder):
        raise TargetError("mp4", f"{name!r} leads out of the server's recordings folder")
    if os.path.lexists(target) or os.path.lexists(folder / relative):
        raise TargetError("mp4", f"{name!r} exists; a recording never replaces anything: choose another name")
    return target


def check_rtmp_url(url: Any) -> str:
    """``url`` if it is an ``rtmp://`` or ``rtmps://`` URL with a host, printable, at most MAX_URL_LENGTH long."""
    return _check_url(url, "rtmp", RTMP_SCHEMES, "an rtmp:// or rtmps:// URL or a list of them")


def check_srt_url(url: Any) -> str:
    """``url`` if it is an ``srt://`` URL with a host and a port, printable, at most MAX_URL_LENGTH long, and this
    process can send SRT; TargetError saying which otherwise."""
    _check_url(url, "srt", SRT_SCHEMES, "an srt://host:port URL")
    if urlsplit(url).port is None:
        raise TargetError("srt", f"an srt://host:port URL: SRT has no default port, got {url!r}")
    reason = srt_unavailable()
    if reason is not None:
        raise TargetError("srt", reason)
    return url


def _check_url(url: Any, field: str, schemes: tuple[str, ...], expected: str) -> str:
    """``url`` if it is a URL of one of ``schemes`` with a host, printable, at most MAX_URL_LENGTH long; else
    TargetError naming ``field`` (``expected``: what the field takes, when the value is no such URL at all)."""
    if not isinstance(url, str) or not url.startswith(tuple(f"{scheme}://" for scheme in schemes)):
        raise TargetError(field, expected)
    if len(url) > MAX_URL_LENGTH:
        raise TargetError(field, f"a URL of at most {MAX_URL_LENGTH} characters")
    if not _URL_CHARACTERS.fullmatch(url):
        raise TargetError(field, "a URL of printable ASCII characters, without spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as exc:
        raise TargetError(field, f"not a URL ({exc})") from None
    if not parts.hostname:
        raise TargetError(field, f"a URL with a server host, got {url!r}")
    return url


def check_rtmp_urls(value: Any) -> tuple[str, ...]:
    """A session's RTMP outputs (one URL or a list of them), each checked, at most MAX_RTMP_OUTPUTS."""
    urls = [value] if isinstance(value, str) else value
    if not isinstance(urls, list):
        raise TargetError("rtmp", "an rtmp:// or rtmps:// URL or a list of them")
    if len(urls) > MAX_RTMP_OUTPUTS:
        raise TargetError("rtmp", f"at most {MAX_RTMP_OUTPUTS} URLs per session, got {len(urls)}")
    return tuple(check_rtmp_url(url) for url in urls)
