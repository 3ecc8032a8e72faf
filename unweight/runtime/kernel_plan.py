"""Launch geometry of the unweight CUDA kernels, mirrored from csrc/cuda/kernel_plan.h.

Pure Python, no torch or CUDA: the Python side sizes scratch buffers and grids with it, and
tests/cuda/test_kernel_logic.py checks on odd shapes that the thread -> work maps cover every
element exactly once and (when ``unweight._cuda`` is built) agree with the C++ header.
Change a constant here and in kernel_plan.h together.
"""
from __future__ import annotations

from ..format import constants as C

HUFF_THREADS = 64
PAL_VEC = 8
PAL_THREADS = 256
WARP = 32
WARP_KERNEL_THREADS = 256
WARPS_PER_CTA = WARP_KERNEL_THREADS // WARP
ENC_THREADS = 256
HIST_THREADS = 256
HIST_MAX_CTAS = 1024
SCAN_THREADS = 1024
GEMM_THREADS = 128
GEMM_ROWS_PER_CTA = GEMM_THREADS // WARP
GEMM_VEC = 8
GEMM_STEP = WARP * GEMM_VEC
GEMM_MAX_M = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- huffman decode: one thread per segment ------------------------------------------------
def huffman_grid(n_sel_segments: int) -> int:
    """CTAs (of HUFF_THREADS threads) for a selection of n segments."""
    return cdiv(n_sel_segments, HUFF_THREADS)


def huffman_unit(i: int, g0: int, c0: int, n_sel_g: int) -> tuple[int, int]:
    """Global thread index -> (row group, column chunk); group-fastest like the CPU codec."""
    return g0 + i % n_sel_g, c0 + i // n_sel_g


def segment_rect(g: int, c: int, rows: int, cols: int, R: int, C_: int) -> tuple[int, int, int, int]:
    """Rows [r0, r1) and columns [k0, k1) of segment (g, c)."""
    return g * R, min(rows, (g + 1) * R), c * C_, min(cols, (c + 1) * C_)


# --- palette decode: PAL_VEC weights of one row per thread --------------------------------
def pal_threads_per_row(n_cols: int) -> int:
    return cdiv(n_cols, PAL_VEC)


def pal_grid(n_rows: int, n_cols: int) -> int:
    return cdiv(n_rows * pal_threads_per_row(n_cols), PAL_THREADS)


def pal_unit(t: int, n_cols: int) -> tuple[int, int, int]:
    """Thread t -> (relative row, relative first column, weight count 1..PAL_VEC)."""
    tpr = pal_threads_per_row(n_cols)
    k = (t % tpr) * PAL_VEC
    return t // tpr, k, min(PAL_VEC, n_cols - k)


# --- warp-per-item kernels (verbatim patch/gather, row counts, compaction, GEMM correction)
def warp_grid(n_items: int) -> int:
    return cdiv(n_items, WARPS_PER_CTA)


def verbatim_lane_cols(vid: int, lane: int, cols: int) -> list[int]:
    """Columns (absolute, < cols) lane `lane` handles in verbatim block id `vid`."""
    b = vid % blocks_per_row(cols)
    return [b * C.PAL_BLOCK + j for j in range(lane, C.PAL_BLOCK, WARP) if b * C.PAL_BLOCK + j < cols]


# --- palette encode: one thread per (row, PAL_BLOCK block) -----------------------------
def blocks_per_row(cols: int) -> int:
    return cdiv(cols, C.PAL_BLOCK)


def enc_grid(rows: int, cols: int) -> int:
    return cdiv(rows * blocks_per_row(cols), ENC_THREADS)


# --- exponent histogram: grid-stride over 16-byte vectors ---------------------------------
def hist_grid(n_bytes: int) -> int:
    return max(1, min(HIST_MAX_CTAS, cdiv(cdiv(n_bytes, 16), HIST_THREADS)))


# --- fused GEMV/GEMM: one warp per W row ---------------------------------------------------
def gemm_grid(n_rows: int) -> int:
    return cdiv(n_rows, GEMM_ROWS_PER_CTA)


def gemm_steps(cols: int) -> int:
    return cdiv(cols, GEMM_STEP)


def gemm_lane_cols(lane: int, cols: int) -> list[int]:
    """First columns of the GEMM_VEC-wide chunks lane `lane` accumulates (cols % 8 == 0)."""
    return [c for s in range(gemm_steps(cols)) for c in (s * GEMM_STEP + lane * GEMM_VEC,) if c < cols]


def gemm_supported(M: int, K: int) -> bool:
    """Whether palette_gemm takes this problem (else: decode + dense matmul)."""
    return 1 <= M <= GEMM_MAX_M and K % GEMM_VEC == 0
