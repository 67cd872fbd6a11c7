"""The parity command's error measure, and its refusal without TensorRT or plans."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from compile.parity import main, relative_error


def test_relative_error_is_max_abs_difference_over_max_reference() -> None:
    expected = torch.tensor([1.0, -4.0, 2.0])
    assert relative_error(expected + torch.tensor([0.0, 0.0, 0.2]), expected) == pytest.approx(0.05)
    assert relative_error(expected.half(), expected) == 0.0


TENSORRT = any(importlib.util.find_spec(m) for m in ("tensorrt", "tensorrt_rtx"))


@pytest.mark.skipif(TENSORRT, reason="a TensorRT library is installed")
def test_without_tensorrt_it_exits_2_and_says_why(tmp_path, capsys) -> None:
    assert main(["--plans", str(tmp_path), "--checkpoints", str(tmp_path)]) == 2
    assert "TensorRT-RTX is not installed" in capsys.readouterr().err


@pytest.mark.skipif(not TENSORRT, reason="no TensorRT library")
def test_without_plans_it_exits_2_and_says_why(tmp_path, capsys) -> None:
    assert main(["--plans", str(tmp_path), "--checkpoints", str(tmp_path)]) == 2
    assert "no plans in" in capsys.readouterr().err
