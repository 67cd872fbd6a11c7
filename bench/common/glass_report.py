"""What glass_to_glass measured, made sense of: per-marker latencies on every path, their summaries and the split.

The split of a marker's latency: when the session's clock shows the speech (by construction the
same for every utterance: the model's speech depth, 485 ms at overlap 75, plus the runtime's lead,
from /metrics), the outputs' release allowance after the clock, and the rest: transport and the
player's buffer. Compute (the runtime's tick wall time) and encode times are reported beside it.
"""

from __future__ import annotations

import math

from bench.common.stats import summary
from engine.timebase import FPS
from harness.live_server import Metrics, metric
from harness.markers import Onset, pair
from harness.rtmp_read import PlayerLog
from harness.viewers import ViewerLog
from streaming.output import PLAYOUT_DELAY

RELEASE_MS = PLAYOUT_DELAY * 1000

ONSET_SLACK = 0.003
"""A detected onset can sit a few samples early (the 16->48 kHz resampler's and the codecs' pre-echo): one this close
before a frame boundary is taken to start there."""


def rest_ms(latency_ms: float, shown_ms: float, release_ms: float = RELEASE_MS) -> float:
    """What a path adds after the session's clock showed the speech and the output released it: transport + player
    buffer."""
    return latency_ms - shown_ms - release_ms


