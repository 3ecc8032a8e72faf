"""Fused decode + matmul ops: y = x @ W^T with W kept encoded.

    torch.ops.unweight.palette_matmul(x, sm, idx, vpos, vexp, workspace, rows, cols, palette) -> y
    torch.ops.unweight.huffman_matmul(x, sm, exp, off, lut, workspace, err, rows, cols, R, C) -> y
        x: bf16 [M, cols] (unit column stride); y: bf16 [M, rows]; fp32 accumulation, one rounding.
        workspace: fp32 [>= workspace_elems(...)] on x's device (a view of the runtime's
        per-device workspace, so a forward allocates nothing but y).

The CUDA kernels take M <= 16 (kernel_plan.gemm_supported / huffman_gemm_supported) and
raise ValueError/RuntimeError for problems they refuse; the runtime dispatch then falls back
to decode + cuBLAS (runtime/dispatch.py).  The CPU implementations decode and multiply in
fp32 with one rounding: the reference the kernels are tested against.
"""
from __future__ import annotations

from typing import List

import numpy as np
import torch
from torch import Tensor

from ..runtime import kernel_plan as plan
from . import _ext
from .decode import n_units

__all__ = ["palette_matmul", "huffman_matmul", "palette_workspace_elems", "huffman_workspace_elems"]


def palette_workspace_elems(M: int, nv: int) -> int:
    """fp32 elements palette_matmul needs: the verbatim-block corrections [nv, M]."""
    return max(1, nv * M)


def huffman_workspace_elems(M: int, rows: int, cols: int, cols_per_chunk: int) -> int:
    """fp32 elements huffman_matmul needs: partial sums [ceil(cols / C), M, rows]."""
    return max(1, plan.hgemm_workspace_elems(M, rows, cols, cols_per_chunk))


def _reference(x: Tensor, w_bits: np.ndarray) -> Tensor:
    w = torch.from_numpy(w_bits).view(torch.bfloat16).float()
    return (x.float() @ w.T).to(torch.bfloat16)


def _check_x(name: str, x: Tensor, cols: int, max_m: int):
    if x.dim() != 2 or x.size(1) != cols or x.dtype != torch.bfloat16:
        raise ValueError(f"{name} takes bf16 x [M, {cols}], got {x.dtype} {tuple(x.shape)}")
    if not 1 <= x.size(0) <= max_m:
        raise ValueError(f"{name} takes 1..{max_m} rows of x, got {x.size(0)}")
    if x.stride(1) != 1:
        raise ValueError(f"{name}: x must have unit column stride")


# ------------------------------------------------------------------------ palette_matmul


@torch.library.custom_op("unweight::palette_matmul", mutates_args=("workspace",))
def palette_matmul(x: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, workspace: Tensor, rows: int,
                   cols: int, palette: List[int]) -> Tensor:
    raise NotImplementedError(f"unweight::palette_matmul has no kernel for device {x.device}")


@palette_matmul.register_fake
def _(x, sm, idx, vpos, vexp, workspace, rows, cols, palette):
    return x.new_empty((x.size(0), rows))


@palette_matmul.register_kernel("cpu")
def _(x, sm, idx, vpos, vexp, workspace, rows, cols, palette):
    w = np.empty((rows, cols), dtype=np.uint16)
    torch.ops.unweight.decode_palette(sm, idx, vpos, vexp, torch.from_numpy(w).view(torch.bfloat16),
                                      torch.zeros(1, dtype=torch.int32), rows, cols, palette)
    return _reference(x, w)


@palette_matmul.register_kernel("cuda")
def _(x, sm, idx, vpos, vexp, workspace, rows, cols, palette):
    _check_x("palette_matmul", x, cols, plan.GEMM_MAX_M)
    M = x.size(0)
    if not plan.gemm_supported(M, cols):
        raise ValueError("palette_matmul needs cols % 8 == 0")
    if x.stride(0) % plan.GEMM_VEC or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)  # fresh and aligned: the kernel's 16-byte x loads
    _ext.require_contiguous("palette_matmul", sm, idx, vpos, vexp, workspace)
    _ext.same_device("palette_matmul", x, sm, idx, vpos, vexp, workspace)
    nv = vpos.numel()
    if workspace.dtype != torch.float32 or workspace.numel() < palette_workspace_elems(M, nv):
        raise ValueError("palette_matmul: workspace too small")
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemm(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                        bytes(palette), _ext.ptr(vpos), nv, _ext.ptr(vexp), _ext.ptr(workspace),
                                        _ext.ptr(y), y.stride(0), _ext.stream(x))
    return y


# ------------------------------------------------------------------------ huffman_matmul


@torch.library.custom_op("unweight::huffman_matmul", mutates_args=("workspace", "err"))
def huffman_matmul(x: Tensor, sm: Tensor, exp: Tensor, off: Tensor, table: Tensor, lut: Tensor, workspace: Tensor,
                   err: Tensor, rows: int, cols: int, rows_per_group: int, cols_per_chunk: int, exp_lo: int,
                   exp_hi: int) -> Tensor:
    raise NotImplementedError(f"unweight::huffman_matmul has no kernel for device {x.device}")


@huffman_matmul.register_fake
def _(x, sm, exp, off, table, lut, workspace, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    return x.new_empty((x.size(0), rows))


@huffman_matmul.register_kernel("cpu")
def _(x, sm, exp, off, table, lut, workspace, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    w = np.empty((rows, cols), dtype=np.uint16)
    torch.ops.unweight.decode_huffman(sm, exp, off, table, lut, torch.from_numpy(w).view(torch.bfloat16), err, rows,
                                      cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi)
    return _reference(x, w)


@huffman_matmul.register_kernel("cuda")
def _(x, sm, exp, off, table, lut, workspace, err, rows, cols, rows_per_group, cols_per_chunk, exp_lo, exp_hi):
    _check_x("huffman_matmul", x, cols, plan.HGEMM_MAX_M)
    M = x.size(0)
    _ext.require_contiguous("huffman_matmul", sm, exp, off, lut, workspace)
    _ext.same_device("huffman_matmul", x, sm, exp, off, lut, workspace, err)
    if workspace.dtype != torch.float32 or workspace.numel() < huffman_workspace_elems(M, rows, cols, cols_per_chunk):
        raise ValueError("huffman_matmul: workspace too small")
    if n_units(cols, cols_per_chunk) > plan.HGEMM_MAX_CHUNKS:
        raise ValueError("huffman_matmul: too many column chunks")
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().huffman_gemm(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(exp), exp.numel(),
                                        _ext.ptr(off), rows, cols, rows_per_group, cols_per_chunk, _ext.ptr(lut),
                                        _ext.ptr(workspace), _ext.ptr(y), y.stride(0), _ext.ptr(err), _ext.stream(x))
    return y
