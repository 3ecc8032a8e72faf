"""Fused decode + matmul: y = x @ W^T with W kept palette-coded, on the tensor cores.

    torch.ops.unweight.palette_matmul(x, sm, idx, vpos, vexp, workspace, counters, rows, cols,
                                      palette, splits, stage_tiles=1, x_shared=False, tiled=False,
                                      wgmma=False) -> y
        x: bf16 [M, cols] (unit column stride), 1 <= M <= 256 on CUDA; y: bf16 [M, rows];
        fp32 accumulation, one rounding.  sm, idx, vpos, vexp: the palette planes (docs/FORMAT.md),
        on x's device; tiled: sm and idx tile-major (ops/layout.py: a warp's 16-row steps are
        contiguous runs of memory), else in file order.  Both orders give the same bits.
        splits: how many K slices the CUDA kernel works on in parallel (palette_splits(); any
            value in 1 .. cols // 64 is correct: the choice moves work between SMs and sets
            the order of the fp32 sums).
        workspace: fp32 [>= palette_workspace_elems(M, rows, splits, cols, wgmma)] (may be empty
            when splits is 1, except for wgmma): the slices' partial sums, and for wgmma x
            rewritten as the kernel's stage images after them (16-byte aligned).
        counters: int32 [>= palette_counters_elems(rows)], all zero; a launch leaves them zero,
            so one buffer serves every launch ordered on a stream.
        stage_tiles: 64-column tiles per stage of the kernel's copy ring: 1, or 2 (wide stages,
            each copy reading whole 128-byte lines); the same bits either way, the dispatch
            takes whichever the tuning table measured faster (PALETTE_GEMM / PALETTE_GEMM_WIDE).
        x_shared: with stage_tiles 1, each CTA copies its rows of x into shared memory once
            per stage for its four warps, instead of every warp loading them (x traffic / 4;
            PALETTE_GEMM_XS); the same bits.
        wgmma: x staged per CTA in the layout of Hopper's warpgroup MMA, which multiplies it
            (sm_90 GPUs with an sm_90a build, else refused; up to 128 batch rows per CTA, so a
            weight is decoded once per 128 rows; PALETTE_GEMM_WG); a small kernel first writes
            x in that layout into the workspace, once per call; splits from
            palette_splits(..., wgmma=True).  Tensor-core sums per 16 columns in the same
            order as the other layouts (the emulator gives them the same bits).
        workspace and counters are views of the runtime's per-device buffers (runtime/scratch.py), so a forward
        allocates nothing but y.

    torch.ops.unweight.palette_gemv(x, sm, idx, vpos, vexp, rows, cols, palette, parts, variant=0,
                                    tiled=False) -> y
        The same product for batches of 1..4 on CUDA cores (a warp streams one row into
        registers; PALETTE_GEMV): x bf16 [M, cols], y bf16 [M, rows], fp32 accumulation, one
        rounding.  parts: warps per row (palette_gemv_parts(); 1, 2, 4 or 8; per 16-row tile for
        the tensor-core variants, 1..8 for MMA, MMA_PREFETCH and MMA_SPLIT), which sets the
        order of the sums.  variant: kernel_plan.PGEMV_VARIANT_* (0 the default; DEEP, twice the
        loads in flight per lane, PALETTE_GEMV_DEEP; STAGED, loads through cp.async into
        shared-memory rings, PALETTE_GEMV_STAGED: the same bits; MMA, a warp streams a 16-row
        tile into registers and multiplies on the tensor cores, batches of 1..32,
        PALETTE_GEMV_MMA: tensor-core sums, deterministic and batch-invariant, not the
        CUDA-core bits; MMA_STAGED, its loads through cp.async into shared-memory rings,
        PALETTE_GEMV_MMA_STAGED, MMA_PREFETCH, its loads behind an L2 prefetch,
        PALETTE_GEMV_MMA_PREFETCH, and MMA_BULK, its steps fetched by cp.async.bulk into
        shared-memory rings, PALETTE_GEMV_MMA_BULK, sm_90+ and tiled planes only: the MMA bits;
        MMA_SPLIT, the MMA kernel on planes held in the split layout, sm and idx from
        ops.split_palette_planes, palette as given to it, CUDA only: the MMA bits on the stored
        planes, from 6 decode operations per 4 weights instead of 8).
        parts comes from palette_gemv_parts(..., variant).  No workspace.
        tiled as for palette_matmul.

    torch.ops.unweight.palette_gemv_queue(x, sm, idx, vpos, vexp, workspace, counters, rows, cols,
                                          palette, units, tiled=False) -> y
        The tensor-core GEMV (batches of 1..32) with a tile's steps cut into `units` units
        (palette_gemv_queue_units(); any value in 1 .. the tile's cdiv(cols, 128) steps, taken down
        to the count that leaves no unit empty, sets the order of the sums: at 1, 2, 4 or 8 the
        bits of palette_gemv's MMA variant at that parts) handed
        out from a queue to a persistent grid: the warps that stream faster take more units.
        workspace: fp32 [>= palette_gemv_queue_workspace(M, rows, units)] (may be empty at one
        unit per tile); counters: int32 [>= palette_gemv_queue_counters(rows)], all zero; a
        launch leaves them zero.  The runtime hands it the same per-device buffers as
        palette_matmul (runtime/scratch.py).  tiled as for palette_matmul.

    torch.ops.unweight.palette_gemv_slots(x, ids, sm, idx, vpos, vexp, err, palette, parts) -> y
        y[s] = x[s] @ W[ids[s]]^T for the slots of a palette stack (runtime/expert_slots.py: one
        palette, sm uint8 [E, rows, cols], idx [E, rows, cols / 2], vpos uint32 [E, V], vexp
        [E, V, 32]): x bf16 [S, cols], ids int64 [S], y bf16 [S, rows].  On CUDA the tensor-core
        GEMV at batch 1 per slot, reading the ids on the device (no host sync; a graph captures
        it): each slot's bits are palette_gemv's (variant MMA, `parts`) on its expert.  An id
        outside [0, E) adds 1 to err and leaves its row unwritten (CPU: raises FormatError).

Every op above also takes ``vrow=None``: the row index of the verbatim list
(ops.verbatim_rows, uint32 [rows + 1]; [E, rows + 1] for palette_gemv_slots), which a holder
builds once from vpos.  With it each warp finds its rows' first verbatim blocks in two
dependent loads before its first multiply; without it the CUDA kernels search vpos (about
log16(nv) + 4 dependent loads).  The same bits either way; the CPU implementations ignore it.

The CUDA kernels need cols % 64 == 0 and 16-byte aligned planes (palette_supported); it
raises ValueError / RuntimeError for what it refuses and the runtime dispatch falls back to
decode + cuBLAS.  The CPU implementation decodes and multiplies in fp32 with one rounding
(the reference the kernel is tested against) and ignores splits, workspace and counters.

There is no fused Huffman matmul: a Huffman exponent stream decodes serially per segment, so
fusing its decode into a GEMM runs the GEMM at the decoder's speed (docs/design/gpu-kernels.md
gives the arithmetic); Huffman layers decode into scratch and run cuBLAS.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from ..runtime import kernel_plan as plan
from . import _ext

__all__ = ["palette_matmul", "palette_gemv_slots", "palette_splits", "palette_workspace_elems", "palette_workspace_max",
           "palette_counters_elems", "palette_supported", "palette_gemv", "palette_gemv_parts",
           "palette_gemv_supported", "palette_gemv_queue", "palette_gemv_queue_units", "palette_gemv_queue_workspace",
           "palette_gemv_queue_workspace_max", "palette_gemv_queue_counters", "programmatic_launch",
           "wgmma_tile_wait", "gemv_x_prefetch"]

_SMS: dict = {}


def _num_sms(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SMS.get(idx)
    if n is None:
        n = _SMS[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


def palette_splits(rows: int, cols: int, device, M: int = 1, wgmma: bool = False) -> int:
    """K splits for an [rows, cols] weight at batch M on `device`: enough CTAs to fill its SMs
    (kernel_plan.pmma_splits; 1 off CUDA).  The same for every M in 1..64 (wgmma: 1..128), so
    are the results."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return plan.pmma_splits(rows, cols, _num_sms(device), M, wgmma)


