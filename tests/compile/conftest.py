"""One ``--onnx-only`` build of every graph from random checkpoints, and one TensorRT-RTX build of the
decoder, warp and LMDM plans from it, shared by the compile tests."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from compile import build_plans


@dataclass(frozen=True)
class OnnxBuild:
    """Where the shared build read its checkpoints and wrote its graphs, and what it printed."""

    checkpoints: Path
    out: Path
    onnx_dir: Path
    log: str


def run_build(*args: str) -> tuple[int, str]:
    """Run ``python -m compile.build_plans`` in-process; returns its exit status and its printed progress."""
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        status = build_plans.main(list(args))
    return status, log.getvalue()


@pytest.fixture(scope="session")
def onnx_build(checkpoint_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> OnnxBuild:
    checkpoints = checkpoint_dir()
    out = tmp_path_factory.mktemp("plans")
    status, log = run_build("--checkpoints", str(checkpoints), "--out", str(out), "--onnx-only")
    assert status == 0, log
    return OnnxBuild(checkpoints, out, out / "onnx", log)


RTX_PLANS = ("decoder", "warp_network", "lmdm")
RTX_TARGETS = ("sm_89", "sm_120")


@dataclass(frozen=True)
class PlanBuild:
    """The shared TensorRT-RTX build: where its ONNX graphs and plans are, and what it printed."""

    checkpoints: Path
    out: Path
    plan_dir: Path
    log: str


@pytest.fixture(scope="session")
def rtx_build(onnx_build: OnnxBuild, tmp_path_factory: pytest.TempPathFactory) -> PlanBuild:
    """Real FP16/FP32 plans for sm_89 and sm_120, built on this GPU-less machine from the shared graphs."""
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed (pip install -e '.[rtx]')")
    out = tmp_path_factory.mktemp("rtx")
    (out / "onnx").mkdir()
    for name in RTX_PLANS:  # the shared FP32 graphs, unchanged, so the build skips their export
        (out / "onnx" / f"{name}.onnx").symlink_to(onnx_build.onnx_dir / f"{name}.onnx")
    shutil.copy(onnx_build.onnx_dir / "manifest.json", out / "onnx" / "manifest.json")
    status, log = run_build(
        "--checkpoints",
        str(onnx_build.checkpoints),
        "--out",
        str(out),
        "--networks",
        *RTX_PLANS,
        "--builder",
        "rtx",
        "--arch",
        *RTX_TARGETS,
    )
    assert status == 0, log
    (plan_dir,) = [d for d in out.iterdir() if d.name.startswith("rtx")]
    return PlanBuild(onnx_build.checkpoints, out, plan_dir, log)