def analyse(rtmp: PlayerLog, viewers: list[ViewerLog], pushed: list[float], metrics: Metrics) -> dict:
    """Per-marker latencies on every path, their summaries, and the split of the medians."""
    markers = [{"number": n, "kind": "after idle" if n % 2 == 0 else "in speech"} for n in range(len(pushed))]
    rtmp_luma: dict[str, list[int]] = {}
    for number, picture in rtmp.pictures.items():
        rtmp_luma.setdefault(picture.luma, []).append(number)

    frame_of: dict[int, int] = {}
    for (onset, _arrived), n in _paired(rtmp.onsets, pushed):
        frame = math.floor((onset.time + ONSET_SLACK) * FPS)
        frame_of[n] = frame
        entry = markers[n]
        entry["stream_time_s"] = round(onset.time, 4)
        entry["frame"] = frame
        picture = rtmp.pictures.get(frame)
        if picture is not None:
            entry["rtmp_ms"] = round((picture.arrival - pushed[n]) * 1000, 1)

    viewer_notes: dict = {}
    for log in viewers:
        viewer_notes[log.name] = log.stats
        for (_onset, arrived), n in _paired(log.onsets, pushed):
            markers[n][f"{log.name}_audio_ms"] = round((arrived - pushed[n]) * 1000, 1)
            if log.shown:
                before = [t for t in log.shown if t <= arrived]
                if before:
                    markers[n][f"{log.name}_video_ms"] = round((before[-1] - pushed[n]) * 1000, 1)
        if log.frames:
            offset = log.frame_offset(rtmp_luma)
            viewer_notes[log.name] = {**log.stats, "rtmp_frame_offset": offset}
            if offset is not None:
                arrival = {number + offset: at for number, at, _ in log.frames}
                for n, frame in frame_of.items():
                    if frame in arrival:
                        markers[n][f"{log.name}_video_ms"] = round((arrival[frame] - pushed[n]) * 1000, 1)

    paths = {
        "rtmp_ms": "RTMP: the frame decoded by the PyAV reader",
        "chromium_audio_ms": "WebRTC, Chromium: the burst heard (WebAudio output time)",
        "chromium_video_ms": "WebRTC, Chromium: the frame on screen then (requestVideoFrameCallback)",
        "aiortc_video_ms": "WebRTC, aiortc viewer (not a browser): the frame decoded",
        "aiortc_audio_ms": "WebRTC, aiortc viewer (not a browser): the burst decoded",
    }
    compute = {q: _ms(metric(metrics, f"ditto_runtime_tick_wall_ms_{q}")) for q in ("p50", "p99")}
    encode = {
        q: _ms(metric(metrics, "ditto_encode_milliseconds", quantile=v, session="0"))
        for q, v in (("p50", "0.5"), ("p99", "0.99"))
    }
    shown = metric(metrics, "ditto_session_speech_latency_ms", session="0")
    results = {}
    for key, label in paths.items():
        values = [m[key] for m in markers if key in m]
        if not values:
            continue
        rest = [rest_ms(m[key], shown) for m in markers if key in m] if shown is not None else []
        results[key.removesuffix("_ms")] = {
            "label": label,
            **summary(values, digits=1),
            "first_push_ms": markers[0].get(key),
            "after_idle": summary([m[key] for m in markers if key in m and m["number"] % 2 == 0], digits=1),
            "in_speech": summary([m[key] for m in markers if key in m and m["number"] % 2 == 1], digits=1),
            "rest_ms": summary(rest, digits=1),
        }
    return {
        "markers_pushed": len(pushed),
        "paths": results,
        "split": {
            "shown_after_push_ms": shown,
            "shown_after_push": "push -> shown on the session's clock, by construction: speech depth (485 ms at "
            "overlap 75) "
            "+ the lead (GPU time of a hop at the load + min_lead_frames)",
            "release_ms": RELEASE_MS,
            "compute_tick_wall_ms": compute,
            "encode_ms": encode,
            "rest": "latency - shown after push - release = transport + player buffer (compute and encode happen "
            "before the release)",
        },
        "viewers": viewer_notes,
        "rtmp_reader": {
            "size": rtmp.size,
            "pictures": len(rtmp.pictures),
            "onsets": len(rtmp.onsets),
            "error": rtmp.error,
        },
        "server_metrics": {
            name: metric(metrics, f"ditto_session_{name}", session="0")
            for name in ("deadline_misses", "frames_dropped", "resyncs", "idle_hops", "frames_generated")
        }
        | {
            "rtmp_reconnects": metric(metrics, "ditto_rtmp_reconnects_total", session="0"),
            "rtmp_frames_dropped": metric(metrics, "ditto_frames_dropped_total", session="0", sink="rtmp"),
            "late_releases": metric(metrics, "ditto_deadline_misses_output_total", session="0"),
            "repeated": metric(metrics, "ditto_frames_repeated_total", session="0"),
            "skipped": metric(metrics, "ditto_frames_skipped_total", session="0"),
            "output_added_ms_at_end": metric(metrics, "ditto_output_added_latency_milliseconds", session="0"),
            "output_slack_ms_at_end": metric(metrics, "ditto_output_slack_milliseconds", session="0"),
        },
        "markers": markers,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _paired(onsets: list[tuple[Onset, float]], pushed: list[float]):
    """(onset, arrival) with its marker number, for the onsets that pair with a marker."""
    numbers = pair([o for o, _ in onsets], pushed, [at for _, at in onsets])
    return [(item, n) for item, n in zip(onsets, numbers) if n is not None]


def table(result: dict) -> str:
    """The printed summary."""
    lines = [
        f"glass-to-glass on loopback: {result['device']}, steps {result['steps']}, overlap {result['overlap']}, "
        f"encoder {result.get('encoder_chosen') or result['encoder']}, {result['markers_pushed']} markers "
        f"({result['utterances']} utterances); random weights",
    ]
    if "notice" in result:
        lines.append(result["notice"])
    lines += [
        "| path | markers | p50 ms | p99 ms | max ms | first push ms | rest p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in result["paths"].values():
        lines.append(
            f"| {path['label']} | {path['n']} | {path['p50_ms']} | {path['p99_ms']} | {path['max_ms']} | "
            f"{path['first_push_ms']} | {path['rest_ms']['p50_ms']} |"
        )
    split = result["split"]
    lines.append(
        f"split: shown on the session's clock {split['shown_after_push_ms']} ms after the push (speech depth + lead, "
        "by construction)"
        f" + release {split['release_ms']:.0f} ms + rest (transport, player buffer); computed meanwhile: tick wall "
        "p50/p99"
        f" {split['compute_tick_wall_ms']['p50']}/{split['compute_tick_wall_ms']['p99']} ms, encode p50/p99"
        f" {split['encode_ms']['p50']}/{split['encode_ms']['p99']} ms"
    )
    inbound = result["viewers"].get("chromium", {}).get("inbound", {})
    buffers = {
        kind: 1000 * s["jitterBufferDelay"] / s["jitterBufferEmittedCount"]
        for kind, s in inbound.items()
        if s.get("jitterBufferEmittedCount")
    }
    if buffers:
        lines.append(
            "Chromium jitter buffer (getStats mean): "
            + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(buffers.items()))
        )
    start = result.get("start", {})
    lines.append(
        f"start: /metrics answered {start.get('metrics_answer_s')} s after launch, first RTMP picture "
        f"{start.get('first_rtmp_picture_s')} s; "
        f"server: {result['server_metrics']}"
    )
    return "\n".join(lines)
