"""A DDIM sampler whose whole S-step loop replays as one CUDA graph per batch size.

An 80-frame window at 25 steps is about 25 x 2 x 300 small kernels; launched from Python
that costs more than the arithmetic. Captured once, a window is a single graph launch.
On the CPU it simply runs the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.diffusion.ddim import DDIMSampler, Denoiser, ddim_loop


class GraphedSampler:
    """Wraps a ``DDIMSampler`` and a denoiser; ``__call__(cond_frame, cond)`` samples (B,80,265) windows."""

    def __init__(
        self,
        sampler: DDIMSampler,
        denoiser: Denoiser,
        cond_width: int,
        use_graphs: bool = True,
        prepare: Callable[[torch.Tensor], object] | None = None,
    ) -> None:
        """``prepare`` (optional) encodes a window's condition once; ``denoiser`` then takes its result as ``cond``."""
        self.sampler = sampler
        self.denoiser = denoiser
        self.prepare = prepare or (lambda cond: cond)
        self.cond_width = cond_width
        self.use_graphs = use_graphs and sampler.device.type == "cuda"
        self._graphs: dict[int, _Captured] = {}

    @torch.inference_mode()
    def __call__(self, cond_frame: torch.Tensor, cond: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """Windows for cond_frame (B,265) and cond (B,80,D); x_T from the sampler's generator unless given."""
        x = self.sampler.initial_noise(cond.shape[0]) if x is None else x
        if not self.use_graphs:
            return ddim_loop(self.denoiser, x, cond_frame, self.prepare(cond), self.sampler.schedule, self.sampler.step_noise)
        batch = cond.shape[0]
        if batch not in self._graphs:
            self._graphs[batch] = _Captured(self, batch)
        return self._graphs[batch](x, cond_frame, cond)


class _Captured:
    """The loop for one batch size, captured with static input and output buffers."""

    def __init__(self, owner: GraphedSampler, batch: int) -> None:
        sampler = owner.sampler
        device = sampler.device
        frames, dim = sampler.shape
        self.x = torch.randn(batch, frames, dim, device=device)
        self.cond_frame = torch.zeros(batch, dim, device=device)
        self.cond = torch.zeros(batch, frames, owner.cond_width, device=device)

        def run() -> torch.Tensor:
            prepared = owner.prepare(self.cond)
            return ddim_loop(owner.denoiser, self.x, self.cond_frame, prepared, sampler.schedule, sampler.step_noise)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = run()

    def __call__(self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.cond_frame.copy_(cond_frame)
        self.cond.copy_(cond)
        self.graph.replay()
        return self.out.clone()
