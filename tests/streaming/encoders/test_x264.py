"""Software H.264: one Annex-B access unit per frame at once, IDRs every 2 s and on request, decodable everywhere."""

from __future__ import annotations

import time

import av
import pytest
import torch

from engine.timebase import FPS
from streaming.encoders.h264 import NAL_IDR, NAL_PPS, NAL_SPS, H264Settings, KeyframeRequests, level_for, nal_types
from streaming.encoders.x264 import X264Encoder
from streaming.output_settings import RATE_CONTROLS, TUNES, OutputSettings
from tests.streaming.synthetic import picture, read_index

W, H = 128, 96


def encode(frames: int, settings: H264Settings | None = None, request_at: tuple[int, ...] = (), device: str = "cpu"):
    encoder = X264Encoder(W, H, settings)
    units = []
    for i in range(frames):
        if i in request_at:
            encoder.keyframes.request()
        out = encoder.encode(picture(i, W, H).to(device), i)
        assert [u.index for u in out] == [i], "x264 in zerolatency mode returns each frame's unit at once"
        units += out
    assert encoder.flush() == []
    return units


def test_idr_every_two_seconds_with_sps_pps_in_front() -> None:
    units = encode(3 * FPS)
    assert [u.index for u in units if u.keyframe] == [0, 2 * FPS]
    for unit in units:
        types = nal_types(unit.data)
        assert unit.data.startswith(b"\x00\x00\x00\x01") or unit.data.startswith(b"\x00\x00\x01")
        assert (NAL_IDR in types) == unit.keyframe
        if unit.keyframe:
            assert types.index(NAL_SPS) < types.index(NAL_PPS) < types.index(NAL_IDR)


def test_a_requested_keyframe_comes_on_the_next_frame_and_restarts_the_gop() -> None:
    units = encode(2 * FPS + 20, request_at=(7,))
    assert [u.index for u in units if u.keyframe] == [0, 7, 7 + 2 * FPS]


def test_the_stream_decodes_as_constrained_baseline_bt709_without_reordering() -> None:
    units = encode(30)
    decoder = av.CodecContext.create("h264", "r")
    decoded = [f for u in units for f in decoder.decode(av.Packet(u.data))]
    assert len(decoded) == 30
    assert decoder.profile == "Constrained Baseline"
    assert [read_index(f.to_ndarray(format="rgb24")) for f in decoded] == list(range(30))
    assert decoded[0].colorspace == 1 and decoded[0].color_range == 1  # BT.709, limited range in the VUI


def test_keyframe_requests_coalesce_and_are_spaced() -> None:
    requests = KeyframeRequests(min_seconds=0.5)
    assert not requests.take(0)
    requests.request()
    requests.request()
    assert requests.take(10) and not requests.take(11)
    requests.request()
    assert not requests.take(12), "too soon after the last forced IDR: deferred"
    assert requests.take(10 + FPS // 2), "...not lost"
    assert requests.forced == 2


def test_levels_follow_the_frame_size() -> None:
    assert level_for(512, 512) == 3.1
    assert level_for(1280, 720) == 3.1
    assert level_for(1920, 1080) == 4.0
    with pytest.raises(ValueError, match="beyond"):
        level_for(8192, 8192)


def test_frames_of_another_size_are_refused() -> None:
    encoder = X264Encoder(W, H)
    with pytest.raises(ValueError, match=f"{W}x{H}"):
        encoder.encode(picture(0, 64, 64), 0)
    with pytest.raises(ValueError, match="even"):
        X264Encoder(127, 96)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_frames_go_through_one_pinned_copy() -> None:
    encoder = X264Encoder(W, H)
    units = [u for i in range(5) for u in encoder.encode(picture(i, W, H).cuda(), i)]
    assert encoder._host is not None and encoder._host.is_pinned()
    decoder = av.CodecContext.create("h264", "r")
    decoded = [f for u in units for f in decoder.decode(av.Packet(u.data))]
    assert [read_index(f.to_ndarray(format="rgb24")) for f in decoded] == list(range(5))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_a_finished_frame_is_not_held_up_by_work_queued_after_it() -> None:
    encoder = X264Encoder(W, H)
    image = picture(3, W, H).cuda()
    ready = torch.cuda.Event()
    ready.record()
    torch.cuda._sleep(4_000_000_000)  # seconds of GPU work queued behind the frame, as the runtime's next hop is
    started = time.perf_counter()
    (unit,) = encoder.encode(image, 0, ready)
    waited = time.perf_counter() - started
    queue_still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert queue_still_busy, f"encode waited {waited:.2f} s for work queued after the frame"
    decoder = av.CodecContext.create("h264", "r")
    (decoded,) = decoder.decode(av.Packet(unit.data))
    assert read_index(decoded.to_ndarray(format="rgb24")) == 3


@pytest.mark.parametrize("tune", TUNES)
@pytest.mark.parametrize("rate_control", RATE_CONTROLS)
def test_every_offered_tune_and_rate_control_still_returns_each_frame_at_once(tune: str, rate_control: str) -> None:
    settings = OutputSettings(preset="veryfast", tune=tune, rate_control=rate_control, keyframe_seconds=1).video(W, H)
    units = encode(FPS + 5, settings)
    assert [u.index for u in units if u.keyframe] == [0, FPS]
    decoder = av.CodecContext.create("h264", "r")
    assert len([f for u in units for f in decoder.decode(av.Packet(u.data))]) == FPS + 5
    assert decoder.profile == "High"


def test_cbr_pads_to_the_bitrate_with_filler_data_and_capped_does_not() -> None:
    filler = 12
    for rate_control, padded in (("cbr", True), ("capped", False)):
        units = encode(3 * FPS, OutputSettings(preset="ultrafast", rate_control=rate_control).video(W, H))
        assert any(filler in nal_types(u.data) for u in units) == padded, rate_control
        kbps = sum(len(u.data) for u in units[FPS:]) * 8 / 2 / 1000  # once the VBV buffer has filled
        assert (abs(kbps - 1500) < 150) == padded, f"{rate_control}: {kbps:.0f} kbit/s at 1500 kbit/s"
