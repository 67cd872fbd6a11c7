"""The service's HTTP routes over sessions run in the test's own process: a test double of the front end.

The routes are the product's (``serving.http.stream_app``); only what stands behind them differs: a runtime session
(or the tests' synthetic one) and its ``SessionOutput`` in this process, where the service has its engine core and
output workers. The push, WebRTC and HTTP tests drive the routes through it without starting processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from serving.http import AsyncAudioSink, stream_app
from serving.metrics import numeric, stream_families
from streaming.frames import AudioSink
from streaming.output import SessionOutput
from streaming.sinks.webrtc import WebRtcPreview


class ThreadedAudioSink:
    """An in-process session (blocking ``push_audio``) as an ``AsyncAudioSink``: its calls run on a worker thread."""

    def __init__(self, session: AudioSink) -> None:
        self.session = session
        self.latency = session.latency.name

    async def push_audio(self, pcm: np.ndarray, sample_rate: int) -> None:
        await asyncio.to_thread(self.session.push_audio, pcm, sample_rate, None, True)

    async def update_controls(self, **changes: Any) -> dict[str, Any]:
        controls = self.session.update_controls(**changes)
        return {k: v for k, v in controls.to_dict().items() if k in changes}

    async def interrupt(self) -> int | None:
        return self.session.interrupt()

    async def end_segment(self) -> int | None:
        return await asyncio.to_thread(self.session.end_segment)

    async def end(self) -> None:
        await asyncio.to_thread(self.session.end)

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """In-process streams send no playback events (the service's output workers make them); nothing to undo."""
        return lambda: None


@dataclass
class Stream:
    """One session served in this process: its runtime session, its output and what the HTTP side offers for it."""

    name: str
    session: object
    output: SessionOutput
    preview: WebRtcPreview | None = None
    push: bool = False

    def audio_sink(self) -> AsyncAudioSink:
        return ThreadedAudioSink(self.session)

    def pushing(self) -> contextlib.AbstractContextManager[None]:
        """In-process streams outlive their pushers."""
        return contextlib.nullcontext()


def create_app(
    streams: list[Stream],
    token: str | None = None,
    notice: str = "",
    runtime_metrics: Callable[[], dict] | None = None,
    bound: tuple[str, int] | None = None,
    origins: tuple[str, ...] = (),
) -> web.Application:
    """The aiohttp application serving in-process ``streams``; ``runtime_metrics`` (the runtime's ``metrics``) adds its
    figures to /metrics; ``bound`` (host, port) is the address served, for the Host check (None: any Host);
    ``origins`` the other pages allowed to use it from a browser."""
    by_name = {s.name: s for s in streams}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamCollector(lambda: streams, runtime_metrics))
    return stream_app(lambda: by_name, token, notice, registry, bound, origins)


class StreamCollector(Collector):
    """Metric families for the in-process streams ``streams()`` returns at scrape time, and the runtime's own
    figures."""

    def __init__(self, streams: Callable[[], Sequence[Stream]], runtime: Callable[[], dict] | None = None) -> None:
        self._streams = streams
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        streams = self._streams()
        snapshots = {}
        for stream in streams:
            snapshot = stream.output.snapshot()
            snapshot["session"] = session_stats(stream.session)
            preview = getattr(stream, "preview", None)
            snapshot["viewers"] = preview.viewers if preview is not None else None
            snapshots[stream.name] = snapshot
        live = sum(not s.output.finished.is_set() for s in streams)
        yield from stream_families(snapshots, live, self._runtime() if self._runtime else None)


def session_stats(session: object) -> dict[str, float]:
    stats = getattr(session, "stats", None)
    return {} if stats is None else numeric(stats())
