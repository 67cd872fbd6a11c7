"""The RTMP connection: connecting and sending never hold up the process's other threads, and failures are named."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from streaming.sinks.rtmp_io import RtmpConnection
from tests.streaming.conftest import free_port


class Ticker:
    """A thread that wakes every 2 ms and records its longest wait: how long the GIL was held from it."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.002):
            now = time.monotonic()
            self.longest = max(self.longest, now - last)
            last = now


def test_connecting_and_publishing_leave_the_other_threads_running(nginx_rtmp) -> None:
    with Ticker() as ticker:
        connection = RtmpConnection(nginx_rtmp.url("io"), timeout=5.0)
        connection.write(b"FLV\x01\x05\x00\x00\x00\x09\x00\x00\x00\x00")
        connection.close()
        connection.close()
    assert ticker.longest < 0.1, f"another thread waited {ticker.longest * 1000:.0f} ms (PyAV's own connect: 175 ms)"
    with pytest.raises(ConnectionError, match="is closed"):
        connection.write(b"\x00")


def test_a_refused_connection_is_named() -> None:
    url = f"rtmp://127.0.0.1:{free_port()}/live/nobody"
    with pytest.raises(ConnectionError, match=f"cannot publish to {url}: Connection refused"):
        RtmpConnection(url, timeout=2.0)


def test_a_server_that_never_answers_fails_after_the_timeout_without_stalling_anyone() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"rtmp://127.0.0.1:{silent.getsockname()[1]}/live/silent"
        with Ticker() as ticker:
            started = time.monotonic()
            with pytest.raises(ConnectionError, match="cannot publish"):
                RtmpConnection(url, timeout=0.5)
            waited = time.monotonic() - started
    assert 0.4 < waited < 3.0, waited
    assert ticker.longest < 0.1
