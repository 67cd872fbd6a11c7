"""One memory pool for every CUDA graph a runtime captures, and for the warm-up run before each capture.

A runtime replays its graphs one at a time on one stream, and each graph's output is copied or consumed before
another replays, so their intermediate memory can overlap: captured into one pool, largest first, they take about
the largest one's memory instead of the sum. The uncaptured warm-up run before each capture (lazy initialisation,
kernel loading) allocates from the same pool on the same stream, so it reuses that memory instead of adding its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch


class GraphPool:
    """A memory pool and the one stream on which its graphs are captured and warmed up (CUDA only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device()) if device.index is None else device
        self.pool = torch.cuda.MemPool()
        self.stream = torch.cuda.Stream(device)

    @contextmanager
    def warm_up(self) -> Iterator[None]:
        """Run uncaptured work on the pool's stream, its memory from the pool, between the caller stream's work before
        and after it."""
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream), torch.cuda.use_mem_pool(self.pool, self.device):
            yield
        caller.wait_stream(self.stream)

    def capture(self, graph: torch.cuda.CUDAGraph) -> AbstractContextManager[object]:
        """Capture into ``graph`` on the pool's stream, its memory from the pool."""
        return torch.cuda.graph(graph, pool=self.pool.id, stream=self.stream)