def palette_workspace_elems(M: int, rows: int, splits: int, cols: int = 0, wgmma: bool = False) -> int:
    """fp32 elements palette_matmul needs at batch M: the splits' partial sums [splits, M, rows],
    and with wgmma x as the kernel's stage images (kernel_plan.pmma_wg_x_rows(M) x cols) after them."""
    return plan.pmma_workspace_need(M, rows, cols, splits, wgmma)


def palette_workspace_max(rows: int, cols: int, device) -> int:
    """fp32 elements that cover palette_matmul's workspace at every batch it takes on `device`."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return plan.pmma_workspace_max(rows, cols, _num_sms(device))


def palette_counters_elems(rows: int) -> int:
    """int32 arrival counters palette_matmul needs (one per 64-row block of W and batch chunk)."""
    return plan.pmma_counters(rows)


def palette_supported(M: int, cols: int) -> bool:
    """Whether the CUDA kernel takes a batch of M rows against a weight with `cols` columns."""
    return plan.pmma_supported(M, cols)


def _reference(x: Tensor, w_bits: np.ndarray) -> Tensor:
    w = torch.from_numpy(w_bits).view(torch.bfloat16).float()
    return (x.float() @ w.T).to(torch.bfloat16)


@torch.library.custom_op("unweight::palette_matmul", mutates_args=("workspace", "counters"))
def palette_matmul(x: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, workspace: Tensor,
                   counters: Tensor, rows: int, cols: int, palette: List[int], splits: int,
                   stage_tiles: int = 1, x_shared: bool = False, tiled: bool = False, wgmma: bool = False,
                   vrow: Optional[Tensor] = None) -> Tensor:
    raise NotImplementedError(f"unweight::palette_matmul has no kernel for device {x.device}")


@palette_matmul.register_fake
def _(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, splits, stage_tiles=1, x_shared=False,
      tiled=False, wgmma=False, vrow=None):
    return x.new_empty((x.size(0), rows))


@palette_matmul.register_kernel("cpu")
def _palette_matmul_cpu(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, splits, stage_tiles=1, x_shared=False,
      tiled=False, wgmma=False, vrow=None):
    if x.dim() != 2 or x.size(1) != cols:
        raise ValueError(f"palette_matmul takes x [M, {cols}], got {tuple(x.shape)}")
    w = np.empty((rows, cols), dtype=np.uint16)
    torch.ops.unweight.decode_palette(sm, idx, vpos, vexp, torch.from_numpy(w).view(torch.bfloat16),
                                      torch.zeros(1, dtype=torch.int32), rows, cols, palette, 0, tiled)
    return _reference(x, w)


def _cuda_x(op: str, x: Tensor, cols: int, supported, max_m: int, planes: tuple) -> Tensor:
    """x checked for a fused palette kernel `op` (bf16 [M, cols], M within `supported`), made
    16-byte aligned with a unit column stride for the kernel's 16-byte loads."""
    if x.dim() != 2 or x.size(1) != cols or x.dtype != torch.bfloat16:
        raise ValueError(f"{op} takes bf16 x [M, {cols}], got {x.dtype} {tuple(x.shape)}")
    if not supported(x.size(0), cols):
        raise ValueError(f"{op} takes 1..{max_m} rows of x and cols % {plan.PMMA_TILE_K} == 0, "
                         f"got {x.size(0)} rows, {cols} cols")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
    _ext.require_contiguous(op, *planes[:4])
    _ext.same_device(op, x, *planes)
    return x


