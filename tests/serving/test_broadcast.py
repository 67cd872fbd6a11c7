"""Broadcast outputs through the service: a session's ``output`` settings reach its encoder and muxer, a bad one is a
400 naming it, and admission counts each stream at its size and preset, as measured by an output worker.

The core runs the synthetic runtime (``anchor1080``: 1920x1080 frames); a session's stream is read back from its MP4
with PyAV, as an ingest would see it.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import av
import pytest

from engine.timebase import FPS
from serving.live_cost import FLOOR
from serving.output_budget import FRAME_MS, UTILIZATION
from tests.serving.test_service import _more, running, until

pytestmark = pytest.mark.slow
SECONDS = 20
"""Media seconds the bitrate is measured over."""


def test_a_1080p_session_streams_h264_high_at_its_bitrate_in_closed_2_s_gops(tmp_path: Path) -> None:
    output = {"size": "1080p", "bitrate_kbps": 4000, "preset": "ultrafast", "keyframe_seconds": 2}

    async def scenario() -> dict:
        async with running(workers=1, recordings=tmp_path) as (service, http, base):
            made = await http.post(f"{base}/sessions", json={"avatar": "anchor1080", "mp4": "a.mp4", "output": output})
            assert made.status == 201, await made.text()
            body = await made.json()
            await until(lambda: _more(http, base, body["id"], SECONDS * FPS + FPS // 2), seconds=SECONDS + 20)
            listing = await (await http.get(f"{base}/sessions")).json()
            assert (await http.delete(f"{base}/sessions/{body['id']}")).status == 200
            _admission_counts_what_the_stream_measured(listing, body["output"]["cost_ms"])
            return body

    body = asyncio.run(scenario())
    shown = body["output"]
    assert body["size"] == [1920, 1080] and (shown["width"], shown["height"]) == (1920, 1080)
    resolved = (shown["bitrate_kbps"], shown["buffer_kbits"], shown["level"], shown["gop_frames"])
    assert resolved == (4000, 4000, "4.0", 50), "the level for 1080p25, a one-second VBV, a 2 s GOP"
    assert shown["preset"] == "ultrafast" and shown["cost_ms"] > 0, "GET shows the settings in force and their cost"
    with av.open(str(tmp_path / "a.mp4")) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.codec_context.width, video.codec_context.height) == (1920, 1080)
        assert video.codec_context.profile == "High"
        assert (audio.codec_context.name, audio.codec_context.sample_rate, audio.codec_context.channels) == (
            "aac",
            48000,
            2,
        ), "stereo AAC at 48 kHz by default"
        sizes, keys = [], []
        for packet in container.demux(video):
            if packet.size:
                keys += [len(sizes)] if packet.is_keyframe else []
                sizes.append(packet.size)
    assert len(sizes) >= SECONDS * FPS
    assert keys[0] == 0 and {b - a for a, b in zip(keys, keys[1:])} == {2 * FPS}, f"an IDR every 2 s exactly: {keys}"
    kbps = sum(sizes[: SECONDS * FPS]) * 8 / SECONDS / 1000
    assert abs(kbps - 4000) <= 400, f"{kbps:.0f} kbit/s over {SECONDS} s for a 4000 kbit/s CBR stream"


def _admission_counts_what_the_stream_measured(listing: dict, cost: float) -> None:
    """After seconds of a live stream, admission counts it at the measured share of its calibrated cost."""
    share, budget = listing["encoding"]["measured_share"], UTILIZATION * FRAME_MS
    assert share is not None and share >= FLOOR, listing["encoding"]
    assert abs(listing["encoding"]["live_ms"] - cost * share) <= 0.1 + cost * 0.001, listing["encoding"]
    held = {math.floor(budget / (cost * (share + d)) + 1e-9) for d in (-0.0005, 0.0005)}
    assert listing["capacity"]["outputs"] in held, (listing["capacity"], held)


def test_bad_output_settings_are_a_400_naming_them_and_admission_counts_each_stream_at_its_cost(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(workers=1, recordings=tmp_path) as (service, http, base):
            for body, text in [
                ({"avatar": "anna", "output": {"preset": "placebo"}}, '"output.preset": one of ultrafast'),
                ({"avatar": "anna", "output": {"bitrate_kbps": 50_000}}, '"output.bitrate_kbps": a whole number'),
                ({"avatar": "anna", "output": {"bitrate": 6000}}, '"output.bitrate": unknown setting'),
                ({"avatar": "anna", "output": "720p"}, '"output": an object of output settings'),
                ({"avatar": "anna", "output": {"size": "1080p"}}, '"output.size": 1080p is larger than the avatar'),
                (
                    {
                        "avatar": "anchor1080",
                        "output": {"size": "720p", "profile": "main", "bitrate_kbps": 8000, "buffer_kbits": 16000},
                    },
                    '"output.buffer_kbits": 16000 kbit is over H.264 level 3.1',
                ),
                ({"avatar": "anna", "srt": "srt://ingest.example:9000"}, '"srt": '),
            ]:
                response = await http.post(f"{base}/sessions", json=body)
                error = (await response.json())["error"]
                assert response.status == 400 and text in error, (body, response.status, error)

            scaled = await http.post(
                f"{base}/sessions", json={"avatar": "anchor1080", "mp4": "s.mp4", "output": {"size": "540p"}}
            )
            assert scaled.status == 201, await scaled.text()
            small = await scaled.json()
            assert small["size"] == [960, 540] and small["output"]["bitrate_kbps"] == 2000, "540p's defaults"
            cost = small["output"]["cost_ms"]
            listing = await (await http.get(f"{base}/sessions")).json()
            encoding, capacity = listing["encoding"], listing["capacity"]
            budget = UTILIZATION * FRAME_MS
            assert encoding["budget_ms"] == round(budget, 1) and encoding["live_ms"] == round(cost, 1)
            assert encoding["costs"]["960x540 veryfast"] == cost
            assert capacity["outputs"] == 1 + math.floor((budget - cost) / cost), "the rest counted at the live cost"

            dear = await http.post(f"{base}/sessions", json={"avatar": "anchor1080", "output": {"preset": "medium"}})
            listing = await (await http.get(f"{base}/sessions")).json()
            medium = listing["encoding"]["costs"]["1920x1080 medium"]
            if cost + medium > budget:
                text = await dear.text()
                assert dear.status == 503, text
                assert f"a 1920x1080 medium stream costs {medium:.1f} ms of a core per frame" in text
                assert f"1 live session(s) take {cost:.1f} of the {budget:.1f} ms" in text
            else:  # a core fast enough for both: the budget holds them, and admission says so
                assert dear.status == 201, await dear.text()
            await until(lambda: _more(http, base, small["id"], 5))
            assert (await http.delete(f"{base}/sessions/{small['id']}")).status == 200
        with av.open(str(tmp_path / "s.mp4")) as container:
            video = container.streams.video[0]
            assert (video.codec_context.width, video.codec_context.height) == (960, 540)

    asyncio.run(scenario())
