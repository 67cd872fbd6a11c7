"""Streaming HuBERT features: the 3-5-2 chunking contract, frame bookkeeping and the runners."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from engine.assets import demo_audio
from engine.audio.hubert import (
    CHUNK_SAMPLES,
    FEATURE_DIM,
    OFFLINE_LEAD_ZEROS,
    AudioChunker,
    HubertFeatureStream,
    OnnxHubertRunner,
    TorchHubertRunner,
    extract_features,
    offline_chunks,
    offline_features,
    offline_frame_count,
    valid_features,
)
from engine.audio.standin_hubert import build_standin, export_standin_onnx


class RowIndexRunner:
    """Synthetic encoder: row r of every chunk's encoding is filled with the value r."""

    device = torch.device("cpu")

    def encode_batch(self, chunks: torch.Tensor) -> torch.Tensor:
        rows = (chunks.shape[1] - 400) // 320 + 1
        return torch.arange(rows, dtype=torch.float32)[None, :, None].expand(len(chunks), rows, FEATURE_DIM)

    def encode(self, chunk: torch.Tensor) -> torch.Tensor:
        return self.encode_batch(chunk)[0]


class SampleProbeRunner(RowIndexRunner):
    """Synthetic encoder: row r is filled with the chunk's first sample of that row's window (chunk[320 r])."""

    def encode_batch(self, chunks: torch.Tensor) -> torch.Tensor:
        rows = (chunks.shape[1] - 400) // 320 + 1
        return chunks[:, 0 : 320 * rows : 320, None].expand(len(chunks), rows, FEATURE_DIM).clone()


def ramp(n: int) -> np.ndarray:
    """Real sample k holds k + 1, so a probe value names the sample it came from (0 = padding)."""
    return np.arange(1, n + 1, dtype=np.float32)


def push_in_pieces(stream: HubertFeatureStream, samples: np.ndarray, sizes: list[int]) -> torch.Tensor:
    out, start, i = [], 0, 0
    while start < samples.size:
        size = sizes[i % len(sizes)]
        out.append(stream.push(samples[start : start + size]))
        start, i = start + size, i + 1
    out.append(stream.flush())
    return torch.cat(out)


@pytest.fixture(scope="module")
def standin_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_standin_onnx(tmp_path_factory.mktemp("hubert") / "hubert_standin.onnx")


def test_valid_rows_are_minus_14_to_minus_4_averaged_in_pairs() -> None:
    features = valid_features(RowIndexRunner().encode(torch.zeros(1, CHUNK_SAMPLES)))
    assert features.shape == (5, FEATURE_DIM)
    # 20 rows: rows 6..15 are valid, pairs (6,7), (8,9), ... average to 6.5, 8.5, ...
    np.testing.assert_array_equal(features[:, 0].numpy(), [6.5, 8.5, 10.5, 12.5, 14.5])
    with pytest.raises(ValueError, match="T>=14"):
        valid_features(torch.zeros(13, FEATURE_DIM))


def test_feature_of_frame_f_starts_at_real_sample_640_f() -> None:
    n = 16000 + 123
    features = extract_features(SampleProbeRunner(), ramp(n))
    frames = np.arange(len(features))
    # frame f averages the rows starting at real samples 640 f and 640 f + 320 (values +1)
    expected = 640.0 * frames + 160 + 1
    inside = 640 * frames + 320 < n
    np.testing.assert_array_equal(features[inside, 0].numpy(), expected[inside])


