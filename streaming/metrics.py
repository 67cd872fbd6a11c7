"""/metrics in Prometheus text format: read at scrape time from the sessions, their outputs and their sinks.

Components keep plain counters (no Prometheus objects threaded through the hot paths); this
collector turns them into metric families whenever /metrics is scraped. Every numeric entry
of the runtime session's ``stats()`` is exported as ``ditto_session_<key>``, and every numeric
entry of the runtime's ``metrics()`` (tick wall and GPU times, GPU busy share, capacity, ...)
as ``ditto_runtime_<key>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streaming.output import SessionOutput


class Stream(Protocol):
    """What the collector reads of one served stream."""

    name: str
    session: object
    output: SessionOutput


class StreamCollector(Collector):
    """Metric families for the streams ``streams()`` returns at scrape time, and the runtime's own figures."""

    def __init__(self, streams: Callable[[], Sequence[Stream]], runtime: Callable[[], dict] | None = None) -> None:
        self._streams = streams
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        streams = self._streams()
        sessions = GaugeMetricFamily("ditto_sessions", "Sessions being served")
        sessions.add_metric([], sum(not s.output.finished.is_set() for s in streams))
        yield sessions
        encoded = CounterMetricFamily(
            "ditto_frames_encoded", "Frames taken from the session and encoded", labels=["session", "encoder"]
        )
        released = CounterMetricFamily(
            "ditto_frames_released", "Encoded frames released to the sinks at their pts", labels=["session"]
        )
        late = CounterMetricFamily("ditto_deadline_misses_output", "Frames released more than one frame late", labels=["session"])
        encode_ms = GaugeMetricFamily(
            "ditto_encode_milliseconds", "Per-frame encode time (video + Opus), recent", labels=["session", "quantile"]
        )
        sent = CounterMetricFamily("ditto_frames_sent", "Frames sent, per sink", labels=["session", "sink"])
        dropped = CounterMetricFamily("ditto_frames_dropped", "Frames dropped, per sink", labels=["session", "sink"])
        reconnects = CounterMetricFamily(
            "ditto_rtmp_reconnects", "RTMP reconnections after a lost connection", labels=["session"]
        )
        connected = GaugeMetricFamily("ditto_rtmp_connected", "1 while the RTMP connection is up", labels=["session"])
        viewers = GaugeMetricFamily("ditto_webrtc_viewers", "WebRTC preview viewers connected", labels=["session"])
        session_stats: dict[str, GaugeMetricFamily] = {}
        for stream in streams:
            output, name = stream.output, stream.name
            encoded.add_metric([name, output.encoder.name if output.encoder else "none"], output.stats.frames_in)
            released.add_metric([name], output.stats.frames_released)
            late.add_metric([name], output.stats.late_releases)
            for q in (0.5, 0.99):
                encode_ms.add_metric([name, str(q)], output.encode_ms(q))
            for sink in output.sinks:
                stats = sink.stats()
                sent.add_metric([name, sink.name], stats.get("frames_sent", 0))
                dropped.add_metric([name, sink.name], stats.get("frames_dropped", 0))
                if "reconnects" in stats:
                    reconnects.add_metric([name], stats["reconnects"])
                    connected.add_metric([name], stats["connected"])
                if "viewers" in stats:
                    viewers.add_metric([name], stats["viewers"])
            for key, value in _session_stats(stream.session).items():
                metric = f"ditto_session_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"
                family = session_stats.setdefault(
                    metric, GaugeMetricFamily(metric, f"The runtime session's {key!r} statistic", labels=["session"])
                )
                family.add_metric([name], value)
        yield from (encoded, released, late, encode_ms, sent, dropped, reconnects, connected, viewers)
        yield from session_stats.values()
        if self._runtime is not None:
            for key, value in _numeric(self._runtime()).items():
                metric = f"ditto_runtime_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"
                family = GaugeMetricFamily(metric, f"The runtime's {key!r} figure")
                family.add_metric([], value)
                yield family


def _session_stats(session: object) -> dict[str, float]:
    stats = getattr(session, "stats", None)
    return {} if stats is None else _numeric(stats())


def _numeric(values: dict) -> dict[str, float]:
    """The entries that are numbers (None, flags and nested values are left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def metrics_registry(streams: Callable[[], Sequence[Stream]], runtime: Callable[[], dict] | None = None) -> CollectorRegistry:
    """A registry holding only the streaming collector (so several apps can live in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamCollector(streams, runtime))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text exposition format."""
    return generate_latest(registry)
