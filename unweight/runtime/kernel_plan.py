"""Launch geometry of the unweight CUDA kernels, mirrored from csrc/cuda/kernel_plan.h.

Pure Python, no torch or CUDA: the Python side sizes scratch buffers and grids with it, and
tests/cuda/test_kernel_logic.py checks on odd shapes that the thread -> work maps cover every
element exactly once and (when ``unweight._cuda`` is built) agree with the C++ header.
Change a constant here and in kernel_plan.h together.
"""
from __future__ import annotations

import functools

from ..format import constants as C

HUFF_THREADS = 128
# Huffman decode variants (csrc/cuda/kernel_plan.h): 0 is the extension's default, RING (the
# runtime names another where its tuning table measured one faster: tuning_table "decoders").
HUFF_VARIANT_DEFAULT = 0
HUFF_VARIANT_CHAIN = 1
HUFF_VARIANT_AHEAD = 2
HUFF_VARIANT_AHEAD2 = 3
HUFF_VARIANT_SCALAR = 4
# AHEAD with its stream refills staged through a per-lane shared-memory ring (cp.async).
HUFF_VARIANT_RING = 5
# RING in CTAs of HUFF_RING_WIDE_THREADS sharing one LUT (24 warps per SM where RING holds 16).
HUFF_VARIANT_RING_WIDE = 6
# RING in CTAs of HUFF_RING_MAX_THREADS, two per SM (32 warps per SM, at 64 registers).
HUFF_VARIANT_RING_MAX = 7
# RING's chains with two symbols per lookup, from a table indexed by the two weights' contexts
# and the next HUFF_PAIR_BITS stream bits (HUFF_PAIR_THREADS per CTA, two CTAs per SM).
HUFF_VARIANT_PAIR = 8
HUFF_DEFAULT_VARIANT = HUFF_VARIANT_RING
HUFF_VARIANTS = {"chain": HUFF_VARIANT_CHAIN, "ahead": HUFF_VARIANT_AHEAD, "ahead2": HUFF_VARIANT_AHEAD2,
                 "scalar": HUFF_VARIANT_SCALAR, "ring": HUFF_VARIANT_RING, "ring_wide": HUFF_VARIANT_RING_WIDE,
                 "ring_max": HUFF_VARIANT_RING_MAX, "pair": HUFF_VARIANT_PAIR}
HUFF_RING_SLOTS = 8
HUFF_RING_WIDE_THREADS = 256  # RING_WIDE's CTA: eight warps sharing one LUT
HUFF_RING_MAX_THREADS = 512  # RING_MAX's CTA: sixteen warps sharing one LUT
HUFF_RING_MAX_CTAS_PER_SM = 2
HUFF_PAIR_BITS = 9  # PAIR's table: 16 context pairs x 2^9 entries
HUFF_PAIR_THREADS = 256
HUFF_PAIR_CTAS_PER_SM = 2
PAL_VEC = 8
PAL_WIDE = 32  # weights per thread of the wide palette decode (PAL_VARIANT_WIDE)
PAL_WIDE_STEPS = PAL_WIDE // PAL_VEC  # its 8-weight chunks per thread
PAL_VARIANT_DEFAULT = 0
PAL_VARIANT_VEC8 = 1
PAL_VARIANT_WIDE = 2
PAL_DEFAULT_VARIANT = PAL_VARIANT_WIDE
PAL_VARIANTS = {"vec8": PAL_VARIANT_VEC8, "wide": PAL_VARIANT_WIDE}
PAL_THREADS = 256
WARP = 32
WARP_KERNEL_THREADS = 256
WARPS_PER_CTA = WARP_KERNEL_THREADS // WARP
ENC_THREADS = 256
# L2 prefetch of whole weights (csrc/cuda/prefetch.cu).
PREFETCH_THREADS = 256
PREFETCH_MAX_CTAS = 32
PREFETCH_MAX_RANGES = 4
PREFETCH_LINE = 128
# Device CRC-32 (csrc/cuda/crc32.cu): a warp per piece of CRC_STEPS 512-byte strides.
CRC_THREADS = 256
CRC_STEPS = 64
CRC_STRIDE_BYTES = 512
CRC_PIECE_BYTES = CRC_STRIDE_BYTES * CRC_STEPS
CRC_TABLE_WORDS = 16 * 256
CRC_POW_TERMS = 48
CRC_INV_TERMS = 9
CRC_MAX_CTAS = 1024
HIST_THREADS = 256
HIST_MAX_CTAS = 1024
SCAN_THREADS = 1024
# Fused palette GEMM on tensor cores (csrc/cuda/palette_matmul.cuh).
PMMA_WARPS = 4
PMMA_THREADS = PMMA_WARPS * WARP
PMMA_TILE_N = 16
PMMA_VROW_WINDOW = 2  # verbatim entries a row-index cursor reads at once (pmma_row_cursor)
PMMA_ROWS = PMMA_WARPS * PMMA_TILE_N
PMMA_TILE_K = 64
PMMA_STAGES = 4
PMMA_SM_BYTES = PMMA_TILE_N * PMMA_TILE_K
PMMA_TILE_BYTES = PMMA_SM_BYTES + PMMA_SM_BYTES // 2
PMMA_SMEM_BYTES = PMMA_WARPS * PMMA_STAGES * PMMA_TILE_BYTES + 16
PMMA_SUB_WIDE = 2  # tiles per stage of the wide-stage variant (palette_gemm stage_tiles)


