"""A stand-in for Ditto's streaming HuBERT encoder, for tests and the demo. It is NOT HuBERT.

The official ``hubert_streaming_fix_kv.onnx`` (about 1.4 GB) cannot be obtained on the
project's build machines, so this small deterministic network fills its place: it has the
same front-end geometry (receptive field 400 samples, hop 320, so 20 rows for a 6480-sample
chunk), 1024-d rows normalised to std 1, and exports to ONNX with exactly the official
signature. Its features carry no speech meaning; pictures driven by them are meaningless.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.audio.hubert import CHUNK_SAMPLES, FEATURE_DIM, INPUT_NAME, OUTPUT_NAME

RECEPTIVE_FIELD = 400
STRIDE = 320
WIDTH = 256
ONNX_OPSET = 17


class StandInHubert(nn.Module):
    """Not HuBERT: strided conv front-end, one residual temporal conv, projection to 1024, layer norm.

    Maps a batch of 16 kHz waveforms (B, N) to (B, T, 1024), T = (N - 400) // 320 + 1.
    """

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.frontend = nn.Conv1d(1, width, RECEPTIVE_FIELD, stride=STRIDE)
        self.mix = nn.Conv1d(width, width, 3, padding=1)
        self.proj = nn.Linear(width, FEATURE_DIM)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(self.frontend(input_values.unsqueeze(1)))
        hidden = hidden + F.gelu(self.mix(hidden))
        return F.layer_norm(self.proj(hidden.transpose(1, 2)), (FEATURE_DIM,))


class _OfficialSignature(nn.Module):
    """Wraps the stand-in as the official graph: input_values (1, N) -> encoding_out (T, 1024)."""

    def __init__(self, net: StandInHubert) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.net(input_values)[0]


def build_standin(seed: int = 0) -> StandInHubert:
    """The stand-in with deterministic weights drawn from ``seed`` (same on every machine), in eval mode."""
    net = StandInHubert()
    gen = torch.Generator().manual_seed(seed)
    # Front-end gain 3/sqrt(fan_in) puts speech at ~0.1-0.2 rms in GELU's curved range.
    gains = {"frontend": 3.0, "mix": 1.0, "proj": 1.0}
    with torch.no_grad():
        for name, layer in (("frontend", net.frontend), ("mix", net.mix), ("proj", net.proj)):
            fan_in = layer.weight[0].numel()
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * (gains[name] / math.sqrt(fan_in)))
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    return net.eval()


def export_standin_onnx(path: str | Path, seed: int = 0) -> Path:
    """Write the stand-in as ONNX with the official I/O: ``input_values`` (1, N dynamic) -> ``encoding_out`` (T,
    1024)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(1, CHUNK_SAMPLES)
    with warnings.catch_warnings():
        # The default (dynamo) exporter needs onnxscript, which the engine does not depend on.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            _OfficialSignature(build_standin(seed)),
            (example,),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {1: "num_samples"}, OUTPUT_NAME: {0: "num_rows"}},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    return path
