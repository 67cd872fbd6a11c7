"""Paste rendered 512x512 crops back into the avatar's full frames with a feathered mask, on the device.

Equivalent to cv2.warpAffine(render, M_c2o[:2], (W, H), INTER_LINEAR, constant-0 border) and
the same for the mask, then v = m·warped + (1−m)·frame, clamped and truncated to uint8. The
sampling grids and warped masks are constant per avatar frame, so they are computed once, and
only over the rectangle the crops reach: outside it the frame is copied unchanged (m = 0). The
masks are warped in float64 so that m is 0 wherever cv2's is, leaving those pixels untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CROP_SIZE = 512
MASK_RATIO = 0.9


def feather_mask(
    size: int = CROP_SIZE, ratio: float = MASK_RATIO, device: torch.device | str | None = None
) -> torch.Tensor:
    """(size,size) float32: 1 inside the central ratio·size square, linear ramps to 0 over the margins, round
    corners."""
    inner = int(size * ratio)
    before = (size - inner) // 2
    after = size - before - inner
    ramp = torch.cat(
        [
            torch.linspace(1, 0, before, dtype=torch.float64),
            torch.zeros(inner, dtype=torch.float64),
            torch.linspace(0, 1, after, dtype=torch.float64),
        ]
    )
    distance = torch.sqrt(ramp[:, None] ** 2 + ramp[None, :] ** 2)
    return (1 - distance.clamp(0, 1)).to(device=device, dtype=torch.float32)


def sampling_grid(crop_to_original: torch.Tensor, rows: range, cols: range, crop_size: int) -> torch.Tensor:
    """Where output pixels rows×cols of the full frame sample the crop: a float64 grid_sample grid (h,w,2),
    align_corners=True."""
    inverse = torch.linalg.inv(crop_to_original.to(torch.float64))[:2]
    ys = torch.arange(rows.start, rows.stop, dtype=torch.float64, device=inverse.device)
    xs = torch.arange(cols.start, cols.stop, dtype=torch.float64, device=inverse.device)
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    points = torch.stack([grid_x, grid_y, torch.ones_like(grid_x)], dim=-1)
    source = points @ inverse.T
    return source * (2.0 / (crop_size - 1)) - 1.0


class PasteBack:
    """Per-avatar compositor: ``__call__(render, index)`` -> full frames (B,H,W,3) uint8 on the avatar's device."""

    def __init__(self, frames: torch.Tensor, crop_to_original: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """``frames`` (N,H,W,3) uint8 RGB avatar frames; ``crop_to_original`` (N,3,3) M_c2o per frame;
        ``mask`` (S,S) in [0,1] (default: the 512 feathered mask)."""
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise ValueError(f"frames must be (N,H,W,3) uint8, got {tuple(frames.shape)} {frames.dtype}")
        if crop_to_original.shape != (frames.shape[0], 3, 3):
            raise ValueError(
                f"crop_to_original must be ({frames.shape[0]},3,3), one per frame, got {tuple(crop_to_original.shape)}"
            )
        device = frames.device
        mask = feather_mask() if mask is None else mask
        if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
            raise ValueError(f"mask must be square (S,S), got {tuple(mask.shape)}")
        self.frames = frames
        self.crop_size = mask.shape[0]
        height, width = frames.shape[1:3]
        self.rows, self.cols = _reach(crop_to_original, self.crop_size, height, width)
        if not self.rows or not self.cols:
            raise ValueError(
                "the crops lie entirely outside the avatar frames: check crop_to_original (it maps crop to frame "
                "pixels)"
            )
        mask = mask.to(device=device, dtype=torch.float64)[None, None]
        grids, masks = [], []
        for matrix in crop_to_original.to(device):
            grid = sampling_grid(matrix, self.rows, self.cols, self.crop_size)[None]
            masks.append(_sample(mask, grid)[0].clamp(0, 1).permute(1, 2, 0).to(torch.float32))
            grids.append(grid[0].to(torch.float32))
        self.grids = torch.stack(grids)
        self.masks = torch.stack(masks)

    def __call__(self, render: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        """Renders (B,3,S,S) in [0,1] (any float dtype) and avatar frame per render (B,) int64 (None: frame 0) ->
        (B,H,W,3) uint8."""
        batch = render.shape[0]
        if render.shape[1:] != (3, self.crop_size, self.crop_size):
            raise ValueError(f"render must be (B,3,{self.crop_size},{self.crop_size}), got {tuple(render.shape)}")
        if index is None:
            index = torch.zeros(batch, dtype=torch.int64, device=self.frames.device)
        out = self.frames[index]
        warped = _sample(render.float().clamp(0, 1) * 255.0, self.grids[index]).permute(0, 2, 3, 1)
        region = out[:, self.rows.start : self.rows.stop, self.cols.start : self.cols.stop]
        mask = self.masks[index]
        blended = mask * warped + (1 - mask) * region.float()
        region.copy_(blended.clamp(0, 255).to(torch.uint8))
        return out


def _sample(image: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Bilinear sampling with zeros outside, pixel centres on the grid's ±1 ends (cv2's INTER_LINEAR, constant 0
    border)."""
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def _reach(crop_to_original: torch.Tensor, crop_size: int, height: int, width: int) -> tuple[range, range]:
    """Rows and columns of the full frame that any crop can touch: the box around the crops' corners, ±1 pixel,
    clipped."""
    edge = float(crop_size)
    corners = torch.tensor(
        [[-1.0, -1.0, 1.0], [edge, -1.0, 1.0], [-1.0, edge, 1.0], [edge, edge, 1.0]], dtype=torch.float64
    )
    mapped = corners @ crop_to_original.to(torch.float64).cpu().transpose(-1, -2)
    xs, ys = mapped[..., 0], mapped[..., 1]
    rows = range(max(int(ys.min().floor()) - 1, 0), min(int(ys.max().ceil()) + 2, height))
    cols = range(max(int(xs.min().floor()) - 1, 0), min(int(xs.max().ceil()) + 2, width))
    return rows, cols