@pytest.mark.parametrize("n", [0, 1, 639, 640, 641, 3199, 3200, 4560, 6480, 9999, 16000, 16017])
def test_every_real_video_frame_gets_exactly_one_feature(n: int) -> None:
    stream = HubertFeatureStream(RowIndexRunner())
    features = torch.cat([stream.push(np.zeros(n, np.float32)), stream.flush()])
    assert features.shape == (-(-n // 640), FEATURE_DIM)


def test_offline_features_start_80_samples_earlier_than_streamed_ones() -> None:
    n = 16000 + 123
    features = offline_features(SampleProbeRunner(), ramp(n))
    frames = np.arange(len(features))
    # 2000 leading zeros, not 1920: frame f averages the rows starting at real samples 640 f − 80 and 640 f + 240
    expected = 640.0 * frames + 80 + 1
    inside = (frames > 0) & (640 * frames + 240 < n)
    assert OFFLINE_LEAD_ZEROS == 2000
    np.testing.assert_array_equal(features[inside, 0].numpy(), expected[inside])
    assert features[0, 0].item() == (0 + 241) / 2, "frame 0's first row starts in the leading zeros"


@pytest.mark.parametrize(
    ("n", "frames"),
    [(1, 1), (639, 1), (640, 1), (641, 2), (3200, 5), (16000, 25), (44800, 70), (44801, 71), (4480, 8), (8960, 15)],
)
def test_offline_frame_count_is_the_reference_float_ceiling(n: int, frames: int) -> None:
    # ceil(N / 640), except where N / 16000 * 25 lands just above an integer in floating point (4480, 8960, ...)
    assert offline_frame_count(n) == frames
    assert offline_features(RowIndexRunner(), np.zeros(n, np.float32)).shape == (frames, FEATURE_DIM)


def test_offline_chunks_start_where_the_reference_float_arithmetic_puts_them() -> None:
    chunks = offline_chunks(ramp(1620 * 640))
    assert chunks.shape == (324, CHUNK_SAMPLES)
    np.testing.assert_array_equal(chunks[0, :2000], 0)
    assert chunks[0, 2000] == 1 and chunks[1, 0] == 5 * 640 - 2000 + 1
    # int(1615 * 0.04 * 16000) = 1033599: the chunk of frame 1615 starts one sample early, as in the reference
    assert chunks[323, 0] == 1615 * 640 - 2000


def test_offline_features_need_a_clip() -> None:
    with pytest.raises(ValueError, match="non-empty 1-D"):
        offline_chunks(np.zeros(0, np.float32))


def test_a_hop_is_released_once_its_two_frame_look_ahead_arrives() -> None:
    stream = HubertFeatureStream(SampleProbeRunner())
    audio = ramp(20000)
    # hop j needs real samples up to 3200 j + 4560 (1920 zeros + 6480-sample chunk)
    assert stream.push(audio[:4559]).shape[0] == 0
    assert stream.push(audio[4559:4560]).shape[0] == 5
    assert stream.push(audio[4560:7759]).shape[0] == 0
    second = stream.push(audio[7759:7760])
    assert second.shape[0] == 5 and second[0, 0].item() == 640 * 5 + 161
    assert stream.push(audio[7760:]).shape[0] == 15  # hops 2..4: 3200 * 4 + 4560 <= 20000
    assert stream.chunker.frames_emitted == 25 and stream.chunker.samples_pushed == 20000
    assert stream.flush().shape[0] == 32 - 25  # ceil(20000 / 640) = 32


def test_the_chunker_says_how_many_samples_complete_a_given_number_of_chunks() -> None:
    chunker = AudioChunker()
    assert chunker.samples_for_chunks(0) == 0
    assert chunker.samples_for_chunks(2) == 7760, "the second hop's chunk ends 2 frames + 80 samples after it"
    chunker.push(np.zeros(7759, np.float32))
    assert chunker.complete_chunks == 1 and chunker.samples_for_chunks(2) == 1
    chunker.take()
    assert chunker.samples_for_chunks(1) == 1, "the chunks taken are counted no longer"
    chunker.push(np.zeros(1, np.float32))
    assert chunker.complete_chunks == 1 and chunker.samples_for_chunks(1) == 0


def test_uneven_pushes_give_the_same_features_as_one_push() -> None:
    runner = TorchHubertRunner(build_standin(seed=0))
    audio, _ = demo_audio()
    audio = audio[:24000]
    whole = extract_features(runner, audio)
    pieces = push_in_pieces(HubertFeatureStream(runner), audio, [1, 3199, 7, 6480, 640, 10000, 333])
    assert whole.shape == (38, FEATURE_DIM)
    torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-5)
    probe = SampleProbeRunner()
    assert torch.equal(
        push_in_pieces(HubertFeatureStream(probe), ramp(24000), [5, 3201, 999]), extract_features(probe, ramp(24000))
    )


def test_flush_resets_the_stream_for_the_next_utterance() -> None:
    stream = HubertFeatureStream(SampleProbeRunner())
    first = torch.cat([stream.push(ramp(9000)), stream.flush()])
    assert stream.chunker.samples_pushed == 0 and stream.chunker.frames_emitted == 0
    second = torch.cat([stream.push(ramp(9000)), stream.flush()])
    assert torch.equal(first, second)


def test_push_takes_only_1d_float32() -> None:
    stream = HubertFeatureStream(RowIndexRunner())
    with pytest.raises(TypeError, match="to_mono_16k"):
        stream.push(np.zeros(100, np.int16))
    with pytest.raises(TypeError, match="1-D float32"):
        stream.push(np.zeros((100, 2), np.float32))


def test_standin_onnx_has_the_official_signature(standin_onnx: Path) -> None:
    graph = onnx.load(str(standin_onnx)).graph
    (inp,) = graph.input
    (out,) = graph.output
    assert inp.name == "input_values" and out.name == "encoding_out"
    in_dims, out_dims = inp.type.tensor_type.shape.dim, out.type.tensor_type.shape.dim
    assert inp.type.tensor_type.elem_type == TensorProto.FLOAT
    assert in_dims[0].dim_value == 1 and in_dims[1].dim_param  # (1, N dynamic)
    assert len(out_dims) == 2 and out_dims[1].dim_value == FEATURE_DIM
    runner = OnnxHubertRunner(standin_onnx)
    for n in (3240, 6480, 12960):  # the official TensorRT profile's min / opt / max
        assert runner.encode(torch.zeros(1, n)).shape == ((n - 400) // 320 + 1, FEATURE_DIM)


def test_onnx_standin_equals_the_torch_standin(standin_onnx: Path) -> None:
    chunks = torch.from_numpy(np.random.default_rng(0).standard_normal((3, CHUNK_SAMPLES)).astype(np.float32) * 0.2)
    by_onnx = OnnxHubertRunner(standin_onnx).encode_batch(chunks)
    by_torch = TorchHubertRunner(build_standin(seed=0)).encode_batch(chunks)
    assert by_onnx.shape == by_torch.shape == (3, 20, FEATURE_DIM)
    assert ((by_onnx - by_torch).norm() / by_torch.norm()).item() < 1e-4


def test_standin_features_are_finite_spread_and_follow_the_audio() -> None:
    runner = TorchHubertRunner(build_standin(seed=0))
    speech, _ = demo_audio()
    features = extract_features(runner, speech[:16000])
    silence = extract_features(runner, np.zeros(16000, np.float32))
    assert torch.isfinite(features).all()
    assert 0.9 < features.std().item() < 1.1
    assert (features - silence).abs().mean().item() > 0.1
    assert torch.equal(build_standin(seed=0).frontend.weight, build_standin(seed=0).frontend.weight)
    assert not torch.equal(build_standin(seed=0).frontend.weight, build_standin(seed=1).frontend.weight)


def test_onnx_runner_rejects_a_file_with_other_io_names(tmp_path: Path) -> None:
    node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "other",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None])],
    )
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    with pytest.raises(ValueError, match="input_values"):
        OnnxHubertRunner(path)
    with pytest.raises(FileNotFoundError, match="hubert_streaming_fix_kv"):
        OnnxHubertRunner(tmp_path / "missing.onnx")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphed_runner_equals_eager_at_every_batch_and_runs_other_shapes_eagerly() -> None:
    runner = TorchHubertRunner(build_standin(), device="cuda")
    runner.capture((1, 4, 8))
    assert runner.buckets == (1, 4, 8)
    torch.manual_seed(0)
    for b in (1, 3, 5):
        chunks = torch.randn(b, CHUNK_SAMPLES)
        graphed = runner.encode_batch(chunks)
        runner.encode_batch(torch.zeros(8, CHUNK_SAMPLES))  # a later replay must not change an earlier result
        assert torch.allclose(graphed, runner.module(chunks.cuda()), rtol=1e-2, atol=5e-3)  # TF32 convs per batch size
    assert runner.encode_batch(torch.randn(2, CHUNK_SAMPLES + 640)).shape[0] == 2
    assert runner.encode_batch(torch.randn(9, CHUNK_SAMPLES)).shape[0] == 9


