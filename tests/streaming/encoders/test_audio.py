"""Audio from the frames' own samples: fixed blocks timed by sample count, Opus in 20 ms packets."""

from __future__ import annotations

import av
import numpy as np

from streaming.encoders.audio import OPUS_BLOCK, AudioBlocks, OpusEncoder
from streaming.frames import AUDIO_RATE, AUDIO_SAMPLES_PER_FRAME
from tests.streaming.synthetic import sound


def test_blocks_are_timed_by_sample_count_whatever_the_push_sizes() -> None:
    blocks = AudioBlocks(1024)
    rng = np.random.default_rng(0)
    signal = rng.uniform(-1, 1, 10_000).astype(np.float32)
    out, cut = [], 0
    while cut < signal.size:
        step = int(rng.integers(1, 3000))
        out += blocks.push(signal[cut : cut + step])
        cut += step
    out += blocks.flush(pad=False)
    assert [f.pts for f in out] == list(range(0, 10_000, 1024))
    assert np.array_equal(np.concatenate([f.to_ndarray()[0] for f in out]), signal)


def test_a_gap_is_kept_in_the_timeline() -> None:
    blocks = AudioBlocks(1024)
    first = blocks.push(np.ones(1500, np.float32))
    closing = blocks.skip_to(5000)
    after = blocks.push(np.ones(1024, np.float32))
    assert [f.pts for f in first + closing + after] == [0, 1024, 5000]
    assert closing[0].samples == 1024 and closing[0].to_ndarray()[0, 476:].max() == 0.0


def test_opus_gives_two_packets_per_frame_that_decode_to_the_tone() -> None:
    encoder = OpusEncoder()
    packets = [p for i in range(25) for p in encoder.encode(sound(i + 1))]
    assert len(packets) == 25 * AUDIO_SAMPLES_PER_FRAME // OPUS_BLOCK
    assert np.diff([p.pts for p in packets]).tolist() == [OPUS_BLOCK] * (len(packets) - 1)
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate, decoder.layout = AUDIO_RATE, "mono"
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for p in packets for f in decoder.decode(p)])
    spectrum = np.abs(np.fft.rfft(pcm[4800:]))
    peak_hz = np.argmax(spectrum) * AUDIO_RATE / (pcm.size - 4800)
    assert abs(peak_hz - 440) < 5
