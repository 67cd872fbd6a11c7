"""The interface every backend implements, so the engine never knows which one runs.

All tensors are device tensors owned by the caller; a backend never copies to the host.
Calls run on the caller's current CUDA stream (``torch.cuda.current_stream()``), so the
engine can overlap diffusion and rendering on two streams. Shapes carry a leading batch
axis everywhere; a backend may restrict batch sizes to those it was built for
(``render_batch_sizes``) and must say so with a clear error. Beside the networks every backend
runs, a backend may offer fast paths; it says which in ``capabilities``, and callers ask there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from engine.graph_pool import GraphPool


class BackendError(RuntimeError):
    """A backend cannot run here (missing library, plan for another GPU, bad batch size)."""


@dataclass(frozen=True)
class Capabilities:
    """The optional fast paths of a backend (all off by default)."""

    fused_ddim_step: bool = False
    """``lmdm_prepare`` and ``lmdm_step``: a window's condition encoded once, then each DDIM step (update included)
    one call; without it the sampler composes each step from ``lmdm``."""
    render_graphs: bool = False
    """``capture_render``: warp+decode captured per batch bucket and replayed (``captures`` counts them)."""


class Backend(ABC):
    """Runs Ditto's networks on one device."""

    name: str
    device: torch.device
    dtype: torch.dtype
    cond_width: int
    """The LMDM's condition width D, read from its checkpoint (1103 for the published model)."""
    render_batch_sizes: tuple[int, ...] | None = None
    capabilities: Capabilities = Capabilities()
    packages_status: str = "no compiled packages: this backend runs its own plans"
    """How the networks run, in a line for logs: the torch backend's compiled packages in use, or why not."""
    captures: int = 0
    """Graphs captured by ``capture_render`` so far."""

    @abstractmethod
    def lmdm(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One guided denoiser call: (B,80,265), (B,265), (B,80,D), (B,) int64 -> (pred_noise, x_start)."""

    @abstractmethod
    def stitch(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Stitching network: (B,21,3), (B,21,3) -> corrected driving keypoints (B,21,3)."""

    @abstractmethod
    def warp(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Warp network: (B,32,16,64,64), (B,21,3), (B,21,3) -> (B,256,64,64)."""

    @abstractmethod
    def decode(self, feature: torch.Tensor) -> torch.Tensor:
        """Decoder: (B,256,64,64) -> RGB (B,3,512,512) in [0,1]."""

    @abstractmethod
    def appearance(self, image: torch.Tensor) -> torch.Tensor:
        """Appearance extractor: RGB (B,3,256,256) in [0,1] -> f_s (B,32,16,64,64)."""

    @abstractmethod
    def motion(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        """Motion extractor: RGB (B,3,256,256) -> dict pitch, yaw, roll (B,66), t (B,3), exp (B,63), scale (B,1), kp
        (B,63)."""

    def render(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Warp then decode; backends with a merged graph override this."""
        return self.decode(self.warp(feature_3d, kp_source, kp_driving))

    def lmdm_prepare(self, cond: torch.Tensor, times: torch.Tensor) -> object:
        """Encode a window's condition (B,80,D) once for its calls at ``times`` (``capabilities.fused_ddim_step``)."""
        raise BackendError(f"the {self.name} backend has no fused DDIM step (capabilities.fused_ddim_step)")

    def lmdm_step(
        self,
        x: torch.Tensor,
        cond_frame: torch.Tensor,
        prepared: object,
        time_cond: torch.Tensor,
        coefficients: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """One whole DDIM step (``engine.diffusion.ddim.DDIMStep``) of a window from ``lmdm_prepare``."""
        raise BackendError(f"the {self.name} backend has no fused DDIM step (capabilities.fused_ddim_step)")

    def capture_render(self, batch_sizes: tuple[int, ...], pool: GraphPool | None = None) -> None:
        """Capture warp+decode for each batch size (``capabilities.render_graphs``)."""
        raise BackendError(f"the {self.name} backend captures no render graphs (capabilities.render_graphs)")
