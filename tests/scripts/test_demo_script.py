"""scripts/demo.sh on a fresh machine: the torch build for the machine it runs on, and the streaming extras."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_demo(tmp_path: Path, gpu: bool) -> tuple[list[str], str]:
    """demo.sh with stand-ins for python3 (no torch installed) and, when ``gpu``, nvidia-smi; their calls and the
    output."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *base_prefix*) exit 0;; -c*) exit 1;; esac\nexit 0\n'
    )
    (bin_dir / "python3").chmod(0o755)
    if gpu:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    run = subprocess.run(
        [shutil.which("bash"), str(ROOT / "scripts" / "demo.sh")],
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return calls.read_text().splitlines(), run.stdout + run.stderr


@pytest.mark.parametrize("gpu", [False, True])
def test_the_demo_installs_the_torch_build_for_this_machine_and_says_which(tmp_path: Path, gpu: bool) -> None:
    calls, output = run_demo(tmp_path, gpu)
    torch_install = next(c for c in calls if "torch==" in c)
    assert ("download.pytorch.org/whl/cpu" in torch_install) is not gpu
    assert ("CUDA build" if gpu else "CPU build") in output


def test_the_demo_installs_the_streaming_extras_the_readme_runs_next(tmp_path: Path) -> None:
    calls, _ = run_demo(tmp_path, gpu=False)
    assert any(c.endswith("-e .[face,stream]") for c in calls), calls
