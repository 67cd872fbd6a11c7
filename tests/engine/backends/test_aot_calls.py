"""Inputs handed to a compiled package are dense and start on the boundary its kernels were compiled for."""

from __future__ import annotations

import torch

from engine.backends.aot_calls import ALIGNMENT, contiguous


def test_a_view_off_the_alignment_boundary_is_copied_to_an_aligned_tensor_with_the_same_values() -> None:
    times = torch.arange(26, dtype=torch.float32)
    one_time = times[3:4]  # 12 bytes into its buffer, as one DDIM time sliced from the schedule is
    assert one_time.data_ptr() % ALIGNMENT != 0
    (aligned,) = contiguous((one_time,))
    assert aligned.data_ptr() % ALIGNMENT == 0 and torch.equal(aligned, one_time)


def test_aligned_dense_inputs_pass_as_they_are_and_strided_ones_become_dense() -> None:
    dense = torch.zeros(4, 80, 265)
    strided = torch.zeros(265, 80).t()
    same, made_dense = contiguous((dense, strided))
    assert same is dense
    assert made_dense.is_contiguous() and torch.equal(made_dense, strided)
