"""Many RTMP streams read back, made sense of: each stream's frames, rate, drift, gaps and A/V offset, the server's
counters for it, and the speech pushed into it on loop (bench.rtmp_sessions and bench.service)."""

from __future__ import annotations

import asyncio

import numpy as np

from engine.timebase import FPS
from harness.live_server import metric
from harness.push import Pusher
from harness.rtmp_read import PacketLog

CHUNK_SECONDS = 0.2
"""Seconds of speech per WebSocket message of the feed."""
EDGE_SECONDS = 10.0
"""Drift and A/V change compare the first and the last this many seconds of a stream (a third of it when shorter)."""
SETTLE = 2.0
"""The window starts this long after the last stream's first frame: frames queued while connecting arrive at once."""


def stream_report(log: PacketLog, start: float, end: float) -> dict:
    """Frames, rate, drift, timestamp gaps and A/V offset of one stream's packets that arrived in [start, end]."""
    video = [(pts, at) for pts, at in log.video if start <= at <= end]
    if len(video) < 2:
        return {"frames": len(video), "read_end": log.error}
    pts = np.array([p for p, _ in video])
    at = np.array([a for _, a in video])
    lag = (at - at[0]) - (pts - pts[0])
    edge = min(EDGE_SECONDS, (at[-1] - at[0]) / 3)
    first, last = lag[at <= at[0] + edge], lag[at >= at[-1] - edge]
    steps = np.round(np.diff(pts) * FPS).astype(int)
    audio = [(end_pts, a) for end_pts, a in log.audio_end if start <= a <= end]
    offsets, offset_at = [], []
    k = 0
    for frame_pts, arrived in video:
        while k + 1 < len(audio) and audio[k + 1][1] <= arrived:
            k += 1
        if audio and audio[k][1] <= arrived:
            offsets.append(audio[k][0] - (frame_pts + 1 / FPS))
            offset_at.append(arrived)
    offsets_ms, offset_at = np.array(offsets) * 1000, np.array(offset_at)
    minutes = (at[-1] - at[0]) / 60
    return {
        "frames": len(video),
        "seconds": round(float(at[-1] - at[0]), 2),
        "fps": round((len(video) - 1) / float(at[-1] - at[0]), 3),
        "timeline_fps": round((len(video) - 1) / float(pts[-1] - pts[0]), 3) if pts[-1] > pts[0] else None,
        "drift_ms": round(float(np.median(last) - np.median(first)) * 1000, 1),
        "drift_slope_ms_per_min": round(float(np.polyfit((at - at[0]) / 60, lag, 1)[0]) * 1000, 2)
        if minutes * 60 >= 2 * EDGE_SECONDS
        else None,
        "lag_spread_ms": round(float(np.percentile(lag, 99) - np.percentile(lag, 1)) * 1000, 1),
        "timestamp_gaps": int(np.sum(steps != 1)),
        "frames_missing": int(np.sum(np.clip(steps - 1, 0, None))),
        **_offsets(offsets_ms, offset_at, edge),
        "read_end": log.error,
    }


def server_counters(metrics: dict, session: str) -> dict:
    """One stream's counters from the server's /metrics: shed and skipped slots, deadline misses, drops, resyncs,
    late releases, reconnects, encode time; the speech latency its session has by construction (push -> shown on its
    clock) and the latency its output added to show late frames (the rest of a glass-to-glass figure is transport)."""
    return {
        "repeated": metric(metrics, "ditto_frames_repeated_total", session=session),
        "skipped": metric(metrics, "ditto_frames_skipped_total", session=session),
        "released": metric(metrics, "ditto_frames_released_total", session=session),
        "deadline_misses": metric(metrics, "ditto_session_deadline_misses", session=session),
        "frames_dropped": metric(metrics, "ditto_session_frames_dropped", session=session),
        "resyncs": metric(metrics, "ditto_session_resyncs", session=session),
        "rtmp_dropped": metric(metrics, "ditto_frames_dropped_total", session=session, sink="rtmp"),
        "late_releases": metric(metrics, "ditto_deadline_misses_output_total", session=session),
        "reconnects": metric(metrics, "ditto_rtmp_reconnects_total", session=session),
        "encode_ms_p99": metric(metrics, "ditto_encode_milliseconds", quantile="0.99", session=session),
        "speech_latency_ms": metric(metrics, "ditto_session_speech_latency_ms", session=session),
        "output_added_ms": metric(metrics, "ditto_output_added_latency_milliseconds", session=session),
        "output_slack_ms": metric(metrics, "ditto_output_slack_milliseconds", session=session),
    }


def _offsets(offsets_ms: np.ndarray, at: np.ndarray, edge: float) -> dict:
    """The A/V offset's median, range, and change from the first ``edge`` seconds to the last."""
    if not offsets_ms.size:
        return {"av_offset_ms": None}
    first, last = offsets_ms[at <= at[0] + edge], offsets_ms[at >= at[-1] - edge]
    return {
        "av_offset_ms": round(float(np.median(offsets_ms)), 1),
        "av_offset_range_ms": [round(float(offsets_ms.min()), 1), round(float(offsets_ms.max()), 1)],
        "av_offset_change_ms": round(float(np.median(last) - np.median(first)), 1),
    }


async def feed(
    port: int, session: int, speech: np.ndarray, rate: int, stop: asyncio.Event, url: str | None = None
) -> str | None:
    """Push the clip on loop into one session until ``stop`` (at ``url``, the session's ``urls.push``, when the server
    on ``port`` is not the one that holds it: a cluster's proxy); the push errors the server reported, if any."""
    url = url or f"ws://127.0.0.1:{port}/push?session={session}"
    async with Pusher(url, rate, round(CHUNK_SECONDS * rate)) as pusher:
        while not stop.is_set():
            await pusher.play(speech)
        return "; ".join(pusher.errors) or None
