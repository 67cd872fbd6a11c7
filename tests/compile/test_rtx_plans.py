"""Real TensorRT-RTX plans for sm_89 and sm_120, built here without a GPU: their manifest, the I/O
contract the backend expects, their headers, ``--check``, and the backend's refusal before loading."""

from __future__ import annotations

import json
import re

import pytest
import torch

from compile.build_plans import main
from compile.onnx_parity import FP16_TOLERANCE
from compile.plan_check import header_verdict
from engine.backends.base import BackendError
from engine.backends.tensorrt_backend import PlanIO, TensorRTBackend, check_contract, select_plans
from engine.buckets import RENDER_BUCKETS, WINDOW_BUCKETS
from engine.plans.graphs import BATCH, LMDM_BATCH, RENDER_BATCH, SPECS
from engine.plans.libraries import RTX, installed_builders
from engine.plans.manifest import file_sha256, read_manifest
from engine.plans.targets import GpuInfo
from tests.compile.conftest import RTX_PLANS, RTX_TARGETS, run_build

pytestmark = pytest.mark.slow  # the FP16 graphs' proof and three builds take about a minute on 2 cores

PRECISION = {"decoder": "fp16", "warp_network": "fp16", "lmdm": "fp32"}
H200 = GpuInfo(0, "NVIDIA H200", 9, 0)
RTX_4090 = GpuInfo(0, "NVIDIA GeForce RTX 4090", 8, 9)


def test_the_manifest_records_builder_targets_hashes_precisions_and_profiles(rtx_build) -> None:
    import tensorrt_rtx

    manifest = read_manifest(rtx_build.plan_dir)
    onnx = read_manifest(rtx_build.out / "onnx")
    assert rtx_build.plan_dir.name == f"rtx{tensorrt_rtx.__version__}"
    assert (manifest.kind, manifest.builder, manifest.builder_version) == ("plans", RTX, tensorrt_rtx.__version__)
    assert manifest.compute_capabilities == list(RTX_TARGETS) and manifest.gpu_name is None
    assert manifest.build_flags["tf32"] is False and manifest.build_flags["strongly_typed"] is True
    assert sorted(manifest.graphs) == sorted(RTX_PLANS)
    for name, entry in manifest.graphs.items():
        plan = rtx_build.plan_dir / entry.file
        assert entry.sha256 == file_sha256(plan) and plan.stat().st_size > 50e6  # the weights are inside
        assert entry.precision == PRECISION[name]
        source = onnx.graphs[name + ".fp16" if entry.precision == "fp16" else name]
        assert entry.onnx_sha256 == source.sha256 == file_sha256(rtx_build.out / "onnx" / source.file)
        checkpoint = next(iter(entry.checkpoints))
        assert entry.checkpoints == {checkpoint: file_sha256(rtx_build.checkpoints / checkpoint)}
    assert manifest.graphs["warp_network"].profiles["feature_3d"] == [[b, 32, 16, 64, 64] for b in RENDER_BATCH]
    assert manifest.graphs["lmdm"].profiles["time_cond"] == [[b] for b in LMDM_BATCH]
    json.loads((rtx_build.plan_dir / "manifest.json").read_text())  # plain JSON, nothing else


def test_profiles_cover_every_runtime_bucket() -> None:
    for name, buckets in (("decoder", RENDER_BUCKETS), ("warp_network", RENDER_BUCKETS), ("lmdm", WINDOW_BUCKETS)):
        low, opt, high = SPECS[name].ranges["batch"]
        assert low <= min(buckets) and high == max(buckets) and opt in buckets


def test_fp16_graphs_were_proven_against_pytorch_before_building(rtx_build) -> None:
    proofs = re.findall(r"\[fp16 \d/2\] (\w+): wrote .*?relative error (\w+) ([\d.e+-]+)", rtx_build.log)
    assert {name for name, _, _ in proofs} == {"decoder", "warp_network"}
    assert all(float(error) <= FP16_TOLERANCE for _, _, error in proofs)
    assert rtx_build.log.index("proving it against PyTorch") < rtx_build.log.index("[plan 1/3]")
    onnx = read_manifest(rtx_build.out / "onnx")
    for name in ("decoder", "warp_network"):
        assert onnx.graphs[name + ".fp16"].settings["derived_from"] == onnx.graphs[name].sha256


def test_each_plan_binds_what_the_backend_passes(rtx_build) -> None:
    manifest = read_manifest(rtx_build.plan_dir)
    for name, entry in manifest.graphs.items():
        check_contract(SPECS[name], PlanIO.from_manifest(entry), rtx_build.plan_dir / entry.file)
    io = {
        name: {t["name"]: (t["shape"], t["dtype"]) for t in [*e.io["inputs"], *e.io["outputs"]]}
        for name, e in manifest.graphs.items()
    }
    assert io["decoder"] == {"feature": ([-1, 256, 64, 64], "float16"), "output": ([-1, 3, 512, 512], "float16")}
    assert io["warp_network"] == {
        "feature_3d": ([-1, 32, 16, 64, 64], "float16"),
        "kp_source": ([-1, 21, 3], "float32"),
        "kp_driving": ([-1, 21, 3], "float32"),
        "out": ([-1, 256, 64, 64], "float16"),
    }
    assert io["lmdm"]["time_cond"] == ([-1], "int64") and io["lmdm"]["x_start"] == ([-1, 80, 265], "float32")


