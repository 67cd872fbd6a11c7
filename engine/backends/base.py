"""The interface every backend implements, so the engine never knows which one runs.

All tensors are device tensors owned by the caller; a backend never copies to the host.
Calls run on the caller's current CUDA stream (``torch.cuda.current_stream()``), so the
engine can overlap diffusion and rendering on two streams. Shapes carry a leading batch
axis everywhere; a backend may restrict batch sizes to those it was built for
(``render_batch_sizes``) and must say so with a clear error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BackendError(RuntimeError):
    """A backend cannot run here (missing library, plan for another GPU, bad batch size)."""


class Backend(ABC):
    """Runs Ditto's networks on one device."""

    name: str
    device: torch.device
    dtype: torch.dtype
    cond_width: int
    """The LMDM's condition width D, read from its checkpoint (1103 for the published model)."""
    render_batch_sizes: tuple[int, ...] | None = None

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
        """Motion extractor: RGB (B,3,256,256) -> dict pitch, yaw, roll (B,66), t (B,3), exp (B,63), scale (B,1), kp (B,63)."""

    def render(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """Warp then decode; backends with a merged graph override this."""
        return self.decode(self.warp(feature_3d, kp_source, kp_driving))
