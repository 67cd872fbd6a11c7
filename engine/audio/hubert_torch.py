"""HuBERT-Large in PyTorch, batched on any device, with its weights read from an ONNX file's initializers.

Ditto's ``hubert_streaming_fix_kv.onnx`` runs in onnxruntime on the host, one chunk per call.
This module computes the same contract, (B, N) 16 kHz samples -> (B, T, 1024) at 50 rows/s,
so all sessions' chunks go through the GPU in one batch.

The architecture is an ASSUMPTION: the official file's internals are unknown here (it cannot be
downloaded). We take the standard HuBERT-Large as ``transformers`` builds it with the
"stable layer norm" layout: a 7-layer conv front-end (512 channels, LayerNorm + GELU each),
LayerNorm + projection to 1024, a grouped convolutional position embedding (kernel 128, 16
groups), 24 pre-norm transformer layers (16 heads, FFN 4096, exact GELU) and a final LayerNorm.
The output is the last hidden state, with no input normalisation. The loader reads
initializers under the names of a ``transformers`` export (with or without a model prefix,
with Linear weights folded into anonymous MatMul/Gemm constants, with the position conv's
weight norm folded or not); if the real file is built differently it fails with a list of
the missing, unexpected and mis-shaped weights instead of loading something else.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engine.audio.hubert import CHUNK_SAMPLES, INPUT_NAME, OUTPUT_NAME, TorchHubertRunner

if TYPE_CHECKING:
    import onnx

ONNX_OPSET = 17


@dataclass(frozen=True)
class HubertConfig:
    """Sizes of the encoder; the defaults are HuBERT-Large."""

    hidden: int = 1024
    layers: int = 24
    heads: int = 16
    ffn: int = 4096
    conv_channels: int = 512
    conv_kernels: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_strides: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    pos_kernel: int = 128
    pos_groups: int = 16
    eps: float = 1e-5


HUBERT_LARGE = HubertConfig()


class ConvLayer(nn.Module):
    """Conv1d, LayerNorm over channels, GELU: one front-end layer."""

    def __init__(self, in_channels: int, config: HubertConfig, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, config.conv_channels, kernel, stride=stride)
        self.layer_norm = nn.LayerNorm(config.conv_channels, eps=config.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.layer_norm(self.conv(x).transpose(1, 2)).transpose(1, 2))


class FeatureExtractor(nn.Module):
    """Waveform (B, N) -> conv features (B, C, T): receptive field 400 samples, hop 320."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        channels = [1] + [config.conv_channels] * (len(config.conv_kernels) - 1)
        self.conv_layers = nn.ModuleList(
            ConvLayer(c, config, k, s) for c, k, s in zip(channels, config.conv_kernels, config.conv_strides)
        )

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        x = waveform[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class FeatureProjection(nn.Module):
    """LayerNorm then Linear: conv features (B, T, C) -> (B, T, hidden)."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.conv_channels, eps=config.eps)
        self.projection = nn.Linear(config.conv_channels, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.layer_norm(x))


class PositionalConv(nn.Module):
    """Grouped Conv1d over time (even kernel: the last output row dropped), then GELU."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            config.hidden, config.hidden, config.pos_kernel, padding=config.pos_kernel // 2, groups=config.pos_groups
        )
        self.trim = 1 if config.pos_kernel % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.transpose(1, 2))
        return F.gelu(y[..., : y.shape[-1] - self.trim]).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention, no mask (every chunk has the same length)."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.q_proj = nn.Linear(config.hidden, config.hidden)
        self.k_proj = nn.Linear(config.hidden, config.hidden)
        self.v_proj = nn.Linear(config.hidden, config.hidden)
        self.out_proj = nn.Linear(config.hidden, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, rows, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, rows, self.heads, width // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, rows, width))


class FeedForward(nn.Module):
    """Linear, exact GELU, Linear."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.intermediate_dense = nn.Linear(config.hidden, config.ffn)
        self.output_dense = nn.Linear(config.ffn, config.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer: x + attention(LN(x)), then + feed_forward(LN(.))."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.layer_norm = nn.LayerNorm(config.hidden, eps=config.eps)
        self.feed_forward = FeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.hidden, eps=config.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.layer_norm(x))
        return x + self.feed_forward(self.final_layer_norm(x))


class Encoder(nn.Module):
    """Position embedding added, the transformer layers, a final LayerNorm."""

    def __init__(self, config: HubertConfig) -> None:
        super().__init__()
        self.pos_conv_embed = PositionalConv(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.layers))
        self.layer_norm = nn.LayerNorm(config.hidden, eps=config.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos_conv_embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class HubertEncoder(nn.Module):
    """Batched HuBERT: waveforms (B, N) at 16 kHz -> hidden states (B, T, hidden), T = (N − 400) // 320 + 1.

    Submodule names are those of ``transformers``' HubertModel, so state-dict keys are its parameter names.
    """

    def __init__(self, config: HubertConfig = HUBERT_LARGE) -> None:
        super().__init__()
        self.config = config
        self.feature_extractor = FeatureExtractor(config)
        self.feature_projection = FeatureProjection(config)
        self.encoder = Encoder(config)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        features = self.feature_extractor(input_values).transpose(1, 2)
        return self.encoder(self.feature_projection(features))


def random_hubert(config: HubertConfig = HUBERT_LARGE, seed: int = 0) -> HubertEncoder:
    """The encoder with deterministic random weights (every LayerNorm too, so no two weights look alike)."""
    module = HubertEncoder(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.02 * noise)
            else:
                parameter.copy_(noise / parameter[0].numel() ** 0.5)
    return module.eval()


class HubertWeightsError(ValueError):
    """The ONNX file's initializers do not fill the assumed architecture."""


WEIGHT_NORM_PAIRS = (
    ("weight_g", "weight_v"),
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
)


class _Graph:
    """Initializers of an ONNX model and the nodes that read them, for finding a parameter by its role."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.nodes = list(model.graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.used: set[str] = set()

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        self.used.add(name)
        return numpy_helper.to_array(self.initializers[name])

    def prefix(self, keys: list[str]) -> str:
        """The model prefix of the initializer names ('' for a bare HubertModel, 'hubert.' for a head model, ...)."""
        found = Counter(name[: -len(key)] for name in self.initializers for key in keys if name.endswith(key))
        return found.most_common(1)[0][0] if found else ""

    def linear_weight(self, bias: str) -> np.ndarray | None:
        """The (out, in) weight of the Linear whose bias is ``bias``: MatMul + Add, or Gemm."""
        for node in self.nodes:
            if node.op_type == "Gemm" and len(node.input) == 3 and node.input[2] == bias:
                trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
                weight = node.input[1]
                if weight in self.initializers:
                    array = self.array(weight)
                    return array if trans_b else array.T
            if node.op_type == "Add" and bias in node.input:
                other = node.input[1] if node.input[0] == bias else node.input[0]
                matmul = self.producer.get(other)
                if matmul is not None and matmul.op_type == "MatMul" and matmul.input[1] in self.initializers:
                    return self.array(matmul.input[1]).T
        return None

    def conv_weight(self, bias: str) -> np.ndarray | None:
        """The weight of the Conv whose bias is ``bias``, if it is an initializer."""
        for node in self.nodes:
            if node.op_type == "Conv" and len(node.input) == 3 and node.input[2] == bias:
                if node.input[1] in self.initializers:
                    return self.array(node.input[1])
        return None

    def weight_norm(self, stem: str) -> np.ndarray | None:
        """g · v / ‖v‖ (norm over every axis but the last, ``weight_norm(dim=2)``) from a stored (g, v) pair."""
        for g_name, v_name in WEIGHT_NORM_PAIRS:
            if stem + g_name in self.initializers and stem + v_name in self.initializers:
                g, v = self.array(stem + g_name), self.array(stem + v_name)
                return g * v / np.sqrt((v.astype(np.float64) ** 2).sum(axis=(0, 1), keepdims=True)).astype(v.dtype)
        return None


def onnx_state_dict(model: onnx.ModelProto, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The tensors for ``expected`` (state-dict key -> shape) found in the model, or HubertWeightsError saying what is
    wrong."""
    import onnx

    graph = _Graph(model)
    prefix = graph.prefix(list(expected))

    def find(key: str, shape: tuple[int, ...]) -> np.ndarray | None:
        name = prefix + key
        if name in graph.initializers:
            return graph.array(name)
        if not key.endswith(".weight"):
            return None
        stem = name[: -len("weight")]
        if (weight := graph.weight_norm(stem)) is not None:
            return weight
        if len(shape) == 3:
            return graph.conv_weight(stem + "bias")
        return graph.linear_weight(stem + "bias") if len(shape) == 2 else None

    found = {key: array for key, shape in expected.items() if (array := find(key, shape)) is not None}
    missing = [prefix + k for k in expected if k not in found]
    mismatched = [
        f"{prefix + k}: file {tuple(v.shape)}, model {expected[k]}" for k, v in found.items() if v.shape != expected[k]
    ]
    unexpected = [
        name
        for name, init in graph.initializers.items()
        if name not in graph.used
        and init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
        and int(np.prod(init.dims)) > 1
    ]
    if missing or mismatched or unexpected:
        raise HubertWeightsError(_weights_report(len(expected), missing, unexpected, mismatched))
    return {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in found.items()}


def _weights_report(total: int, missing: list[str], unexpected: list[str], mismatched: list[str]) -> str:
    lines = [
        f"the ONNX initializers do not fit the assumed HuBERT architecture ({total} tensors expected; "
        "see engine/audio/hubert_torch.py): keep the onnxruntime runner for this file"
    ]
    for title, names in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
        if names:
            shown = ", ".join(names[:12]) + (f", ... ({len(names) - 12} more)" if len(names) > 12 else "")
            lines.append(f"  {title} ({len(names)}): {shown}")
    return "\n".join(lines)


def load_hubert_onnx(path: str | Path, config: HubertConfig = HUBERT_LARGE) -> HubertEncoder:
    """Our encoder with every weight taken from the ONNX file at ``path`` (strict: all of them, nothing left over)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"HuBERT ONNX file not found: {path}")
    import onnx  # here, not at import: only the official file needs it (0.14 s of every start)

    model = onnx.load(str(path))
    module = HubertEncoder(config)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    module.load_state_dict(onnx_state_dict(model, expected), strict=True)
    return module.eval()


def load_official_hubert(
    path: str | Path, device: str | torch.device, config: HubertConfig = HUBERT_LARGE
) -> TorchHubertRunner:
    """The official streaming HuBERT ONNX's weights in our batched module on ``device``, as a HubertRunner."""
    return TorchHubertRunner(load_hubert_onnx(path, config), device=device)


class _OfficialSignature(nn.Module):
    """The encoder as the official graph: input_values (1, N) -> encoding_out (T, hidden)."""

    def __init__(self, module: HubertEncoder) -> None:
        super().__init__()
        self.module = module

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.module(input_values)[0]


def export_official_contract(module: HubertEncoder, path: str | Path, fold_constants: bool = True) -> Path:
    """Write ``module`` as ONNX with the official I/O, the way a ``transformers`` HuBERT is exported (for tests).

    As in ``transformers``, the position conv's weight is a weight norm (dim 2) of stored g and v:
    folded into one anonymous constant with ``fold_constants``, else left as g, v and the ops.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    exported = copy.deepcopy(module).eval()
    nn.utils.parametrizations.weight_norm(exported.encoder.pos_conv_embed.conv, name="weight", dim=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's deprecation notice and tracer warnings on shape arithmetic
        torch.onnx.export(
            _OfficialSignature(exported),
            (torch.zeros(1, CHUNK_SAMPLES),),
            str(path),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {1: "num_samples"}, OUTPUT_NAME: {0: "num_rows"}},
            opset_version=ONNX_OPSET,
            do_constant_folding=fold_constants,
            dynamo=False,
        )
    return path
