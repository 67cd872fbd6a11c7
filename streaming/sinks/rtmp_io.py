"""An RTMP connection through FFmpeg's own RTMP client, the libavformat PyAV loaded, called without holding the GIL.

PyAV opens an output URL, and writes its header, holding the GIL: an RTMP connect (TCP, handshake, publish; 175 ms
on loopback, several round trips to a real server) froze every thread of the process, so each stream that started or
reconnected stalled every other stream of its output worker (and made the first frames of a stream late). Here the
connection is opened and written with ``avio_open2``/``avio_write`` through ctypes, which releases the GIL for each
call, with TCP_NODELAY (the handshake's small writes waited on delayed ACKs: 175 -> 44 ms on loopback) and an I/O
timeout (a server that vanishes without closing the connection fails the write instead of blocking until TCP gives
up). PyAV muxes FLV into it as into a file object; FFmpeg's RTMP client turns the FLV tags into RTMP messages.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import av  # loads the libavformat and libavutil this module calls into

AVIO_FLAG_WRITE = 2


class _AVIOContext(ctypes.Structure):
    """The leading public fields of FFmpeg's ``AVIOContext`` (avio.h), up to ``error``: unchanged since FFmpeg 4."""

    _fields_ = [
        ("av_class", ctypes.c_void_p),
        ("buffer", ctypes.c_void_p),
        ("buffer_size", ctypes.c_int),
        ("buf_ptr", ctypes.c_void_p),
        ("buf_end", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("read_packet", ctypes.c_void_p),
        ("write_packet", ctypes.c_void_p),
        ("seek", ctypes.c_void_p),
        ("pos", ctypes.c_int64),
        ("eof_reached", ctypes.c_int),
        ("error", ctypes.c_int),
    ]


class _FFmpeg:
    """The few libavformat and libavutil functions used here (and by ``streaming.protocols``), with their C
    signatures."""

    def __init__(self) -> None:
        fmt, util = _loaded("avformat"), _loaded("avutil")
        pointer = ctypes.POINTER(ctypes.c_void_p)
        self.open = _function(
            fmt.avio_open2, ctypes.c_int, pointer, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, pointer
        )
        self.write = _function(fmt.avio_write, None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
        self.flush = _function(fmt.avio_flush, None, ctypes.c_void_p)
        self.close = _function(fmt.avio_closep, ctypes.c_int, pointer)
        self.enum_protocols = _function(fmt.avio_enum_protocols, ctypes.c_char_p, pointer, ctypes.c_int)
        self.dict_set = _function(
            util.av_dict_set, ctypes.c_int, pointer, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int
        )
        self.dict_free = _function(util.av_dict_free, None, pointer)
        self.strerror = _function(util.av_strerror, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)

    def error_text(self, code: int) -> str:
        text = ctypes.create_string_buffer(128)
        self.strerror(code, text, len(text))
        return text.value.decode(errors="replace")


def _loaded(name: str) -> ctypes.CDLL:
    """The lib``name`` shared library already mapped into this process that PyAV links: the one its wheel bundles
    (``av.libs``) before any other (another package may map an FFmpeg of its own), else the system's."""
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/" in line}
    found = sorted(path for path in mapped if Path(path).name.startswith(f"lib{name}") and ".so" in Path(path).name)
    bundled = str(Path(av.__file__).resolve().parent.parent / "av.libs")
    found.sort(key=lambda path: not path.startswith(bundled))
    if not found:
        raise OSError(f"lib{name} is not loaded: PyAV's FFmpeg libraries were not found in this process")
    return ctypes.CDLL(found[0])


def _function(symbol, restype, *argtypes):  # noqa: ANN001, ANN202 (ctypes symbols are untyped)
    symbol.restype, symbol.argtypes = restype, list(argtypes)
    return symbol


@functools.cache
def ffmpeg() -> _FFmpeg:
    """The FFmpeg functions, bound once per process."""
    return _FFmpeg()


class RtmpConnection:
    """A publishing RTMP connection (``rtmp://`` or ``rtmps://``), opened at construction; a file object PyAV writes
    FLV into. ``timeout``: seconds any network read or write (the connect included) may block before it fails."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        lib = ffmpeg()
        options = ctypes.c_void_p()
        lib.dict_set(ctypes.byref(options), b"tcp_nodelay", b"1", 0)
        lib.dict_set(ctypes.byref(options), b"rw_timeout", str(round(timeout * 1e6)).encode(), 0)
        self._context = ctypes.c_void_p()
        try:
            code = lib.open(ctypes.byref(self._context), url.encode(), AVIO_FLAG_WRITE, None, ctypes.byref(options))
        finally:
            lib.dict_free(ctypes.byref(options))
        if code < 0:
            raise ConnectionError(f"cannot publish to {url}: {lib.error_text(code)}")

    def write(self, data: bytes) -> int:
        """Send ``data`` (FLV) now; ConnectionError when the connection failed."""
        if not self._context:
            raise ConnectionError(f"the connection to {self.url} is closed")
        lib = ffmpeg()
        lib.write(self._context, bytes(data), len(data))
        lib.flush(self._context)
        error = ctypes.cast(self._context, ctypes.POINTER(_AVIOContext)).contents.error
        if error < 0:
            raise ConnectionError(f"lost {self.url}: {lib.error_text(error)}")
        return len(data)

    def close(self) -> None:
        """End the stream and close the connection (idempotent)."""
        if self._context:
            ffmpeg().close(ctypes.byref(self._context))
