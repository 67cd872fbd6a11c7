"""Building a network without drawing the random initial weights that its checkpoint then overwrites."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn import init

RANDOM_FILLS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "orthogonal_",
    "sparse_",
)
"""The ``torch.nn.init`` functions that draw random numbers (the constant fills cost nothing and stay)."""

_BUILDING = threading.Lock()


def _leave_as_allocated(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


@contextmanager
def without_random_init() -> Iterator[None]:
    """While a network is built, ``torch.nn.init``'s random fills leave tensors as allocated: drawing them is a
    large share of loading the networks (bench/results/2026-12-02_h200_start_with_packages.json), and a strict load
    then writes every parameter and persistent buffer anyway. The switch is process-wide while it lasts, so builds take
    turns."""
    with _BUILDING:
        saved = {name: getattr(init, name) for name in RANDOM_FILLS}
        for name in RANDOM_FILLS:
            setattr(init, name, _leave_as_allocated)
        try:
            yield
        finally:
            for name, fill in saved.items():
                setattr(init, name, fill)
