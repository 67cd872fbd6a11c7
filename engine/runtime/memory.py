"""GPU memory of a runtime: what its warm-up steps left reserved in torch's caching allocator."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Reserve(NamedTuple):
    """Bytes the allocator holds now (``reserved``) and has held at most since the process started (``peak``)."""

    reserved: int
    peak: int


def reserve(device: torch.device) -> Reserve:
    """The allocator's reserve on ``device`` now and at its peak (zeros off CUDA)."""
    if device.type != "cuda":
        return Reserve(0, 0)
    return Reserve(torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device))
