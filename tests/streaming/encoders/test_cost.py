"""The output's encode cost per frame, measured at the stream's own size and settings for admission."""

from __future__ import annotations

import time

import numpy as np

from streaming.encoders.cost import EncodeCosts, encode_cost_ms, moving_pictures
from streaming.encoders.h264 import H264Settings
from streaming.output_settings import OutputSettings


def test_the_calibration_pictures_move_everywhere() -> None:
    first, second = moving_pictures(64, 36, 2)
    assert first.shape == (54, 64) and first.dtype == np.uint8
    assert (first[:36] != second[:36]).mean() > 0.9


def test_a_1080p_frame_costs_more_than_a_small_one() -> None:
    settings = OutputSettings(size="1080p", preset="ultrafast").video(1920, 1080)
    assert encode_cost_ms(1920, 1080, settings, frames=10) > 2 * encode_cost_ms(480, 270, settings, frames=10)


def asked(costs: EncodeCosts, width: int, height: int, settings: H264Settings) -> tuple[float, float]:
    """(the cost, seconds the question took)."""
    started = time.perf_counter()
    return costs.cost_ms(width, height, settings), time.perf_counter() - started


def test_each_size_and_settings_is_measured_once_then_remembered() -> None:
    costs = EncodeCosts(frames=10)
    fast = H264Settings(preset="ultrafast")
    first, measuring = asked(costs, 640, 360, fast)
    again, remembering = asked(costs, 640, 360, fast)
    assert again == first and remembering < measuring / 10
    assert asked(costs, 640, 360, H264Settings(preset="veryfast"))[1] > remembering * 10, "another preset: measured"
    assert asked(costs, 320, 180, fast)[1] > remembering * 10, "another size: measured"
