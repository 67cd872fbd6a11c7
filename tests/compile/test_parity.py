"""The parity command's error measure, and its refusal without TensorRT."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from compile.parity import main, relative_error


def test_relative_error_is_max_abs_difference_over_max_reference() -> None:
    expected = torch.tensor([1.0, -4.0, 2.0])
    assert relative_error(expected + torch.tensor([0.0, 0.0, 0.2]), expected) == pytest.approx(0.05)
    assert relative_error(expected.half(), expected) == 0.0


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")
def test_without_tensorrt_it_exits_2_and_says_why(tmp_path, capsys) -> None:
    assert main(["--plans", str(tmp_path), "--checkpoints", str(tmp_path)]) == 2
    assert "TensorRT is not installed" in capsys.readouterr().err
