"""The output's encode cost per frame, measured at the stream's own size and preset, for admission per size."""

from __future__ import annotations

import numpy as np
import pytest

from streaming.encoders.cost import CostTable, encode_cost_ms, moving_pictures, stream_cost_ms
from streaming.output_settings import OutputSettings


def test_the_calibration_pictures_move_everywhere() -> None:
    first, second = moving_pictures(64, 36, 2)
    assert first.shape == (54, 64) and first.dtype == np.uint8
    assert (first[:36] != second[:36]).mean() > 0.9


def test_a_1080p_frame_costs_more_than_a_small_one() -> None:
    settings = OutputSettings(size="1080p", preset="ultrafast").video(1920, 1080)
    big, small = (
        min(encode_cost_ms(w, h, settings, frames=10) for _ in range(3)) for w, h in ((1920, 1080), (480, 270))
    )
    assert big > 2 * small, "each the least of three: a busy machine slows one measure, never all three"


def test_a_worker_measures_each_size_at_each_preset_once() -> None:
    table = CostTable.measure(("ultrafast", "veryfast"), sizes=((320, 180), (160, 90)), frames=5)
    assert set(table.measured) == {(w, h, p) for w, h in ((320, 180), (160, 90)) for p in ("ultrafast", "veryfast")}
    assert all(ms > 0 for ms in table.measured.values())
    assert table.ms(320, 180, "veryfast") == table.measured[320, 180, "veryfast"]


def test_an_unmeasured_size_scales_the_nearest_measured_one_by_its_pixels() -> None:
    table = CostTable({(1920, 1080, "veryfast"): 20.0, (1280, 720, "veryfast"): 9.0, (1280, 720, "ultrafast"): 4.0})
    assert table.ms(1080, 1920, "veryfast") == 20.0, "a vertical 1080p stream has 1080p's pixels"
    assert table.ms(1366, 768, "veryfast") == pytest.approx(9.0 * 1366 * 768 / (1280 * 720), abs=1e-3)
    assert table.ms(1920, 1080, "ultrafast") == pytest.approx(4.0 * 2.25)
    with pytest.raises(KeyError, match="no cost measured for preset 'medium'"):
        table.ms(1920, 1080, "medium")


def test_the_table_travels_as_json_and_back() -> None:
    table = CostTable({(1920, 1080, "veryfast"): 20.5, (512, 512, "ultrafast"): 2.9})
    assert table.to_json() == {"1920x1080 veryfast": 20.5, "512x512 ultrafast": 2.9}
    assert CostTable.from_json(table.to_json()) == table


def test_given_pictures_are_the_ones_encoded_and_must_be_the_stream_s_size() -> None:
    settings = OutputSettings(preset="ultrafast").video(320, 180)
    assert encode_cost_ms(320, 180, settings, pictures=moving_pictures(320, 180, 3)) > 0
    with pytest.raises(ValueError, match="320x180 I420 pictures"):
        encode_cost_ms(320, 180, settings, pictures=moving_pictures(160, 90, 3))


def test_a_stream_s_cost_is_one_thread_s_cpu_time_and_grows_with_size_and_preset() -> None:
    """The CPU clock of the measuring thread: what other threads and processes run meanwhile does not count in it."""
    small, large = stream_cost_ms(320, 180, "ultrafast", frames=8), stream_cost_ms(1280, 720, "ultrafast", frames=8)
    assert 0 < small < large
    assert stream_cost_ms(1280, 720, "medium", frames=8) > large
