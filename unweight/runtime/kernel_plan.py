"""Launch geometry of the unweight CUDA kernels, mirrored from csrc/cuda/kernel_plan.h.

Pure Python, no torch or CUDA: the Python side sizes scratch buffers and grids with it, and
tests/cuda/test_kernel_logic.py checks on odd shapes that the thread -> work maps cover every
element exactly once and (when ``unweight._cuda`` is built) agree with the C++ header.
Change a constant here and in kernel_plan.h together.
"""
from __future__ import annotations

from ..format import constants as C

HUFF_THREADS = 128
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
HGEMM_THREADS = 64
HGEMM_MAX_M = 16
HGEMM_REDUCE_THREADS = 256
HGEMM_MAX_CHUNKS = 65535
HGEMM_LUT_BYTES = C.HUFF_NUM_CTX << (C.HUFF_MAX_CODE_LEN + 1)
# Shared memory one CTA may opt in to on the smallest supported target (sm_80: 163 KiB);
# sm_90 allows 227 KiB, and the launcher checks the real device limit.
HGEMM_SMEM_LIMIT_SM80 = 166912


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- huffman decode: one thread per chain (FORMAT.md "Checkpoint index"), grid stride ------
def huffman_chains_per_segment(S: int, P: int) -> int:
    """Chains of one segment: P + 1 with an index of interval S > 0, else 1."""
    return P + 1 if S > 0 else 1


def huffman_grid(n_items: int, max_ctas: int) -> int:
    """CTAs (of HUFF_THREADS threads) for n chains or gather units, at most max_ctas."""
    return min(cdiv(n_items, HUFF_THREADS), max_ctas)


def huffman_chain(t: int, chains_per_segment: int) -> tuple[int, int]:
    """Chain t -> (selected segment i for huffman_unit, checkpoint j)."""
    return t // chains_per_segment, t % chains_per_segment


def chain_weights(j: int, n_s: int, S: int) -> tuple[int, int]:
    """Weights [first, end) of segment weights 0..n_s-1 that chain j decodes (empty past the end)."""
    if S <= 0:
        return (0, n_s) if j == 0 else (n_s, n_s)
    return min(n_s, j * S), min(n_s, (j + 1) * S)


def hgather_units(S: int, P: int, width: int) -> int:
    """Parts per (id, chunk) of the Huffman row gather: the chains a row `width` weights wide can touch."""
    return 1 if S <= 0 else min(cdiv(width, S) + 1, P + 1)


def hgather_unit(t: int, n_chunks: int, units: int) -> tuple[int, int, int]:
    """Unit t -> (id index, chunk, part); id-major."""
    return t // (n_chunks * units), (t // units) % n_chunks, t % units


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
def pgather_grid(n_ids: int, n_cols: int) -> int:
    """CTAs of the palette row gather: pal_unit's threads per row over n_ids rows."""
    return pal_grid(n_ids, n_cols)


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


# --- fused Huffman GEMV/GEMM: one thread per segment, a CTA = HGEMM_THREADS row groups of one chunk
def hgemm_mtile(M: int) -> int:
    """Batch tile (template MT) the kernel runs for M rows; 0 when M is out of range."""
    if M < 1 or M > HGEMM_MAX_M:
        return 0
    return next(t for t in (1, 2, 4, 8, 16) if M <= t)


def hgemm_grid_x(n_groups: int) -> int:
    """CTAs along x (row groups); gridDim.y is the number of column chunks."""
    return cdiv(n_groups, HGEMM_THREADS)


def hgemm_unit(bx: int, by: int, tid: int) -> tuple[int, int]:
    """Thread tid of CTA (bx, by) -> (row group, column chunk); the group may be past the end."""
    return bx * HGEMM_THREADS + tid, by


def hgemm_smem_bytes(chunk_width: int, mtile: int) -> int:
    """Dynamic shared memory of a CTA: LUT + x chunk [chunk_width, mtile] bf16 (16-byte rounded)."""
    return HGEMM_LUT_BYTES + cdiv(chunk_width * mtile * 2, 16) * 16


def hgemm_reduce_grid(M: int, N: int) -> int:
    return cdiv(M * N, HGEMM_REDUCE_THREADS)


def hgemm_workspace_elems(M: int, N: int, K: int, C_: int) -> int:
    """fp32 partial sums [ceil(K / C), M, N] the fused Huffman GEMM writes before reducing."""
    return cdiv(K, C_) * M * N


def huffman_gemm_supported(M: int, K: int, C_: int, smem_limit: int = HGEMM_SMEM_LIMIT_SM80) -> bool:
    """Whether huffman_gemm takes this problem on a device with `smem_limit` bytes of opt-in
    shared memory per CTA (else: decode + dense matmul)."""
    mt = hgemm_mtile(M)
    return mt > 0 and cdiv(K, C_) <= HGEMM_MAX_CHUNKS and hgemm_smem_bytes(min(C_, K), mt) <= smem_limit
