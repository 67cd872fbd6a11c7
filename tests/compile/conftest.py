"""One ``--onnx-only`` build of every graph from random checkpoints, shared by the compile tests."""

from __future__ import annotations

import contextlib
import io
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
