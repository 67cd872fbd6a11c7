"""/metrics in Prometheus text format: read at scrape time from the sessions, their outputs and their sinks.

Components keep plain counters (no Prometheus objects threaded through the hot paths); the front end's
collector (``serving.http``) turns them into metric families whenever /metrics is scraped. Every numeric entry
of the runtime session's ``stats()`` is exported as ``ditto_session_<key>``, and every numeric
entry of the runtime's ``metrics()`` (tick wall and GPU times, GPU busy share, capacity, ...)
as ``ditto_runtime_<key>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def stream_families(streams: Mapping[str, Mapping], live: int, runtime: Mapping | None) -> list[Metric]:
    """The metric families of ``streams`` (name -> an output's ``snapshot()`` plus ``session``: the runtime session's
    stats and ``viewers``: WebRTC viewers), ``live`` sessions being served, and the runtime's own figures."""
    sessions = GaugeMetricFamily("ditto_sessions", "Sessions being served")
    sessions.add_metric([], live)
    return [
        sessions,
        *output_families(streams),
        *sink_families(streams),
        *session_families(streams),
        *runtime_families(runtime or {}),
    ]


def output_families(streams: Mapping[str, Mapping]) -> list[Metric]:
    """What each output did with its session's frames: encoded, released on time or late, repeated, skipped, and the
    latency and slack of its clock."""
    encoded = CounterMetricFamily(
        "ditto_frames_encoded", "Frames taken from the session and encoded", labels=["session", "encoder"]
    )
    released = CounterMetricFamily(
        "ditto_frames_released", "Encoded frames released to the sinks at their slot", labels=["session"]
    )
    late = CounterMetricFamily(
        "ditto_deadline_misses_output", "Frames released more than one frame late", labels=["session"]
    )
    repeated = CounterMetricFamily(
        "ditto_frames_repeated",
        "Output slots filled with the last picture and silence: no frame was ready (shed)",
        labels=["session"],
    )
    skipped = CounterMetricFamily(
        "ditto_frames_skipped",
        "Frames let go to catch the output clock up after a repeat, or silent ones to give added latency back",
        labels=["session"],
    )
    added = GaugeMetricFamily(
        "ditto_output_added_latency_milliseconds",
        "Latency the output adds now to show late frames instead of skipping them: a late first frame, then a slot at "
        "a time; given back a slot at a time once frames come early again",
        labels=["session"],
    )
    slack = GaugeMetricFamily(
        "ditto_output_slack_milliseconds",
        "The least time by which a frame shown in the output's last whole window was ready before its slot (a repeat: "
        "-40); the room the output has before it repeats",
        labels=["session"],
    )
    encode_ms = GaugeMetricFamily(
        "ditto_encode_milliseconds", "Per-frame encode time (video + Opus), recent", labels=["session", "quantile"]
    )
    for name, stream in streams.items():
        encoded.add_metric([name, stream.get("encoder") or "none"], stream.get("frames_in", 0))
        released.add_metric([name], stream.get("frames_released", 0))
        late.add_metric([name], stream.get("late_releases", 0))
        repeated.add_metric([name], stream.get("repeated", 0))
        skipped.add_metric([name], stream.get("skipped", 0))
        added.add_metric([name], stream.get("added_latency_ms", 0))
        if stream.get("slack_ms") is not None:
            slack.add_metric([name], stream["slack_ms"])
        for q in ("0.5", "0.99"):
            encode_ms.add_metric([name, q], stream.get(f"encode_ms_p{round(float(q) * 100)}", 0.0))
    return [encoded, released, late, repeated, skipped, added, slack, encode_ms]


def sink_families(streams: Mapping[str, Mapping]) -> list[Metric]:
    """What each output's sinks report: frames sent and dropped, the RTMP connection, the WebRTC viewers."""
    sent = CounterMetricFamily("ditto_frames_sent", "Frames sent, per sink", labels=["session", "sink"])
    dropped = CounterMetricFamily("ditto_frames_dropped", "Frames dropped, per sink", labels=["session", "sink"])
    reconnects = CounterMetricFamily(
        "ditto_rtmp_reconnects", "RTMP reconnections after a lost connection", labels=["session"]
    )
    connected = GaugeMetricFamily("ditto_rtmp_connected", "1 while the RTMP connection is up", labels=["session"])
    viewers = GaugeMetricFamily("ditto_webrtc_viewers", "WebRTC preview viewers connected", labels=["session"])
    for name, stream in streams.items():
        for sink, stats in stream.get("sinks", {}).items():
            if "frames_sent" in stats:  # not the playback events, which send no frames
                sent.add_metric([name, sink], stats["frames_sent"])
                dropped.add_metric([name, sink], stats.get("frames_dropped", 0))
            if "reconnects" in stats:
                reconnects.add_metric([name], stats["reconnects"])
                connected.add_metric([name], stats["connected"])
        if stream.get("viewers") is not None:
            viewers.add_metric([name], stream["viewers"])
    return [sent, dropped, reconnects, connected, viewers]


def session_families(streams: Mapping[str, Mapping]) -> list[Metric]:
    """Every numeric entry of the runtime sessions' ``stats()`` as ``ditto_session_<key>``, labelled by session."""
    families: dict[str, GaugeMetricFamily] = {}
    for name, stream in streams.items():
        for key, value in numeric(stream.get("session", {})).items():
            metric = f"ditto_session_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}"
            family = families.setdefault(
                metric, GaugeMetricFamily(metric, f"The runtime session's {key!r} statistic", labels=["session"])
            )
            family.add_metric([name], value)
    return list(families.values())


def runtime_families(runtime: Mapping) -> list[Metric]:
    """Every numeric entry of the runtime's ``metrics()`` as ``ditto_runtime_<key>``."""
    families: list[Metric] = []
    for key, value in numeric(runtime).items():
        family = GaugeMetricFamily(
            f"ditto_runtime_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}", f"The runtime's {key!r} figure"
        )
        family.add_metric([], value)
        families.append(family)
    return families


def numeric(values: dict) -> dict[str, float]:
    """The entries that are numbers (None, flags and nested values are left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text exposition format."""
    return generate_latest(registry)
