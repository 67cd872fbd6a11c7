"""FP16 graphs compute in FP16 except the FP32 islands the specs name, normalizations, and arithmetic on
shapes; they bind the spec's half I/O, stay valid ONNX, and run in onnxruntime close to FP32."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compile.fp16 import computed_types, keeps_fp32, to_mixed_fp16
from engine.plans.graphs import SPECS, GraphSpec, TensorSpec


@pytest.mark.parametrize(
    ("name", "op_type", "fp32"),
    [
        ("/warp_network/dense_motion_network/grid_sample/Mul_3", "Mul", True),
        ("/warp_network/grid_sample/Floor", "Floor", True),
        ("/warp_network/dense_motion_network/GridSample", "GridSample", True),  # opset 20 node
        ("/warp_network/dense_motion_network/Exp", "Exp", True),  # keypoint heatmaps
        ("/warp_network/dense_motion_network/Softmax", "Softmax", True),  # the motion blend
        ("/warp_network/dense_motion_network/mask/Conv", "Conv", False),  # 140 GFLOP: fp16
        ("/warp_network/dense_motion_network/hourglass/encoder/down_blocks.0/Relu", "Relu", False),
        ("/warp_network/third/conv/Conv", "Conv", False),
        ("/warp_network/Mul", "Mul", False),  # the occlusion product, outside the geometry
        ("warp_network:/warp_network/grid_sample/Floor", "Floor", True),  # inside the merged warp_decoder
    ],
)
def test_fp32_islands_are_the_warp_geometry(name: str, op_type: str, fp32: bool) -> None:
    assert keeps_fp32(name, op_type, SPECS["warp_network"]) is fp32
    assert keeps_fp32(name, op_type, SPECS["warp_decoder"]) is fp32


def test_no_node_of_other_graphs_is_an_island() -> None:
    for spec in SPECS.values():
        if spec.name not in ("warp_network", "warp_decoder"):
            assert not keeps_fp32("/decoder/G_middle_0/grid_sample/Mul", "Mul", spec)


class _Tiny(nn.Module):
    """Conv, instance norm, a nearest 2x resize, then a 'geometry' scope with a shape-derived grid."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.geometry = _Geometry()

    def forward(self, image: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        x = F.instance_norm(self.conv(image))
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.geometry(x, offset)


class _Geometry(nn.Module):
    def forward(self, x: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        ramp = torch.arange(x.shape[-1], dtype=torch.float32) / (x.shape[-1] - 1)  # from the shape, not the data
        return x * torch.exp(-((ramp - offset[:, :, None, None]) ** 2))


TINY = GraphSpec(
    "tiny",
    (),
    (TensorSpec("image", ("batch", 3, 8, 8)), TensorSpec("offset", ("batch", 1))),
    (TensorSpec("out", ("batch", 4, 16, 16)),),
    fp32_scopes=("geometry/",),
    half_io=("image", "out"),
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, nn.Module]:
    torch.manual_seed(0)
    module = _Tiny().eval()
    directory = tmp_path_factory.mktemp("tiny")
    fp32, fp16 = directory / "tiny.onnx", directory / "tiny.fp16.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's notices, as in compile.export
        torch.onnx.export(
            module,
            (torch.rand(1, 3, 8, 8), torch.rand(1, 1)),
            str(fp32),
            dynamo=False,
            opset_version=17,
            input_names=["image", "offset"],
            output_names=["out"],
            dynamic_axes={n: {0: "batch"} for n in ("image", "offset", "out")},
        )
    model = to_mixed_fp16(onnx.load(str(fp32)), lambda n: keeps_fp32(n.name, n.op_type, TINY), TINY.half_io)
    onnx.checker.check_model(model)
    onnx.save(model, str(fp16))
    return fp32, fp16, module


def test_each_node_computes_in_the_precision_its_role_asks(tiny) -> None:
    _, fp16, _ = tiny
    model = onnx.load(str(fp16))
    types = computed_types(model)
    by_op = {n.op_type: types.get(n.name) for n in model.graph.node if "/as_" not in n.name}
    assert by_op["Conv"] == "float16"
    assert by_op["InstanceNormalization"] == "float32"  # statistics stay fp32
    assert by_op["Resize"] == "float16"
    assert by_op["Exp"] == "float32"  # inside the geometry scope
    assert by_op["Range"] == "float32"  # shape arithmetic, whatever its scope
    resize = next(n for n in model.graph.node if n.op_type == "Resize")
    constants = {n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"}
    constants.update({i.name: i for i in model.graph.initializer})
    assert constants[resize.input[2]].data_type == onnx.TensorProto.FLOAT  # ONNX requires float32 scales
    dtypes = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
    half, full = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    assert dtypes == {"image": half, "offset": full, "out": half}
    assert all(i.data_type != onnx.TensorProto.FLOAT for i in model.graph.initializer if i.name.startswith("conv"))


def test_casts_sit_only_where_precision_changes(tiny) -> None:
    _, fp16, _ = tiny
    model = onnx.load(str(fp16))
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    inserted = [n for n in casts if "/as_" in n.name or n.name.endswith("/cast")]
    assert inserted and len({tuple(n.input) + tuple(a.i for a in n.attribute) for n in inserted}) == len(inserted)


def test_the_fp16_graph_runs_close_to_the_module(tiny) -> None:
    _, fp16, module = tiny
    image, offset = torch.rand(3, 3, 8, 8), torch.rand(3, 1)
    session = ort.InferenceSession(str(fp16), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"image": image.numpy().astype(np.float16), "offset": offset.numpy()})
    with torch.no_grad():
        expected = module(image.half().float(), offset).numpy()
    assert got.dtype == np.float16 and got.shape == (3, 4, 16, 16)
    error = np.abs(got.astype(np.float32) - expected).max() / np.abs(expected).max()
    assert 0 < error < 5e-3  # fp16 rounding, nothing worse


def test_a_half_io_name_the_graph_lacks_is_refused(tiny) -> None:
    fp32, _, _ = tiny
    with pytest.raises(ValueError, match=r"no graph input or output \['feature'\]"):
        to_mixed_fp16(onnx.load(str(fp32)), lambda n: False, ("feature",))
