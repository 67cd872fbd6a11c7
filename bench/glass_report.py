"""What glass_to_glass measured, made sense of: per-marker latencies on every path, their summaries and the split.

The split of a marker's latency: the algorithm (by construction, from where the marker falls in
its 200 ms hop), compute (the runtime's tick wall time) and encode (the output's encode time),
both from /metrics, and the rest: release pacing, transport and the player's buffer.
"""

from __future__ import annotations

import math

from bench.live_server import Metrics, metric
from bench.markers import Onset, pair, summary
from bench.rtmp_read import PlayerLog
from bench.viewers import ViewerLog
from engine.audio.hubert import FRAME_SAMPLES, FUTURE_FRAMES, HOP_SAMPLES, SAMPLE_RATE
from engine.diffusion.windows import SEQ_FRAMES
from engine.engine import LIVE_OVERLAP
from streaming.frames import FPS

HOP = HOP_SAMPLES / SAMPLE_RATE
LOOKAHEAD = (FUTURE_FRAMES * FRAME_SAMPLES + 80) / SAMPLE_RATE
ONSET_SLACK = 0.003
"""A detected onset can sit a few samples early (the 16->48 kHz resampler's and the codecs' pre-echo): one this close
before a frame or hop boundary is taken to start there (pushes after idle land exactly on hop boundaries)."""


def algorithm_seconds(stream_time: float, overlap: int = LIVE_OVERLAP) -> float:
    """Delay the model itself puts between a sample at ``stream_time`` (s) and the final frame speaking it.

    The sample's hop must end (HuBERT encodes 200 ms hops), the next window must be sampled for
    the cross-fade (its stride, in whole hops: one at overlap 75), and the hop after needs its
    look-ahead (2 frames + 80 samples). At overlap 75 this is at most 485 ms.
    """
    hop_start = math.floor((stream_time + ONSET_SLACK) / HOP) * HOP
    stride = math.ceil((SEQ_FRAMES - overlap) / FPS / HOP - 1e-9) * HOP
    return hop_start + HOP - max(stream_time, hop_start) + stride + LOOKAHEAD