PMMA_X_ROW_BYTES = 2 * PMMA_TILE_K  # one batch row of a stage's 64 columns of shared x (x_shared)


def pmma_x_stage_bytes(ntiles: int) -> int:
    """Shared x of one ring stage for a batch of `ntiles` n-tiles (8 rows each)."""
    return 8 * ntiles * PMMA_X_ROW_BYTES


def pmma_stages(x_shared: int, ntiles: int) -> int:
    """Ring stages of a palette_gemm launch: PMMA_STAGES, PMMA_WG_STAGES for the wgmma variant
    at 16 n-tiles (three CTAs per SM where four stages fit two)."""
    return PMMA_WG_STAGES if x_shared == PMMA_XS_WGMMA and ntiles > 8 else PMMA_STAGES


def pmma_smem_bytes(stage_tiles: int, ntiles: int = 0, x_shared: int = 0) -> int:
    """Dynamic shared memory of a palette_gemm launch with `stage_tiles` tiles per ring stage
    (and, x_shared, the shared-x ring of a batch of `ntiles` n-tiles; wgmma, its stages'
    mbarriers after the fix-up flag)."""
    stages = pmma_stages(x_shared, ntiles)
    return (PMMA_WARPS * stages * stage_tiles * PMMA_TILE_BYTES
            + (stages * pmma_x_stage_bytes(ntiles) if x_shared else 0) + 16
            + (8 * stages if x_shared == PMMA_XS_WGMMA else 0))
PMMA_CHUNK_M = 64
PMMA_MAX_M = 256
# The wgmma variant (sm_90a; palette_gemm x_shared == PMMA_XS_WGMMA): x in wgmma's shared-memory
# layout, wgmma.mma_async, up to PMMA_WG_CHUNK_M batch rows per CTA.
PMMA_XS_WGMMA = 2
PMMA_WG_CHUNK_M = 128
PMMA_WG_STAGES = 3  # the wgmma variant's ring at 16 n-tiles (kernel_plan.h pmma_stages)
PMMA_WG_X_THREADS = 256  # threads per CTA of the wgmma variant's x reorder (pmma_wg_x_body)
PMMA_CTAS_PER_SM = 4
PMMA_WG_CTAS_PER_SM = 3  # what the wgmma variant's splits plan for (kernel_plan.h)
PMMA_MIN_SPLIT_TILES = 4
PMMA_MAX_SPLITS = 65535

