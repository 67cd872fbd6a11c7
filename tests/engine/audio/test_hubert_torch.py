"""Our batched PyTorch HuBERT takes the weights of an ONNX file of the official contract and computes
what onnxruntime computes from that file; a file of another layout is refused with what is wrong.

The ONNX files here are exports of our own architecture with random weights (the official file
cannot be downloaded), in a reduced size: 2 layers, FFN 512, 64 front-end channels, position
kernel 16; the 1024-d output of the contract is kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from engine.assets import demo_audio
from engine.audio.hubert import CHUNK_SAMPLES, FEATURE_DIM, INPUT_NAME, OUTPUT_NAME, OnnxHubertRunner, extract_features
from engine.audio.hubert_torch import (
    HUBERT_LARGE,
    HubertConfig,
    HubertEncoder,
    HubertWeightsError,
    export_official_contract,
    load_hubert_onnx,
    load_official_hubert,
    random_hubert,
)
from engine.audio.standin_hubert import export_standin_onnx
from tests.compile.precision import evaluate, relative_error

SMALL = HubertConfig(layers=2, ffn=512, conv_channels=64, pos_kernel=16)


@pytest.fixture(scope="module")
def source() -> HubertEncoder:
    return random_hubert(SMALL, seed=1)


@pytest.fixture(scope="module", params=[True, False], ids=["folded", "unfolded"])
def exported(request: pytest.FixtureRequest, source: HubertEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source module exported like a transformers HuBERT: weight-norm and Linear weights folded or not."""
    return export_official_contract(source, tmp_path_factory.mktemp("hubert") / "hubert.onnx", request.param)


@pytest.fixture(scope="module")
def folded(source: HubertEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_official_contract(source, tmp_path_factory.mktemp("hubert") / "hubert_folded.onnx")


def speech_chunks(count: int, seed: int = 0) -> torch.Tensor:
    """``count`` chunks of 6480 samples cut from the bundled speech, at different offsets."""
    samples, _ = demo_audio()
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, samples.size - CHUNK_SAMPLES, count)
    return torch.from_numpy(np.stack([samples[s : s + CHUNK_SAMPLES] for s in starts]).astype(np.float32))


def test_the_default_is_hubert_large() -> None:
    assert (HUBERT_LARGE.layers, HUBERT_LARGE.hidden, HUBERT_LARGE.heads, HUBERT_LARGE.ffn) == (24, 1024, 16, 4096)
    assert (HUBERT_LARGE.conv_channels, HUBERT_LARGE.pos_kernel, HUBERT_LARGE.pos_groups) == (512, 128, 16)
    with torch.device("meta"):
        parameters = sum(p.numel() for p in HubertEncoder().parameters())
    assert 315e6 < parameters < 316e6  # 1.26 GB in fp32, against the official file's ~1.4 GB


def test_rows_come_at_50_per_second_and_batch_rows_equal_single_chunks(source: HubertEncoder) -> None:
    chunks = speech_chunks(3)
    with torch.no_grad():
        batched = source(chunks)
        single = torch.cat([source(chunk[None]) for chunk in chunks])
        assert source(torch.zeros(1, 12960)).shape == (1, (12960 - 400) // 320 + 1, FEATURE_DIM)
    assert batched.shape == (3, 20, FEATURE_DIM)
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)


def test_every_weight_is_read_back_from_the_onnx_initializers(exported: Path, source: HubertEncoder) -> None:
    loaded = load_hubert_onnx(exported, SMALL).state_dict()
    expected = source.state_dict()
    assert loaded.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(loaded[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_the_loaded_module_computes_what_onnxruntime_computes_from_the_file(exported: Path) -> None:
    """Judged against float64: ORT's float32 error is within 4x PyTorch's own float32 error (+1e-6)."""
    chunks = speech_chunks(4, seed=1)
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    onnx_rows = np.stack([session.run([OUTPUT_NAME], {INPUT_NAME: c[None].numpy()})[0] for c in chunks])
    evaluation = evaluate(load_hubert_onnx(exported, SMALL), {INPUT_NAME: chunks})
    (float32,), (exact,) = evaluation.float32, evaluation.float64
    assert onnx_rows.shape == exact.shape == (4, 20, FEATURE_DIM)
    torch_error = relative_error(float32, exact)
    assert torch_error < 1e-4
    assert relative_error(onnx_rows, exact) <= 4 * torch_error + 1e-6


def test_the_runner_drops_in_for_onnxruntime_in_the_feature_stream(folded: Path) -> None:
    samples, _ = demo_audio()
    clip = samples[:16000].astype(np.float32)
    runner = load_official_hubert(folded, "cpu", SMALL)
    ours, theirs = extract_features(runner, clip), extract_features(OnnxHubertRunner(folded), clip)
    assert ours.shape == theirs.shape == (25, FEATURE_DIM)
    assert relative_error(ours.numpy(), theirs.numpy().astype(np.float64)) < 1e-4


def test_a_file_of_another_layout_is_refused_with_what_is_wrong(folded: Path, tmp_path: Path) -> None:
    with pytest.raises(HubertWeightsError, match=r"missing \(\d+\): module\.encoder\.layers\.2\."):
        load_hubert_onnx(folded, HubertConfig(layers=3, ffn=512, conv_channels=64, pos_kernel=16))
    with pytest.raises(HubertWeightsError, match=r"shape mismatch .*intermediate_dense\.weight: file \(512, 1024\)"):
        load_hubert_onnx(folded, HubertConfig(layers=2, ffn=256, conv_channels=64, pos_kernel=16))
    model = onnx.load(str(folded))
    next(i for i in model.graph.initializer if i.name == "module.encoder.layer_norm.weight").name = "final_norm.scale"
    for node in model.graph.node:
        node.input[:] = ["final_norm.scale" if n == "module.encoder.layer_norm.weight" else n for n in node.input]
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    with pytest.raises(HubertWeightsError) as refused:
        load_hubert_onnx(renamed, SMALL)
    assert "missing (1): module.encoder.layer_norm.weight" in str(refused.value)
    assert "unexpected (1): final_norm.scale" in str(refused.value)
    with pytest.raises(HubertWeightsError, match=r"unexpected \(\d+\): .*frontend"):  # the stand-in is not HuBERT
        load_hubert_onnx(export_standin_onnx(tmp_path / "standin.onnx"), SMALL)
    with pytest.raises(FileNotFoundError, match="HuBERT ONNX file not found"):
        load_hubert_onnx(tmp_path / "absent.onnx")
