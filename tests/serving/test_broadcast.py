"""Broadcast outputs through the service: a session's ``output`` settings reach its encoder and muxer.

The core runs the synthetic runtime (``anchor1080``: 1920x1080 frames); a session's stream is read back from its MP4
with PyAV, as an ingest would see it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import av
import pytest

from engine.timebase import FPS
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
            assert (await http.delete(f"{base}/sessions/{body['id']}")).status == 200
            return body

    body = asyncio.run(scenario())
    shown = body["output"]
    assert body["size"] == [1920, 1080] and (shown["width"], shown["height"]) == (1920, 1080)
    resolved = (shown["bitrate_kbps"], shown["buffer_kbits"], shown["level"], shown["gop_frames"])
    assert resolved == (4000, 4000, "4.0", 50), "the level for 1080p25, a one-second VBV, a 2 s GOP"
    assert shown["preset"] == "ultrafast", "GET shows the settings in force"
    with av.open(str(tmp_path / "a.mp4")) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.codec_context.width, video.codec_context.height) == (1920, 1080)
        assert video.codec_context.profile == "High"
        assert (audio.codec_context.name, audio.codec_context.sample_rate, audio.codec_context.channels) == (
            "aac", 48000, 2,
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