@palette_matmul.register_kernel("cuda")
def _palette_matmul_cuda(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, splits, stage_tiles=1, x_shared=False,
      tiled=False, wgmma=False, vrow=None):
    x = _cuda_x("palette_matmul", x, cols, palette_supported, plan.PMMA_MAX_M,
                (sm, idx, vpos, vexp, workspace, counters))
    vr = _ext.vrow_ptr("palette_matmul", vrow, x, rows + 1)
    M = x.size(0)
    if splits > 1 or wgmma:
        if workspace.dtype != torch.float32 or workspace.numel() < palette_workspace_elems(M, rows, splits, cols,
                                                                                            wgmma):
            raise ValueError("palette_matmul: workspace too small")
    if splits > 1:
        if counters.dtype != torch.int32 or counters.numel() < palette_counters_elems(rows):
            raise ValueError("palette_matmul: counters too small")
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemm(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                        bytes(palette), _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp), splits,
                                        _ext.ptr(workspace), _ext.ptr(counters), _ext.ptr(y), y.stride(0),
                                        _ext.stream(x), stage_tiles, plan.PMMA_XS_WGMMA if wgmma else int(x_shared),
                                        int(tiled), vr)
    return y


def palette_gemv_parts(rows: int, cols: int, device, variant: int = 0) -> int:
    """Warps per row (per 16-row tile for the tensor-core variant) of the palette GEMV on
    `device` (kernel_plan.pgemv_variant_parts; 1 off CUDA)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return plan.pgemv_variant_parts(rows, cols, _num_sms(device), variant)


def palette_gemv_supported(M: int, cols: int, variant: int = 0) -> bool:
    """Whether the CUDA GEMV `variant` takes a batch of M rows against a weight with `cols` columns."""
    return plan.pgemv_supported(M, cols, variant)


@torch.library.custom_op("unweight::palette_gemv", mutates_args=())
def palette_gemv(x: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, rows: int, cols: int,
                 palette: List[int], parts: int, variant: int = 0, tiled: bool = False,
                 vrow: Optional[Tensor] = None) -> Tensor:
    raise NotImplementedError(f"unweight::palette_gemv has no kernel for device {x.device}")


@palette_gemv.register_fake
def _(x, sm, idx, vpos, vexp, rows, cols, palette, parts, variant=0, tiled=False, vrow=None):
    return x.new_empty((x.size(0), rows))


@palette_gemv.register_kernel("cpu")
def _palette_gemv_cpu(x, sm, idx, vpos, vexp, rows, cols, palette, parts, variant=0, tiled=False, vrow=None):
    if variant == plan.PGEMV_VARIANT_MMA_SPLIT:  # (the CPU decode reads the stored layout only)
        raise ValueError("palette_gemv: the split layout (PGEMV_VARIANT_MMA_SPLIT) runs on CUDA only")
    return torch.ops.unweight.palette_matmul(x, sm, idx, vpos, vexp, x.new_empty(0, dtype=torch.float32),
                                             x.new_empty(0, dtype=torch.int32), rows, cols, palette, 1,
                                             tiled=tiled)


@palette_gemv.register_kernel("cuda")
def _palette_gemv_cuda(x, sm, idx, vpos, vexp, rows, cols, palette, parts, variant=0, tiled=False, vrow=None):
    x = _cuda_x("palette_gemv", x, cols, lambda M, K: palette_gemv_supported(M, K, variant),
                plan.pgemv_max_m(variant), (sm, idx, vpos, vexp))
    vr = _ext.vrow_ptr("palette_gemv", vrow, x, rows + 1)
    M = x.size(0)
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemv(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                        bytes(palette), _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp), parts,
                                        _ext.ptr(y), y.stride(0), _ext.stream(x), variant, int(tiled), vr)
    return y


def palette_gemv_probe(x: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, rows: int, cols: int,
                       palette: List[int], parts: int, probe: str, tiled: bool = False,
                       vrow: Optional[Tensor] = None) -> Tensor:
    """A timing probe of the register-direct tensor-core GEMV (palette_gemv's "mma" variant):
    its launch with one stage left out, for a breakdown of the kernel's time; the result is not
    the product.  probe: "no_decode" (the loaded words go to the tensor cores undecoded),
    "no_mma" (decoded, but neither x loaded nor multiplied) or "stream" (the loads alone).
    x bf16 [M, cols] with M <= 8, the planes as palette_gemv takes them with a paired palette
    (ops.paired_palette), on one CUDA device, vrow as palette_gemv takes it.  Returns bf16
    [M, rows]."""
    if probe not in plan.PGEMV_PROBES:
        raise ValueError(f"palette_gemv_probe: probe must be one of {sorted(plan.PGEMV_PROBES)}, got {probe!r}")
    if x.device.type != "cuda":
        raise ValueError("palette_gemv_probe runs on a CUDA device only (a timing probe)")
    x = _cuda_x("palette_gemv_probe", x, cols,
                lambda M, K: M <= 8 and palette_gemv_supported(M, K, plan.PGEMV_VARIANT_MMA), 8, (sm, idx, vpos, vexp))
    vr = _ext.vrow_ptr("palette_gemv_probe", vrow, x, rows + 1)
    M = x.size(0)
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemv_probe(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                              bytes(palette), _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp), parts,
                                              _ext.ptr(y), y.stride(0), _ext.stream(x), plan.PGEMV_PROBES[probe],
                                              int(tiled), vr)
    return y


def programmatic_launch(on: bool | None = None) -> bool:
    """Programmatic dependent launch of the tensor-core GEMV kernels (palette_gemv's MMA
    variants and palette_gemv_queue, on sm_90+ GPUs) and of the wgmma GEMM (palette_gemm with
    wgmma: its x reorder, and the GEMM under it).  On, a launch may start while the launch
    ahead of it on the stream ends: it streams its planes and waits (griddepcontrol.wait) before
    it touches x, y or the scratch, and lets the next launch start only once it has waited, so
    the results are the same; a CUDA graph keeps the dependency.  The one thing it asks: a
    weight's planes are not written by the launch right ahead of its matmul.  Planes are written
    at load; turning it on synchronizes every CUDA device, and runtime.prepare synchronizes the
    devices it wrote planes on while it is on.  Process-wide, off by default.  `on` sets it;
    returns the setting (False where the CUDA kernels are not built)."""
    if on and _ext.cuda_kernels_built() and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
    return _kernel_switch("programmatic_launch", on)


def wgmma_tile_wait(on: bool | None = None) -> bool:
    """The wgmma GEMM's schedule (palette_matmul with wgmma), a timing probe: off (the default),
    a tile's four wgmmas run under the next tile's decode and x's stages are refilled one stage
    later than the weights'; on, each tile waits for its own wgmmas, and x is refilled as far
    ahead as the weights.  The same wgmmas in the same order either way, so the same bits; the
    benchmark times both.  Applies to the emulation too.  Process-wide.  `on` sets it; returns
    the setting (False where the CUDA kernels are not built)."""
    return _kernel_switch("wgmma_tile_wait", on)


def gemv_x_prefetch(on: bool | None = None) -> bool:
    """Whether the tensor-core GEMVs (palette_gemv's MMA variants, palette_gemv_queue,
    palette_gemv_slots, and the timing probes that load x) ask x's lines of a step into L1 two
    steps before the step's mma read them: on (the default), a step's x loads wait on L1; off,
    on L2 each time a warp's part reaches x's next line.  The same bits either way; the
    benchmark times both.  Applies to the emulation too.  Process-wide.  `on` sets it; returns
    the setting (False where the CUDA kernels are not built)."""
    return _kernel_switch("gemv_x_prefetch", on)


def _kernel_switch(name: str, on: bool | None) -> bool:
    """The extension's process-wide switch `name` (set_<name> / <name>): set to `on` unless
    None; returns the setting (False where the CUDA kernels are not built)."""
    if not _ext.cuda_kernels_built():
        return False
    mod = _ext.cuda_module()
    if on is not None:
        getattr(mod, "set_" + name)(bool(on))
    return bool(getattr(mod, name)())


# ------------------------------------------------------------------------ palette_gemv_queue


def palette_gemv_queue_units(rows: int, cols: int, device) -> int:
    """Units per 16-row tile of the queued tensor-core GEMV on `device`
    (kernel_plan.pgemv_mma_queue_units; 1 off CUDA)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return plan.pgemv_mma_queue_units(rows, cols, _num_sms(device))


def palette_gemv_queue_workspace(M: int, rows: int, units: int) -> int:
    """fp32 elements palette_gemv_queue needs at batch M: its units' sums."""
    return plan.pgemv_mma_queue_workspace(rows, units, M)


def palette_gemv_queue_workspace_max(rows: int, cols: int, device) -> int:
    """fp32 elements that cover palette_gemv_queue's unit sums at every batch it takes on `device`."""
    return palette_gemv_queue_workspace(plan.PGEMV_MMA_MAX_M, rows, palette_gemv_queue_units(rows, cols, device))


def palette_gemv_queue_counters(rows: int) -> int:
    """int32 counters palette_gemv_queue needs: its queue and one arrival count per 16-row tile."""
    return plan.pgemv_mma_queue_counters(rows)


@torch.library.custom_op("unweight::palette_gemv_queue", mutates_args=("workspace", "counters"))
def palette_gemv_queue(x: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, workspace: Tensor,
                       counters: Tensor, rows: int, cols: int, palette: List[int], units: int,
                       tiled: bool = False, vrow: Optional[Tensor] = None) -> Tensor:
    raise NotImplementedError(f"unweight::palette_gemv_queue has no kernel for device {x.device}")


@palette_gemv_queue.register_fake
def _(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, units, tiled=False, vrow=None):
    return x.new_empty((x.size(0), rows))


@palette_gemv_queue.register_kernel("cpu")
def _palette_gemv_queue_cpu(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, units, tiled=False,
                            vrow=None):
    return torch.ops.unweight.palette_matmul(x, sm, idx, vpos, vexp, x.new_empty(0, dtype=torch.float32),
                                             x.new_empty(0, dtype=torch.int32), rows, cols, palette, 1,
                                             tiled=tiled)


@palette_gemv_queue.register_kernel("cuda")
def _palette_gemv_queue_cuda(x, sm, idx, vpos, vexp, workspace, counters, rows, cols, palette, units, tiled=False,
                             vrow=None):
    v = plan.PGEMV_VARIANT_MMA_QUEUE
    x = _cuda_x("palette_gemv_queue", x, cols, lambda M, K: palette_gemv_supported(M, K, v), plan.pgemv_max_m(v),
                (sm, idx, vpos, vexp, workspace, counters))
    vr = _ext.vrow_ptr("palette_gemv_queue", vrow, x, rows + 1)
    M = x.size(0)
    if units > 1 and (workspace.dtype != torch.float32
                      or workspace.numel() < palette_gemv_queue_workspace(M, rows, units)):
        raise ValueError("palette_gemv_queue: workspace too small")
    if counters.dtype != torch.int32 or counters.numel() < palette_gemv_queue_counters(rows):
        raise ValueError("palette_gemv_queue: counters too small")
    ctas = plan.pgemv_mma_queue_grid(rows, units, _num_sms(x.device), plan.pgemv_mma_queue_ctas_per_sm(M))
    y = torch.empty((M, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemv_queue(_ext.ptr(x), x.stride(0), M, _ext.ptr(sm), _ext.ptr(idx), rows, cols,
                                              bytes(palette), _ext.ptr(vpos), vpos.numel(), _ext.ptr(vexp), units,
                                              ctas, _ext.ptr(workspace) if workspace.numel() else 0,
                                              _ext.ptr(counters), _ext.ptr(y), y.stride(0), _ext.stream(x),
                                              int(tiled), vr)
    return y


# ------------------------------------------------------------------------ palette_gemv_slots


def _check_gemv_slots(x, ids, sm, idx, vpos, vexp, palette):
    if x.dim() != 2 or ids.dim() != 1 or sm.dim() != 3 or idx.dim() != 3 or vpos.dim() != 2 or vexp.dim() != 3:
        raise ValueError("palette_gemv_slots: x 2-D, ids 1-D, sm, idx, vexp 3-D, vpos 2-D")
    n, rows, cols = sm.shape
    if (tuple(x.shape) != (ids.numel(), cols) or tuple(idx.shape) != (n, rows, (cols + 1) // 2)
            or vpos.shape[0] != n or tuple(vexp.shape) != (n, vpos.shape[1], 32)):
        raise ValueError(f"palette_gemv_slots: shapes do not fit a stack {tuple(sm.shape)}, x {tuple(x.shape)} "
                         f"and {ids.numel()} slots")
    if x.dtype != torch.bfloat16 or ids.dtype != torch.int64 or vpos.dtype != torch.uint32:
        raise ValueError("palette_gemv_slots: x must be bf16, ids int64 and vpos uint32")
    if not 1 <= len(palette) <= 16:
        raise ValueError(f"palette_gemv_slots: palette must have 1..16 entries, got {len(palette)}")
    _ext.require_contiguous("palette_gemv_slots", ids, sm, idx, vpos, vexp)
    _ext.same_device("palette_gemv_slots", x, ids, sm, idx, vpos, vexp)


@torch.library.custom_op("unweight::palette_gemv_slots", mutates_args=("err",))
def palette_gemv_slots(x: Tensor, ids: Tensor, sm: Tensor, idx: Tensor, vpos: Tensor, vexp: Tensor, err: Tensor,
                       palette: List[int], parts: int, vrow: Optional[Tensor] = None) -> Tensor:
    raise NotImplementedError(f"unweight::palette_gemv_slots has no kernel for device {x.device}")


@palette_gemv_slots.register_fake
def _(x, ids, sm, idx, vpos, vexp, err, palette, parts, vrow=None):
    return x.new_empty((x.size(0), sm.size(1)))


@palette_gemv_slots.register_kernel("cpu")
def _palette_gemv_slots_cpu(x, ids, sm, idx, vpos, vexp, err, palette, parts, vrow=None):
    # The reference: each slot's expert decoded (decode_palette_slots, which raises on a bad id),
    # then fp32 products with one rounding.
    _check_gemv_slots(x, ids, sm, idx, vpos, vexp, palette)
    S, (_, rows, cols) = ids.numel(), sm.shape
    w = torch.empty((S, rows, cols), dtype=torch.bfloat16)
    torch.ops.unweight.decode_palette_slots(ids, sm, idx, vpos, vexp, w, err, palette)
    return torch.einsum("sk,snk->sn", x.float(), w.float()).to(torch.bfloat16)


@palette_gemv_slots.register_kernel("cuda")
def _palette_gemv_slots_cuda(x, ids, sm, idx, vpos, vexp, err, palette, parts, vrow=None):
    _check_gemv_slots(x, ids, sm, idx, vpos, vexp, palette)
    S, (E, rows, cols) = ids.numel(), sm.shape
    x = _cuda_x("palette_gemv_slots", x, cols, lambda M, K: K % plan.PMMA_TILE_K == 0 and M <= 65535, 65535,
                (sm, idx, vpos, vexp))
    vr = _ext.vrow_ptr("palette_gemv_slots", vrow, x, E * (rows + 1))
    y = torch.empty((S, rows), dtype=torch.bfloat16, device=x.device)
    with torch.cuda.device_of(x):
        _ext.cuda_module().palette_gemv_slots(_ext.ptr(x), x.stride(0), _ext.ptr(ids), S, E, _ext.ptr(sm),
                                              _ext.ptr(idx), rows, cols, bytes(palette), _ext.ptr(vpos),
                                              vpos.shape[1], _ext.ptr(vexp), parts, _ext.ptr(y), y.stride(0),
                                              _ext.ptr(err), _ext.stream(x), vr)
    return y