def analyse(rtmp: PlayerLog, viewers: list[ViewerLog], pushed: list[float], metrics: Metrics, overlap: int) -> dict:
    """Per-marker latencies on every path, their summaries, and the split of the medians."""
    markers = [{"number": n, "kind": "after idle" if n % 2 == 0 else "in speech"} for n in range(len(pushed))]
    rtmp_luma: dict[str, list[int]] = {}
    for number, picture in rtmp.pictures.items():
        rtmp_luma.setdefault(picture.luma, []).append(number)

    frame_of: dict[int, int] = {}
    for (onset, arrived), n in _paired(rtmp.onsets, pushed):
        frame = math.floor((onset.time + ONSET_SLACK) * FPS)
        frame_of[n] = frame
        entry = markers[n]
        entry["stream_time_s"] = round(onset.time, 4)
        entry["frame"] = frame
        entry["algorithm_ms"] = round(algorithm_seconds(onset.time, overlap) * 1000, 1)
        picture = rtmp.pictures.get(frame)
        if picture is not None:
            entry["rtmp_ms"] = round((picture.arrival - pushed[n]) * 1000, 1)

    viewer_notes: dict = {}
    for log in viewers:
        viewer_notes[log.name] = log.stats
        for (onset, arrived), n in _paired(log.onsets, pushed):
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
    encode = {q: _ms(metric(metrics, "ditto_encode_milliseconds", quantile=v, session="0")) for q, v in (("p50", "0.5"), ("p99", "0.99"))}
    fixed = (compute["p50"] or 0.0) + (encode["p50"] or 0.0)
    results = {}
    for key, label in paths.items():
        values = [m[key] / 1000 for m in markers if key in m]
        if not values:
            continue
        rest = [(m[key] - m["algorithm_ms"] - fixed) / 1000 for m in markers if key in m and "algorithm_ms" in m]
        results[key.removesuffix("_ms")] = {
            "label": label,
            **summary(values),
            "first_push_ms": markers[0].get(key),
            "after_idle": summary([m[key] / 1000 for m in markers if key in m and m["number"] % 2 == 0]),
            "in_speech": summary([m[key] / 1000 for m in markers if key in m and m["number"] % 2 == 1]),
            "rest_ms": summary(rest),
        }
    algorithm = [m["algorithm_ms"] / 1000 for m in markers if "algorithm_ms" in m]
    return {
        "markers_pushed": len(pushed),
        "paths": results,
        "split": {
            "algorithm_ms": summary(algorithm),
            "compute_tick_wall_ms": compute,
            "encode_ms": encode,
            "runtime_speech_latency_ms": metric(metrics, "ditto_session_speech_latency_ms", session="0"),
            "runtime_speech_latency": "push -> shown on the session's clock by construction: speech depth (485 ms at overlap 75) "
            "+ the lead (GPU time of a hop at the load + min_lead_frames); outputs release 10 ms after the clock shows a frame",
            "rest": "latency - algorithm - compute p50 - encode p50 = release pacing + transport + player buffer",
        },
        "viewers": viewer_notes,
        "rtmp_reader": {"size": rtmp.size, "pictures": len(rtmp.pictures), "onsets": len(rtmp.onsets), "error": rtmp.error},
        "server_metrics": {
            name: metric(metrics, f"ditto_session_{name}", session="0")
            for name in ("deadline_misses", "frames_dropped", "resyncs", "idle_hops", "frames_generated")
        }
        | {
            "rtmp_reconnects": metric(metrics, "ditto_rtmp_reconnects_total", session="0"),
            "rtmp_frames_dropped": metric(metrics, "ditto_frames_dropped_total", session="0", sink="rtmp"),
            "late_releases": metric(metrics, "ditto_deadline_misses_output_total", session="0"),
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
    lines += ["| path | markers | p50 ms | p99 ms | max ms | first push ms | rest p50 ms |", "|---|---|---|---|---|---|---|"]
    for path in result["paths"].values():
        lines.append(
            f"| {path['label']} | {path['n']} | {path['p50_ms']} | {path['p99_ms']} | {path['max_ms']} | "
            f"{path['first_push_ms']} | {path['rest_ms']['p50_ms']} |"
        )
    split = result["split"]
    lines.append(
        f"split: algorithm p50 {split['algorithm_ms']['p50_ms']} ms (max {split['algorithm_ms']['max_ms']}; by construction, <= 485 at overlap 75)"
        f" + compute (runtime tick wall) p50/p99 {split['compute_tick_wall_ms']['p50']}/{split['compute_tick_wall_ms']['p99']} ms"
        f" + encode p50/p99 {split['encode_ms']['p50']}/{split['encode_ms']['p99']} ms + rest (pacing, transport, player buffer)"
    )
    if split.get("runtime_speech_latency_ms") is not None:
        lines.append(f"runtime: speech is shown {split['runtime_speech_latency_ms']} ms after its push (depth + lead, by construction)")
    inbound = result["viewers"].get("chromium", {}).get("inbound", {})
    buffers = {
        kind: 1000 * s["jitterBufferDelay"] / s["jitterBufferEmittedCount"]
        for kind, s in inbound.items()
        if s.get("jitterBufferEmittedCount")
    }
    if buffers:
        lines.append("Chromium jitter buffer (getStats mean): " + ", ".join(f"{k} {v:.0f} ms" for k, v in sorted(buffers.items())))
    start = result.get("start", {})
    lines.append(
        f"start: /metrics answered {start.get('metrics_answer_s')} s after launch, first RTMP picture {start.get('first_rtmp_picture_s')} s; "
        f"server: {result['server_metrics']}"
    )
    return "\n".join(lines)
