"""PCM normalisation: any common rate, layout and sample type becomes 16 kHz mono float32."""

from __future__ import annotations

import numpy as np
import pytest

from engine.audio.pcm import PcmError, StreamingResampler, channel_axis, check_rate, to_mono_16k
from engine.timebase import MAX_INPUT_RATE, MIN_INPUT_RATE


def sine(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_common_rates_resample_to_16k_keeping_the_tone(rate: int) -> None:
    out = to_mono_16k(sine(440.0, rate, 1.0), rate)
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.size - 16000) <= 1
    ideal = sine(440.0, 16000, 1.0)[: out.size]
    middle = slice(800, out.size - 800)  # away from the filter's edge transients
    assert np.abs(out[middle] - ideal[middle]).max() < 2e-3


def test_16k_mono_float32_passes_through_unchanged() -> None:
    x = sine(300.0, 16000, 0.25)
    assert np.array_equal(to_mono_16k(x, 16000), x)


@pytest.mark.parametrize("layout", ["frames_channels", "channels_frames"])
def test_stereo_in_either_layout_is_downmixed_by_mean(layout: str) -> None:
    left, right = sine(440.0, 48000, 0.5), sine(660.0, 48000, 0.5, amplitude=0.25)
    stereo = np.stack([left, right], axis=1 if layout == "frames_channels" else 0)
    expected = to_mono_16k((left + right) / 2, 48000)
    np.testing.assert_allclose(to_mono_16k(stereo, 48000), expected, atol=1e-6)


def test_int16_and_int32_are_scaled_to_full_scale_one() -> None:
    np.testing.assert_allclose(to_mono_16k(np.array([16384, -32768, 0], np.int16), 16000), [0.5, -1.0, 0.0])
    np.testing.assert_allclose(to_mono_16k(np.array([2**30, -(2**31)], np.int32), 16000), [0.5, -1.0])


def test_channel_axis_rule() -> None:
    assert channel_axis((1000, 2)) == 1 and channel_axis((2, 1000)) == 0
    assert channel_axis((2, 2)) == 1  # a tie means (frames, channels)
    assert channel_axis((1, 2), channels=2) == 1 and channel_axis((2, 1), channels=2) == 0
    with pytest.raises(PcmError, match="channels"):
        channel_axis((100, 20))
    with pytest.raises(PcmError, match="no axis of length 2"):
        channel_axis((5, 3), channels=2)


@pytest.mark.parametrize("bad, what", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf")])
def test_nan_and_inf_are_rejected_with_their_position(bad: float, what: str) -> None:
    x = np.zeros(100, np.float32)
    x[37] = bad
    with pytest.raises(PcmError, match=rf"{what}.*sample 37"):
        to_mono_16k(x, 16000)


def test_empty_input_is_rejected() -> None:
    with pytest.raises(PcmError, match="empty"):
        to_mono_16k(np.zeros(0, np.float32), 16000)


@pytest.mark.parametrize("rate", [0, -16000, 100, 10_000_000, 44100.5, float("nan"), "16000", True])
def test_absurd_rates_are_rejected(rate: object) -> None:
    with pytest.raises(PcmError, match="sample_rate"):
        to_mono_16k(np.zeros(10, np.float32), rate)  # type: ignore[arg-type]


def test_the_accepted_rates_are_the_timebase_bounds() -> None:
    """A file, a push and a session accept the same rates: MIN_INPUT_RATE..MAX_INPUT_RATE, both ends included."""
    for rate in (MIN_INPUT_RATE, MAX_INPUT_RATE):
        assert check_rate(rate) == rate
    for rate in (MIN_INPUT_RATE - 1, MAX_INPUT_RATE + 1):
        with pytest.raises(PcmError, match=f"outside {MIN_INPUT_RATE}..{MAX_INPUT_RATE} Hz"):
            check_rate(rate)


@pytest.mark.parametrize(
    "rate", [1e23, 2**64, 10**400, 10**5000, -(2**70)], ids=["1e23", "2^64", "10^400", "10^5000", "-2^70"]
)
def test_rates_far_out_of_range_are_refused_with_the_range(rate) -> None:
    with pytest.raises(PcmError, match=f"outside {MIN_INPUT_RATE}..{MAX_INPUT_RATE} Hz"):
        check_rate(rate)


@pytest.mark.parametrize(
    "pcm",
    [np.zeros(10, np.uint8), np.zeros(10, np.int64), np.zeros(10, np.complex64), np.zeros(10, bool), [0.0, 0.1]],
)
def test_unsupported_sample_types_are_rejected(pcm: object) -> None:
    with pytest.raises(PcmError, match="int16, int32, float32 or float64|numpy array"):
        to_mono_16k(pcm, 16000)  # type: ignore[arg-type]


def test_three_dimensional_input_is_rejected() -> None:
    with pytest.raises(PcmError, match="shape"):
        to_mono_16k(np.zeros((2, 2, 100), np.float32), 16000)


@pytest.mark.parametrize("rate, channels", [(44100, 2), (48000, 1), (22050, 2), (16000, 2)])
def test_uneven_streaming_pushes_equal_the_one_shot_resample(rate: int, channels: int) -> None:
    rng = np.random.default_rng(1)
    signal = (0.3 * rng.standard_normal((rate, channels))).astype(np.float32)
    stream = StreamingResampler(rate, channels)
    pieces, start = [], 0
    while start < len(signal):
        size = int(rng.integers(1, 2500))
        block = signal[start : start + size]
        planar = start % 2 and len(block) > channels  # square blocks are read as (frames, channels)
        pieces.append(stream.push(block.T.copy() if planar else block))
        start += size
    pieces.append(stream.flush())
    streamed = np.concatenate(pieces)
    one_shot = to_mono_16k(signal, rate)
    assert streamed.shape == one_shot.shape
    np.testing.assert_allclose(streamed, one_shot, atol=1e-6)


def test_streaming_rejects_blocks_that_do_not_match_the_channel_count() -> None:
    stream = StreamingResampler(48000, channels=2)
    with pytest.raises(PcmError, match="1-D"):
        stream.push(np.zeros(100, np.float32))
    with pytest.raises(PcmError, match="no axis of length 2"):
        stream.push(np.zeros((100, 3), np.float32))
    with pytest.raises(PcmError, match="channels"):
        StreamingResampler(48000, channels=0)


def test_streaming_flush_starts_a_fresh_stream() -> None:
    x = sine(440.0, 44100, 0.2)
    stream = StreamingResampler(44100)
    first = np.concatenate([stream.push(x), stream.flush()])
    second = np.concatenate([stream.push(x), stream.flush()])
    np.testing.assert_array_equal(first, second)