def test_a_three_frame_hop_gives_each_frame_the_same_audio_and_look_ahead_with_more_past() -> None:
    n = 16000 + 123
    faithful = extract_features(SampleProbeRunner(), ramp(n))
    stream = HubertFeatureStream(SampleProbeRunner(), current=3)
    low = torch.cat([stream.push(ramp(n)), stream.flush()])
    assert low.shape == faithful.shape == (-(-n // 640), FEATURE_DIM), "every real frame, exactly one feature"
    torch.testing.assert_close(
        low, faithful, msg="frame f still averages the rows at real samples 640 f and 640 f + 320"
    )


def test_a_three_frame_hop_is_released_after_the_same_look_ahead_in_chunks_of_the_same_size() -> None:
    stream = HubertFeatureStream(SampleProbeRunner(), current=3)
    audio = ramp(20000)
    # hop j's chunk covers 3200 zeros + real samples up to 1920 j + 3280: its 3 frames, 2 frames and 80 samples after
    assert stream.push(audio[:3279]).shape[0] == 0
    assert stream.push(audio[3279:3280]).shape[0] == 3
    assert stream.push(audio[3280:5199]).shape[0] == 0
    assert stream.push(audio[5199:5200]).shape[0] == 3
    chunks, _ = AudioChunker(3).take()
    assert chunks.shape[1] == CHUNK_SAMPLES
    with pytest.raises(ValueError, match="1 to 8 frames"):
        AudioChunker(9)


def test_features_match_between_hops_where_both_cut_the_same_chunk() -> None:
    """Both hops cut the chunk that starts 3200 samples before frame 12: frames 12-14 are the same whatever the encoder
    (elsewhere the real HuBERT, which attends over its chunk, gives a low-latency frame more past to see)."""
    runner = TorchHubertRunner(build_standin())
    audio = demo_audio()[0][:32000].astype(np.float32)
    faithful = extract_features(runner, audio)
    stream = HubertFeatureStream(runner, current=3)
    low = torch.cat([stream.push(audio), stream.flush()])
    torch.testing.assert_close(low[12:15], faithful[12:15], rtol=0, atol=0)
