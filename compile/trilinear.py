"""A 5-D trilinear grid sample built only from ops every ONNX runtime and TensorRT run natively.

``grid_sample_3d`` equals ``F.grid_sample(volume, grid, mode="bilinear", padding_mode="zeros",
align_corners=False)`` on 5-D inputs. It exports to floor, casts, integer arithmetic, one
``Gather`` per cube corner on a channels-last flattened volume, and masked weights, so the
warp network needs neither opset 20's ``GridSample`` nor a custom TensorRT plugin.
"""

from __future__ import annotations

import torch
from torch import nn


def _unnormalize(coord: torch.Tensor, size: int) -> torch.Tensor:
    """Map [-1, 1] (pixel edges, align_corners=False) to voxel-center coordinates."""
    return ((coord + 1.0) * size - 1.0) * 0.5


def grid_sample_3d(volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Trilinear sample of ``volume`` (N,C,D,H,W) at ``grid`` (N,Do,Ho,Wo,3) in (x,y,z) order; zeros outside.

    Bounds and clamping happen on float voxel coordinates (small integers, exact even in fp16);
    the flat indices are int32 arithmetic (the volumes here hold far fewer than 2**31 voxels),
    so the graph's integer work is casts, multiply-adds and the gathers.
    """
    n, c, d, h, w = volume.shape
    out_spatial = grid.shape[1:4]
    coords = grid.reshape(n, -1, 3)
    ix = _unnormalize(coords[..., 0], w)
    iy = _unnormalize(coords[..., 1], h)
    iz = _unnormalize(coords[..., 2], d)
    x0, y0, z0 = torch.floor(ix), torch.floor(iy), torch.floor(iz)
    fx, fy, fz = ix - x0, iy - y0, iz - z0

    table = volume.permute(0, 2, 3, 4, 1).reshape(-1, c)
    batch_offset = (torch.arange(n, dtype=torch.int32, device=volume.device) * (d * h * w)).unsqueeze(1)
    out = torch.zeros(n, coords.shape[1], c, dtype=volume.dtype, device=volume.device)
    for dz in (0, 1):
        zf, wz = z0 + dz, (fz if dz else 1.0 - fz)
        for dy in (0, 1):
            yf, wy = y0 + dy, (fy if dy else 1.0 - fy)
            for dx in (0, 1):
                xf, wx = x0 + dx, (fx if dx else 1.0 - fx)
                inside = (xf >= 0) & (xf <= w - 1) & (yf >= 0) & (yf <= h - 1) & (zf >= 0) & (zf <= d - 1)
                weight = torch.where(inside, wx * wy * wz, torch.zeros_like(wx))
                zi, yi, xi = (v.clamp(0, hi).to(torch.int32) for v, hi in ((zf, d - 1), (yf, h - 1), (xf, w - 1)))
                index = (zi * h + yi) * w + xi + batch_offset
                corner = torch.index_select(table, 0, index.reshape(-1)).reshape(n, -1, c)
                out = out + corner * weight.unsqueeze(-1).to(volume.dtype)
    return out.permute(0, 2, 1).reshape(n, c, *out_spatial)


class TrilinearGridSample(nn.Module):
    """``grid_sample_3d`` as a module, so that an exported graph's nodes carry its scope
    (``engine.plans.graphs.GRID_SAMPLE_SCOPE``)."""

    def forward(self, volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return grid_sample_3d(volume, grid)