def test_a_plan_that_binds_otherwise_is_refused(rtx_build) -> None:
    entry = read_manifest(rtx_build.plan_dir).graphs["decoder"]
    wrong = PlanIO.from_manifest(entry)
    wrong.dtypes["feature"] = torch.float32
    with pytest.raises(BackendError, match=r"binds feature as torch.float32, expected torch.float16"):
        check_contract(SPECS["decoder"], wrong, "decoder.plan")
    narrow = PlanIO(
        wrong.inputs,
        wrong.outputs,
        PlanIO.from_manifest(entry).dtypes,
        {"feature": ((1, 256, 64, 64), (4, 256, 64, 64), (8, 256, 64, 64))},
    )
    with pytest.raises(
        BackendError, match=rf"accepts batch 1\.\.8 for feature, expected 1\.\.{SPECS['decoder'].ranges[BATCH][2]}\b"
    ):
        check_contract(SPECS["decoder"], narrow, "decoder.plan")


def test_headers_read_as_tensorrt_rtx_plans_and_a_damaged_one_does_not(rtx_build) -> None:
    import tensorrt_rtx

    for name in RTX_PLANS:
        header = (rtx_build.plan_dir / f"{name}.plan").read_bytes()[:4096]
        if not torch.cuda.is_available():
            assert header_verdict(tensorrt_rtx, header, None) == (
                False,
                "reads as a TensorRT-RTX plan; only a GPU can tell whether it runs",
            )
        damaged = bytes([header[0] ^ 0xFF]) + header[1:]
        ok, said = header_verdict(tensorrt_rtx, damaged, None)
        assert not ok and "not a TensorRT-RTX plan header" in said


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_check_says_per_plan_that_they_cannot_run_without_a_gpu(rtx_build, capsys) -> None:
    assert main(["--check", str(rtx_build.out)]) == 1
    out = capsys.readouterr().out
    assert "this machine: no CUDA GPU; TensorRT-RTX" in out
    assert "compute capability 8.9 (Ada: RTX 40, L4, L40), 12.0 (Blackwell: RTX 50, RTX PRO 6000)" in out
    for name in RTX_PLANS:
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert f"{PRECISION[name]}" in line and "cannot run here" in line and "reads as a TensorRT-RTX plan" in line


def test_check_names_a_plan_file_that_changed(rtx_build, tmp_path, capsys) -> None:
    copy = tmp_path / rtx_build.plan_dir.name
    copy.mkdir()
    for file in rtx_build.plan_dir.iterdir():
        (copy / file.name).symlink_to(file)
    (copy / "decoder.plan").unlink()
    (copy / "decoder.plan").write_bytes(b"not the plan that was built")
    assert main(["--check", str(copy)]) == 1
    assert "differs from the one its manifest records" in capsys.readouterr().out


def test_a_second_build_redoes_nothing(rtx_build) -> None:
    status, log = run_build(
        "--checkpoints",
        str(rtx_build.checkpoints),
        "--out",
        str(rtx_build.out),
        "--networks",
        *RTX_PLANS,
        "--builder",
        "rtx",
        "--arch",
        *RTX_TARGETS,
    )
    assert status == 0 and log.count("unchanged, skipped") == 3 + 2 + 3  # graphs, FP16 graphs, plans
    assert "building" not in log and "proving" not in log


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_backend_without_a_gpu_stops_before_loading_and_names_the_alternatives(rtx_build) -> None:
    with pytest.raises(BackendError) as caught:
        TensorRTBackend(rtx_build.out, checkpoints=rtx_build.checkpoints)
    message = str(caught.value)
    assert "this machine has no CUDA GPU" in message and "compute capability 8.9" in message
    assert "--backend torch" in message


def test_backend_picks_the_plans_this_gpu_runs_and_refuses_the_h200_before_loading(rtx_build) -> None:
    installed = installed_builders()
    assert select_plans(rtx_build.out, RTX_4090, installed)[0] == rtx_build.plan_dir
    with pytest.raises(BackendError) as caught:
        select_plans(rtx_build.out, H200, installed)
    message = str(caught.value)
    assert "NVIDIA H200, has compute capability 9.0 (Hopper: H100, H200), which TensorRT-RTX does not run on" in message
    assert "compute capability 8.9 (Ada: RTX 40, L4, L40), 12.0" in message
    assert "--backend torch" in message and "--builder tensorrt" in message
