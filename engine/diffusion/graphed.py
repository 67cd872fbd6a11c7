"""A DDIM sampler for batches of windows whose whole S-step loop replays as one CUDA graph per bucket.

An 80-frame window at 25 steps is about 25 x 2 x 300 small kernels; launched from Python
that costs more than the arithmetic. Captured once per batch bucket (at warm-up, never
mid-stream), a batch of windows is a single graph launch. Every row brings its own x_T and
per-step noise, so a window's result does not depend on which other windows share its batch.
On the CPU it simply runs the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.diffusion.ddim import DDIMStep, ddim_steps
from engine.diffusion.schedule import DDIMSchedule
from engine.graph_pool import GraphPool


class BucketedSampler:
    """``__call__(x, cond_frame, cond, step_noise)`` samples (B,80,265) windows, padded to a captured bucket on CUDA."""

    def __init__(
        self,
        schedule: DDIMSchedule,
        step: DDIMStep,
        cond_width: int,
        shape: tuple[int, int],
        prepare: Callable[[torch.Tensor], object] | None = None,
    ) -> None:
        """``step``: one DDIM step (``ddim.denoiser_step`` of a plain denoiser); ``prepare`` (optional) encodes a
        window's condition once and ``step`` then takes its result as ``cond``."""
        self.schedule = schedule
        self.step = step
        self.prepare = prepare or (lambda cond: cond)
        self.cond_width = cond_width
        self.shape = shape
        self.device = schedule.times.device
        self._graphs: dict[int, _Captured] = {}
        self._pool: GraphPool | None = None

    @property
    def buckets(self) -> tuple[int, ...]:
        """The batch sizes captured so far (empty on the CPU)."""
        return tuple(sorted(self._graphs))

    def capture(self, buckets: tuple[int, ...], pool: GraphPool | None = None) -> None:
        """Capture one graph per bucket, largest first, in ``pool`` (by default one of the sampler's own); CUDA only."""
        if self.device.type != "cuda":
            return
        self._pool = pool or self._pool or GraphPool(self.device)
        for batch in sorted(set(buckets) - set(self._graphs), reverse=True):
            self._graphs[batch] = _Captured(self, batch, self._pool)

    @torch.inference_mode()
    def __call__(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, step_noise: torch.Tensor
    ) -> torch.Tensor:
        """x_T (B,L,265), cond_frame (B,265), cond (B,L,D), step_noise (S−1,B,L,265) -> windows (B,L,265)."""
        batch = x.shape[0]
        bucket = next((b for b in self.buckets if b >= batch), None)
        if bucket is None:
            return ddim_steps(self.step, x, cond_frame, self.prepare(cond), self.schedule, step_noise)
        return self._graphs[bucket](x, cond_frame, cond, step_noise)


class _Captured:
    """The loop for one bucket, captured with static input and output buffers; rows past the batch are padding."""

    def __init__(self, owner: BucketedSampler, batch: int, pool: GraphPool) -> None:
        frames, dim = owner.shape
        device = owner.device
        steps = owner.schedule.steps
        self.batch = batch
        # Inference tensors like every later step's x: torch.compile then keeps one graph for all steps.
        with torch.inference_mode():
            self.x = torch.randn(batch, frames, dim, device=device)
            self.cond_frame = torch.zeros(batch, dim, device=device)
            self.cond = torch.zeros(batch, frames, owner.cond_width, device=device)
            self.step_noise = torch.zeros(steps - 1, batch, frames, dim, device=device)

        def run() -> torch.Tensor:
            prepared = owner.prepare(self.cond)
            return ddim_steps(owner.step, self.x, self.cond_frame, prepared, owner.schedule, self.step_noise)

        with pool.warm_up(), torch.inference_mode():
            run()
        self.graph = torch.cuda.CUDAGraph()
        with pool.capture(self.graph), torch.inference_mode():
            self.out = run()

    def __call__(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, step_noise: torch.Tensor
    ) -> torch.Tensor:
        n = x.shape[0]
        self.x[:n].copy_(x)
        self.cond_frame[:n].copy_(cond_frame)
        self.cond[:n].copy_(cond)
        if step_noise.shape[0]:
            self.step_noise[:, :n].copy_(step_noise)
        self.graph.replay()
        return self.out[:n].clone()