# Palette GEMV (palette_gemv.cu): batches of 1..PGEMV_MAX_M on CUDA cores, a warp streaming
# PGEMV_COLS columns of one row per step into registers; `parts` warps per row split K.
PGEMV_WARPS = 8
PGEMV_THREADS = PGEMV_WARPS * WARP
PGEMV_COLS = 512
PGEMV_UNROLL = 2
PGEMV_MAX_M = 4
PGEMV_MAX_PARTS = PGEMV_WARPS
PGEMV_CTAS_PER_SM = 3
PGEMV_WARPS_PER_SM = PGEMV_CTAS_PER_SM * PGEMV_WARPS
# The deep variant (path palette_gemv_deep): twice the loads in flight per lane, 2 CTAs per SM;
# the same bits as the default.
PGEMV_DEEP_UNROLL = 4
PGEMV_DEEP_CTAS_PER_SM = 2
# The staged variant (path palette_gemv_staged): loads land in a per-warp shared-memory ring of
# PGEMV_STAGED_DEPTH steps through cp.async, 4 CTAs per SM; the same bits as the default.
PGEMV_STAGED_DEPTH = 6
PGEMV_STAGED_SLOT = PGEMV_COLS + PGEMV_COLS // 2
PGEMV_STAGED_CTAS_PER_SM = 4
PGEMV_VARIANT_DEFAULT = 0
PGEMV_VARIANT_STD = 1
PGEMV_VARIANT_DEEP = 2
PGEMV_VARIANT_STAGED = 3
# The tensor-core variant (path palette_gemv_mma): a warp streams PGEMV_MMA_COLS columns of a
# PGEMV_MMA_ROWS-row tile per step into registers and feeds mma.sync; batches of up to
# PGEMV_MMA_MAX_M rows (past 16, four n-tiles at PGEMV_MMA4_CTAS_PER_SM CTAs per SM); the same
# parts at every batch size; tensor-core sums (not the CUDA-core variants' bits).
PGEMV_VARIANT_MMA = 4
PGEMV_MMA_ROWS = 16
PGEMV_MMA_COLS = 128
PGEMV_MMA_MAX_M = 32
PGEMV_MMA_CTAS_PER_SM = 2
PGEMV_MMA4_CTAS_PER_SM = 1
# The ring variants (staged, bulk copies) hold their loads in shared memory, so at four n-tiles
# they fit 128 registers and keep two CTAs per SM.
PGEMV_MMA4_RING_CTAS_PER_SM = 2
PGEMV_MMA_WARPS_PER_SM = PGEMV_MMA_CTAS_PER_SM * PGEMV_WARPS
PGEMV_MMA_MIN_STEPS = 4
# The staged tensor-core variant (path palette_gemv_mma_staged): the same tiles, steps, parts and
# bits, each step landing in a per-warp shared-memory ring of PGEMV_MMA_STAGED_DEPTH slots through
# cp.async.
PGEMV_VARIANT_MMA_STAGED = 5
PGEMV_MMA_STAGED_DEPTH = 4
PGEMV_MMA_STAGED_SLOT = PGEMV_MMA_ROWS * (PGEMV_MMA_COLS + PGEMV_MMA_COLS // 2)
PGEMV_MMA_STAGED_CTAS_PER_SM = 2
# The prefetching tensor-core variant (path palette_gemv_mma_prefetch): the register-direct
# variant's loads and bits, plus an L2 prefetch PGEMV_MMA_PREFETCH_STEPS steps past its loads.
PGEMV_VARIANT_MMA_PREFETCH = 6
PGEMV_MMA_PREFETCH_STEPS = 2
# The bulk-copy tensor-core variant (path palette_gemv_mma_bulk; sm_90+, tile-major planes only):
# the same tiles, steps, parts and bits, each step fetched by two cp.async.bulk copies of one lane
# into a per-warp ring of PGEMV_MMA_BULK_DEPTH slots, one mbarrier per slot.
PGEMV_VARIANT_MMA_BULK = 7
PGEMV_MMA_BULK_DEPTH = 4
PGEMV_MMA_BULK_SLOT = PGEMV_MMA_ROWS * (PGEMV_MMA_COLS + PGEMV_MMA_COLS // 2)
PGEMV_MMA_BULK_CTAS_PER_SM = 2
# The queued tensor-core variant (path palette_gemv_mma_queue; ops.palette_gemv_queue): the
# register-direct variant's steps and sums in units of a tile's steps, handed out from a queue to
# a persistent grid; units per tile for about PGEMV_MMA_QUEUE_UNITS_PER_WARP units per resident
# warp, each at least PGEMV_MMA_QUEUE_MIN_STEPS steps, at most PGEMV_MMA_QUEUE_MAX_UNITS.
# Counters: the queue's head, the warps done, one arrival count per tile.
PGEMV_VARIANT_MMA_QUEUE = 8
PGEMV_MMA_QUEUE_UNITS_PER_WARP = 3
PGEMV_MMA_QUEUE_MIN_STEPS = 2
PGEMV_MMA_QUEUE_MAX_UNITS = 64
PGEMV_QUEUE_HEAD = 0
PGEMV_QUEUE_DONE = 1
PGEMV_QUEUE_TILES = 2
# The register-direct tensor-core variant on planes held in the split layout
# (ops.split_palette_planes: BF16 low bytes, and codes of sign and exponent half): its bits, 6
# decode operations per 4 weights instead of 8; palettes of at most PAL_SPLIT_HALVES exponent
# halves e >> 1.  Not in PGEMV_VARIANTS: it takes only split planes.
PGEMV_VARIANT_MMA_SPLIT = 9
PAL_SPLIT_HALVES = 8
# Timing probes of the register-direct tensor-core GEMV (ops.palette_gemv_probe; benchmarks
# only, their y is not the product): NO_DECODE leaves the palette decode out, NO_MMA the x loads
# and the mma, STREAM keeps only the loads.
PGEMV_PROBE_NONE = 0
PGEMV_PROBE_NO_DECODE = 1
PGEMV_PROBE_STREAM = 2
PGEMV_PROBE_NO_MMA = 3
PGEMV_PROBES = {"no_decode": PGEMV_PROBE_NO_DECODE, "no_mma": PGEMV_PROBE_NO_MMA, "stream": PGEMV_PROBE_STREAM}
PGEMV_VARIANTS = {"std": PGEMV_VARIANT_STD, "deep": PGEMV_VARIANT_DEEP, "staged": PGEMV_VARIANT_STAGED,
                  "mma": PGEMV_VARIANT_MMA, "mma_staged": PGEMV_VARIANT_MMA_STAGED,
                  "mma_prefetch": PGEMV_VARIANT_MMA_PREFETCH, "mma_bulk": PGEMV_VARIANT_MMA_BULK}
PGEMV_SMEM_BYTES = PGEMV_WARPS * PGEMV_MAX_M * 4
PGEMV_STAGED_SMEM_BYTES = PGEMV_SMEM_BYTES + PGEMV_WARPS * PGEMV_STAGED_DEPTH * PGEMV_STAGED_SLOT
PGEMV_MMA_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_ROWS * PGEMV_MMA_MAX_M * 4
PGEMV_MMA_STAGED_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_STAGED_DEPTH * PGEMV_MMA_STAGED_SLOT
PGEMV_MMA_BULK_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_BULK_DEPTH * (PGEMV_MMA_BULK_SLOT + 8)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- huffman decode: one thread per chain (FORMAT.md "Checkpoint index"), grid stride ------
def huffman_chains_per_segment(S: int, P: int) -> int:
    """Chains of one segment: P + 1 with an index of interval S > 0, else 1."""
    return P + 1 if S > 0 else 1


def huffman_grid(n_items: int, max_ctas: int, threads: int = HUFF_THREADS) -> int:
    """CTAs (of `threads` threads: HUFF_THREADS, RING_WIDE's and RING_MAX's CTAs) for n
    chains or gather units, at most max_ctas."""
    return min(cdiv(n_items, threads), max_ctas)


def huffman_ways(variant: int) -> int:
    """Chains one thread of a Huffman decode variant works on at a time."""
    return 2 if variant == HUFF_VARIANT_AHEAD2 else 1


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
    """Chunk t -> (relative row, relative first column, weight count 1..PAL_VEC)."""
    tpr = pal_threads_per_row(n_cols)
    k = (t % tpr) * PAL_VEC
    return t // tpr, k, min(PAL_VEC, n_cols - k)


# --- the wide palette decode: PAL_WIDE_STEPS chunks per thread, lanes on consecutive chunks
def pal_wide_threads(n_rows: int, n_cols: int) -> int:
    return cdiv(n_rows * pal_threads_per_row(n_cols), WARP * PAL_WIDE_STEPS) * WARP


def pal_wide_grid(n_rows: int, n_cols: int) -> int:
    return cdiv(pal_wide_threads(n_rows, n_cols), PAL_THREADS)


def pal_wide_chunk(t: int, s: int) -> int:
    """Chunk (pal_unit's numbering) that thread t decodes at step s."""
    return (t // WARP) * (WARP * PAL_WIDE_STEPS) + s * WARP + t % WARP


def pal_wide_units(t: int, n_cols: int) -> list[tuple[int, int, int]]:
    """pal_unit of each step's chunk (the C++ steps from the first without dividing again)."""
    return [pal_unit(pal_wide_chunk(t, s), n_cols) for s in range(PAL_WIDE_STEPS)]


# --- warp-per-item kernels (verbatim patch/gather, row counts, compaction)
def pgather_grid(n_ids: int, n_cols: int) -> int:
    """CTAs of the palette row gather: pal_unit's threads per row over n_ids rows."""
    return pal_grid(n_ids, n_cols)


def warp_grid(n_items: int) -> int:
    return cdiv(n_items, WARPS_PER_CTA)


def verbatim_lane_cols(vid: int, lane: int, cols: int) -> list[int]:
    """Columns (absolute, < cols) lane `lane` handles in verbatim block id `vid`."""
    b = vid % blocks_per_row(cols)
    return [b * C.PAL_BLOCK + j for j in range(lane, C.PAL_BLOCK, WARP) if b * C.PAL_BLOCK + j < cols]


# --- palette plane order in device memory (kernel_plan.h: file order or tile-major) -------
PAL_TILE_ROWS = 16
PAL_TILE_COLS = 64


def pal_tiled_ok(N: int, K: int) -> bool:
    """Whether an [N, K] palette weight can be held tile-major (whole 16 x 64 tiles)."""
    return N > 0 and K > 0 and N % PAL_TILE_ROWS == 0 and K % PAL_TILE_COLS == 0


def pal_ld_row(K: int, tiled: bool) -> int:
    return PAL_TILE_COLS if tiled else K


def pal_ld_tile(tiled: bool) -> int:
    return PAL_TILE_ROWS * PAL_TILE_COLS if tiled else PAL_TILE_COLS


def pal_offset(r: int, k: int, K: int, tiled: bool) -> int:
    """Byte offset of sign+mantissa (r, k) in the plane (idx (r, k // 2): half of it, k even)."""
    return ((r // PAL_TILE_ROWS) * PAL_TILE_ROWS * K + (r % PAL_TILE_ROWS) * pal_ld_row(K, tiled)
            + (k // PAL_TILE_COLS) * pal_ld_tile(tiled) + k % PAL_TILE_COLS)


def pal_sm_index(r: int, k: int, cols: int, tiled: bool) -> int:
    """Byte of sign+mantissa (r, k) in either order, any width."""
    return pal_offset(r, k, cols, True) if tiled else r * cols + k


def pal_idx_index(r: int, k: int, cols: int, tiled: bool) -> int:
    """Index byte holding (r, k)'s nibble (bit 4 (k % 2)); a file-order row is ceil(cols / 2) bytes."""
    return pal_offset(r, k, cols, True) // 2 if tiled else r * ((cols + 1) // 2) + k // 2


# --- palette encode: one thread per (row, PAL_BLOCK block) -----------------------------
def blocks_per_row(cols: int) -> int:
    return cdiv(cols, C.PAL_BLOCK)


def enc_grid(rows: int, cols: int) -> int:
    return cdiv(rows * blocks_per_row(cols), ENC_THREADS)


# --- exponent histogram: grid-stride over 16-byte vectors ---------------------------------
def prefetch_grid(lines: int) -> int:
    return max(1, min(PREFETCH_MAX_CTAS, cdiv(lines, PREFETCH_THREADS)))


def crc_pieces(nbytes: int) -> int:
    """Pieces of one CRC range: its 16-byte words (it need not start on one) in pieces of CRC_STEPS strides."""
    return 0 if nbytes <= 0 else cdiv(cdiv(nbytes + 15, 16), CRC_PIECE_BYTES // 16)


def crc_grid(pieces: int) -> int:
    return max(1, min(CRC_MAX_CTAS, cdiv(pieces, CRC_THREADS // 32)))


def hist_grid(n_bytes: int) -> int:
    return max(1, min(HIST_MAX_CTAS, cdiv(cdiv(n_bytes, 16), HIST_THREADS)))


# --- fused palette GEMM (tensor cores) ----------------------------------------------------
def pmma_ntiles(M: int, wg: bool = False) -> int:
    """n-tiles of 8 batch rows per CTA for a batch of M rows (wg: the wgmma variant, up to 16);
    0 when M is out of range."""
    if M < 1 or M > PMMA_MAX_M:
        return 0
    return next((t for t in ((1, 2, 4, 8) if wg else (1, 2, 4)) if M <= 8 * t), 16 if wg else 8)


def pmma_chunk_m(wg: bool = False) -> int:
    """Batch rows per chunk (one CTA per row block and chunk)."""
    return PMMA_WG_CHUNK_M if wg else PMMA_CHUNK_M


def pmma_chunks(M: int, wg: bool = False) -> int:
    """Batch chunks of pmma_chunk_m rows, one CTA each per row block and split."""
    return 1 if M < 1 else cdiv(M, pmma_chunk_m(wg))


def pmma_row_blocks(N: int) -> int:
    """Blocks of PMMA_ROWS rows of W."""
    return cdiv(N, PMMA_ROWS)


def pmma_grid_x(N: int, M: int, wg: bool = False) -> int:
    """CTAs along x: row blocks x batch chunks (gridDim.y is the K split)."""
    return pmma_row_blocks(N) * pmma_chunks(M, wg)


def pmma_splits(N: int, K: int, num_sms: int, M: int = 1, wg: bool = False) -> int:
    """K splits for an [N, K] weight at batch M on a device with num_sms SMs (M counts only
    through its chunks, so every batch of 1..64 (wg: 1..128) gets the same split and bits)."""
    n_kt, units = K // PMMA_TILE_K, pmma_row_blocks(N) * pmma_chunks(M, wg)
    if n_kt < 1 or units < 1:
        return 1
    s = (num_sms * (PMMA_WG_CTAS_PER_SM if wg else PMMA_CTAS_PER_SM) + units // 2) // units
    s = min(s, n_kt // PMMA_MIN_SPLIT_TILES, PMMA_MAX_SPLITS)
    if s < 1:
        return 1
    return cdiv(n_kt, cdiv(n_kt, s))


def pmma_split_tiles(K: int, splits: int) -> int:
    """K tiles (of PMMA_TILE_K columns) per split; the last split may hold fewer."""
    return cdiv(K // PMMA_TILE_K, splits)


def pmma_workspace_elems(M: int, N: int, splits: int) -> int:
    """fp32 partial sums [splits, M, N] a split launch writes (0 without a split)."""
    return splits * M * N if splits > 1 else 0


def pmma_counters(N: int) -> int:
    """int32 arrival counters a split launch uses (one per row block and batch chunk, counted
    for the largest batch), zero between launches."""
    return pmma_grid_x(N, PMMA_MAX_M)


def pmma_wg_x_rows(M: int) -> int:
    """Rows of the wgmma variant's x as stage images (its batch chunks' rows; those past M zeros)."""
    return pmma_chunks(M, True) * 8 * pmma_ntiles(M, True)


def pmma_wg_x_at(M: int, N: int, splits: int) -> int:
    """fp32 element of the workspace where the wgmma variant's x images (bf16, pmma_wg_x_rows(M)
    x K) start: after the partial sums, on a 16-byte boundary."""
    return (pmma_workspace_elems(M, N, splits) + 3) // 4 * 4


def pmma_workspace_need(M: int, N: int, K: int, splits: int, wg: bool = False) -> int:
    """fp32 workspace elements a launch needs: the partials, and for wgmma its x after them."""
    return pmma_wg_x_at(M, N, splits) + pmma_wg_x_rows(M) * K // 2 if wg else pmma_workspace_elems(M, N, splits)


@functools.lru_cache(maxsize=1024)
def pmma_workspace_max(N: int, K: int, num_sms: int) -> int:
    """The most workspace any batch 1..PMMA_MAX_M needs, either variant (the largest batch of
    each chunk count).  Remembered per shape: every fused GEMM forward asks."""
    return max(pmma_workspace_need(M, N, K, pmma_splits(N, K, num_sms, M, wg), wg)
               for wg in (False, True) for M in range(pmma_chunk_m(wg), PMMA_MAX_M + 1, pmma_chunk_m(wg)))


def pmma_supported(M: int, K: int) -> bool:
    """Whether palette_gemm takes this problem (else: decode + dense matmul)."""
    return pmma_ntiles(M) > 0 and K > 0 and K % PMMA_TILE_K == 0


# --- palette GEMV ----------------------------------------------------------------------------
def pgemv_parts_of(units: int, steps: int, warps: int, min_steps: int) -> int:
    """The rule of both GEMVs: `units` rows or tiles of `steps` steps each, at most `warps` warps
    resident, each part at least `min_steps` steps."""
    p = 1
    while 2 * p <= PGEMV_MAX_PARTS and units * 2 * p <= warps and steps >= 2 * p * min_steps:
        p *= 2
    return p


def pgemv_parts(N: int, K: int, num_sms: int) -> int:
    """Warps per row: the largest power of two (<= PGEMV_MAX_PARTS) keeping N * parts within the
    warps the SMs hold and each part at least two PGEMV_UNROLL batches of steps."""
    return pgemv_parts_of(N, cdiv(K, PGEMV_COLS), num_sms * PGEMV_WARPS_PER_SM, 2 * PGEMV_UNROLL)


def pgemv_grid(N: int, parts: int) -> int:
    return cdiv(N * parts, PGEMV_WARPS)


def pgemv_steps_of(K: int, cols: int, parts: int, part: int) -> tuple[int, int]:
    """[first, last) steps of `cols` columns that part `part` of `parts` covers."""
    steps = cdiv(K, cols)
    per = cdiv(steps, parts)
    first = min(part * per, steps)
    return first, min(first + per, steps)


def pgemv_steps(K: int, parts: int, part: int) -> tuple[int, int]:
    """[first, last) steps of PGEMV_COLS columns that part `part` of `parts` covers."""
    return pgemv_steps_of(K, PGEMV_COLS, parts, part)


def pgemv_mma_parts(N: int, K: int, num_sms: int) -> int:
    """Warps per PGEMV_MMA_ROWS-row tile of the tensor-core variant: the largest power of two
    (<= PGEMV_MAX_PARTS) keeping tiles * parts within the warps the SMs hold and each part at
    least PGEMV_MMA_MIN_STEPS steps."""
    return pgemv_parts_of(cdiv(N, PGEMV_MMA_ROWS), cdiv(K, PGEMV_MMA_COLS), num_sms * PGEMV_MMA_WARPS_PER_SM,
                          PGEMV_MMA_MIN_STEPS)


def pgemv_parts_pow2(parts: int) -> bool:
    """Whether `parts` is 1, 2, 4 or 8 (whole rows or tiles per CTA of PGEMV_WARPS warps)."""
    return 1 <= parts <= PGEMV_MAX_PARTS and parts & (parts - 1) == 0


def pgemv_mma_cta_warps(parts: int) -> int:
    """Warps of a tensor-core GEMV CTA: PGEMV_WARPS at a power of two, else `parts` (one tile)."""
    return PGEMV_WARPS if pgemv_parts_pow2(parts) else parts


def pgemv_mma_sm_warps(parts: int) -> int:
    """Warps an SM holds of those CTAs at the kernels' register cap (16, or 15, 12, 14 at 3/5, 6, 7)."""
    w = pgemv_mma_cta_warps(parts)
    return PGEMV_MMA_WARPS_PER_SM // w * w


def pgemv_mma_parts_any(N: int, K: int, num_sms: int) -> int:
    """Warps per tile of the register-direct tensor-core GEMV (its split-plane and prefetching
    forms, the probes, the slots GEMV): the largest count in 1 .. PGEMV_MAX_PARTS whose warps the
    SMs hold in one wave, each part at least PGEMV_MMA_MIN_STEPS steps (6144 x 4096 on 132 SMs:
    5, where the power-of-two rule's 4 leaves SMs idle)."""
    tiles, steps = cdiv(N, PGEMV_MMA_ROWS), cdiv(K, PGEMV_MMA_COLS)
    best = 1
    for p in range(2, PGEMV_MAX_PARTS + 1):
        if tiles * p <= num_sms * pgemv_mma_sm_warps(p) and steps >= p * PGEMV_MMA_MIN_STEPS:
            best = p
    return best


def pgemv_mma_grid(N: int, parts: int) -> int:
    if pgemv_parts_pow2(parts):
        return cdiv(cdiv(N, PGEMV_MMA_ROWS) * parts, PGEMV_WARPS)
    return cdiv(N, PGEMV_MMA_ROWS)


def pgemv_mma_part_steps(K: int, parts: int) -> int:
    """Steps of PGEMV_MMA_COLS columns a part of the tensor-core GEMV takes (any parts 1..8; the
    launcher's, so that no warp divides by a runtime value)."""
    return cdiv(cdiv(K, PGEMV_MMA_COLS), parts)


def pgemv_mma_steps(K: int, parts: int, part: int) -> tuple[int, int]:
    """[first, last) steps of PGEMV_MMA_COLS columns that part `part` of `parts` covers."""
    return pgemv_steps_of(K, PGEMV_MMA_COLS, parts, part)


def pgemv_mma_queue_units(N: int, K: int, num_sms: int) -> int:
    """Units per PGEMV_MMA_ROWS-row tile of the queued variant: about
    PGEMV_MMA_QUEUE_UNITS_PER_WARP units per resident warp, each at least
    PGEMV_MMA_QUEUE_MIN_STEPS steps (an even count where the tile's steps allow: no buffer swap
    between units), at most PGEMV_MMA_QUEUE_MAX_UNITS."""
    tiles, steps = cdiv(N, PGEMV_MMA_ROWS), cdiv(K, PGEMV_MMA_COLS)
    most = max(1, min(steps // PGEMV_MMA_QUEUE_MIN_STEPS, PGEMV_MMA_QUEUE_MAX_UNITS))
    p = max(1, min(cdiv(PGEMV_MMA_QUEUE_UNITS_PER_WARP * num_sms * PGEMV_MMA_WARPS_PER_SM, tiles), most))
    per = cdiv(steps, p)
    if per % 2 and per < steps:
        per += 1
    return cdiv(steps, per)


def pgemv_mma_unit_steps(K: int, units: int, part: int) -> tuple[int, int]:
    """[first, last) steps of unit `part` of a tile cut into `units` (at 1 .. PGEMV_MAX_PARTS:
    the register-direct variant's parts)."""
    return pgemv_steps_of(K, PGEMV_MMA_COLS, units, part)


def pgemv_mma_queue_ctas_per_sm(M: int) -> int:
    """CTAs an SM holds of the queued kernel at batch M (its __launch_bounds__)."""
    return PGEMV_MMA4_CTAS_PER_SM if M > 16 else PGEMV_MMA_CTAS_PER_SM


def pgemv_mma_queue_grid(N: int, units: int, num_sms: int, ctas_per_sm: int) -> int:
    """The queued variant's persistent grid: what the SMs hold at once, no more than the units need."""
    return min(cdiv(cdiv(N, PGEMV_MMA_ROWS) * units, PGEMV_WARPS), num_sms * ctas_per_sm)


def pgemv_mma_queue_workspace(N: int, units: int, M: int) -> int:
    """fp32 elements of the queued variant's unit sums ([units][M][PGEMV_MMA_ROWS]; none at one unit per tile)."""
    return cdiv(N, PGEMV_MMA_ROWS) * units * M * PGEMV_MMA_ROWS if units > 1 else 0


def pgemv_mma_queue_counters(N: int) -> int:
    """int32 counters of the queued variant: its queue's head, the warps done, one per tile."""
    return PGEMV_QUEUE_TILES + cdiv(N, PGEMV_MMA_ROWS)


def pgemv_is_mma(variant: int) -> bool:
    """Whether a GEMV variant runs on tensor cores (register-direct, staged, prefetching, bulk-copy,
    queued, or register-direct on split planes)."""
    return variant in (PGEMV_VARIANT_MMA, PGEMV_VARIANT_MMA_STAGED, PGEMV_VARIANT_MMA_PREFETCH,
                       PGEMV_VARIANT_MMA_BULK, PGEMV_VARIANT_MMA_QUEUE, PGEMV_VARIANT_MMA_SPLIT)


def pgemv_needs_tiled(variant: int) -> bool:
    """Whether a GEMV variant runs only on tile-major planes (the bulk-copy one: a warp's part
    must be one run of bytes per plane)."""
    return variant == PGEMV_VARIANT_MMA_BULK


def pgemv_max_m(variant: int = PGEMV_VARIANT_DEFAULT) -> int:
    """The most batch rows a GEMV variant takes."""
    return PGEMV_MMA_MAX_M if pgemv_is_mma(variant) else PGEMV_MAX_M


def pgemv_any_parts(variant: int) -> bool:
    """Whether a GEMV variant takes any parts in 1 .. PGEMV_MAX_PARTS, not only a power of two
    (the tensor-core ones whose shared memory holds the parts' sums alone)."""
    return variant in (PGEMV_VARIANT_MMA, PGEMV_VARIANT_MMA_PREFETCH, PGEMV_VARIANT_MMA_SPLIT)


def pgemv_variant_parts(N: int, K: int, num_sms: int, variant: int = PGEMV_VARIANT_DEFAULT) -> int:
    """Warps per row (per tile for the tensor-core variants; units per tile for the queued one)
    of a GEMV variant's launch."""
    if variant == PGEMV_VARIANT_MMA_QUEUE:
        return pgemv_mma_queue_units(N, K, num_sms)
    if pgemv_any_parts(variant):
        return pgemv_mma_parts_any(N, K, num_sms)
    if pgemv_is_mma(variant):
        return pgemv_mma_parts(N, K, num_sms)
    return pgemv_parts(N, K, num_sms)


def pgemv_variant_grid(N: int, parts: int, variant: int = PGEMV_VARIANT_DEFAULT) -> int:
    return pgemv_mma_grid(N, parts) if pgemv_is_mma(variant) else pgemv_grid(N, parts)


def pgemv_supported(M: int, K: int, variant: int = PGEMV_VARIANT_DEFAULT) -> bool:
    """Whether a palette GEMV variant takes a batch of M rows against a weight with K columns."""
    return 1 <= M <= pgemv_max_m(variant) and K > 0 and K % PMMA_TILE_K == 0
