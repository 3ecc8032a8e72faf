"""Tile-major order of the palette planes (csrc/cuda/kernel_plan.h, "palette plane order").

    tile_palette_planes(sm, idx) -> (sm_t, idx_t)
    untile_palette_planes(sm_t, idx_t) -> (sm, idx)
        sm uint8 [rows, cols] and idx uint8 [rows, cols / 2] in file order (docs/FORMAT.md) <->
        the same bytes cut into 16 x 64 tiles, [rows / 16][cols / 64][16][64] and
        [rows / 16][cols / 64][16][32], returned with the planes' [rows, cols] and
        [rows, cols / 2] shapes so that every shape check holds; any device (torch copies, no
        kernel).  Needs rows % 16 == 0 and cols % 64 == 0 (kernel_plan.pal_tiled_ok).

The palette kernels (decode_palette, palette_matmul, palette_gemv with ``tiled=True``) read a
tile-major weight as fast as their loads allow: a warp's 16-row step is one contiguous run of
DRAM instead of 16 runs a row length apart.  The file format does not change; a runtime may
hold a weight either way.
"""
from __future__ import annotations

from torch import Tensor

from ..runtime import kernel_plan as plan

__all__ = ["tile_palette_planes", "untile_palette_planes"]

_R, _C = plan.PAL_TILE_ROWS, plan.PAL_TILE_COLS


def _shape(sm: Tensor, idx: Tensor) -> tuple[int, int]:
    if sm.dim() != 2 or idx.dim() != 2:
        raise ValueError("palette planes must be 2-D")
    rows, cols = sm.shape
    if not plan.pal_tiled_ok(rows, cols):
        raise ValueError(f"tile-major planes need rows % {_R} == 0 and cols % {_C} == 0, got {rows} x {cols}")
    if tuple(idx.shape) != (rows, cols // 2):
        raise ValueError(f"index plane must be [{rows}, {cols // 2}], got {tuple(idx.shape)}")
    return rows, cols


def _reorder(sm: Tensor, idx: Tensor, to_tiled: bool) -> tuple[Tensor, Tensor]:
    """Both planes between the orders: one transpose of the (row tile, row, column tile,
    column) axes, which swaps the middle two whichever way it goes."""
    rows, cols = _shape(sm, idx)

    def swap(p: Tensor, width: int) -> Tensor:  # width: a tile row's bytes in this plane
        mid = (_R, cols // _C) if to_tiled else (cols // _C, _R)
        return p.reshape(rows // _R, *mid, width).transpose(1, 2).contiguous().view(rows, p.size(1))
    return swap(sm, _C), swap(idx, _C // 2)


def tile_palette_planes(sm: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """File order -> tile-major (new tensors, same shapes and device)."""
    return _reorder(sm, idx, True)


def untile_palette_planes(sm: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    """Tile-major -> file order (new tensors, same shapes and device)."""
    return _reorder(sm, idx, False)
