// Launch geometry of the unweight CUDA kernels: which grid/block each launch uses and which
// unit of work (segment, 8-weight chunk, verbatim block, row) each thread or warp owns.
//
// Plain C++17 with no CUDA headers so that three parties can share it:
//   * the kernels, their launchers and emulation (csrc/cuda/*.cu, device code via UW_PLAN_HD),
//   * bindings_cuda.cpp (exposes plan_* so tests can compare it with the Python mirror),
//   * unweight/runtime/kernel_plan.py mirrors every function here line for line; the CPU
//     tests in tests/cuda/test_kernel_logic.py check on odd shapes that the Python mirror
//     covers every element exactly once and that it agrees with this file.
// Change a constant here and in kernel_plan.py together.
#pragma once
#include <cstdint>

#include "../unweight_constants.h"

#if defined(__CUDACC__)
#define UW_PLAN_HD __host__ __device__ __forceinline__
#else
#define UW_PLAN_HD inline
#endif

namespace unweight {
namespace plan {

// Huffman -> BF16/exponents and the Huffman row gather: one thread per chain (a segment's
// weights from one checkpoint of the index to the next, FORMAT.md "Checkpoint index"; the
// whole segment without an index), grid-stride, the grid capped at the CTAs the device holds
// at once so each CTA fills its 32 KiB shared LUT once.  128 threads per CTA: 7 CTAs (the
// most an SM's 228 KiB of shared memory holds) are 896 lanes, far more chains in flight than
// the ~90-160 per SM the decode's latency needs (FORMAT.md "Choosing S"), and a 4096 x 4096
// matrix (16,384 chains at S = 1024) still fills 128 CTAs, about one per SM of an H100.
constexpr int HUFF_THREADS = 128;
// Palette -> BF16: each thread decodes PAL_VEC consecutive weights of one row: 4 index bytes
// (one 32-bit load), 8 sign+mantissa bytes (one 64-bit load), one 16-byte store.
constexpr int PAL_VEC = 8;
constexpr int PAL_THREADS = 256;
// Warp-per-item kernels (verbatim patch, verbatim gather, row counts, compaction, GEMV
// correction): 8 warps per CTA.
constexpr int WARP = 32;
constexpr int WARP_KERNEL_THREADS = 256;
constexpr int WARPS_PER_CTA = WARP_KERNEL_THREADS / WARP;
// Palette encode: one thread per (row, PAL_BLOCK-weight block).
constexpr int ENC_THREADS = 256;
// Exponent histogram: grid-stride loop over 16-byte vectors, capped grid (each CTA flushes a
// 256-bin shared histogram with 256 global atomics, so more CTAs than needed only add
// atomics).
constexpr int HIST_THREADS = 256;
constexpr int64_t HIST_MAX_CTAS = 1024;
// Single-CTA exclusive scan of per-row verbatim counts.
constexpr int SCAN_THREADS = 1024;
// Fused palette GEMV/GEMM: one warp per output row (W row), 4 warps per CTA; each lane owns
// GEMM_VEC consecutive columns per step, so a warp step covers GEMM_STEP columns.
constexpr int GEMM_THREADS = 128;
constexpr int GEMM_ROWS_PER_CTA = GEMM_THREADS / WARP;
constexpr int GEMM_VEC = 8;
constexpr int GEMM_STEP = WARP * GEMM_VEC;
constexpr int GEMM_MAX_M = 16;
// Fused Huffman GEMV/GEMM: one thread per segment, HGEMM_THREADS segments per CTA, all of one
// column chunk (blockIdx.y) so the CTA stages that chunk of x once in shared memory next to
// the 32 KiB decode LUT.  64 threads (2 warps): the LUT fill (2048 16-byte vectors) stays
// cheap per CTA, and a 4096-row matrix with 16-row groups still gives 4 CTAs per chunk.
// Batch tiles: the kernel is instantiated for MT in {1, 2, 4, 8, 16} and a batch of M rows
// runs the smallest MT >= M with the staged x zero-padded (5 instantiations instead of 16:
// the padded FMAs are free next to the serial decode, and nvcc time stays bounded).
// Partial sums go to an fp32 workspace [n_chunks, M, N]; a second kernel with one thread per
// output sums the chunks in ascending order (deterministic, no atomics).
constexpr int HGEMM_THREADS = 64;
constexpr int HGEMM_MAX_M = 16;
constexpr int HGEMM_REDUCE_THREADS = 256;
constexpr int64_t HGEMM_MAX_CHUNKS = 65535;  // gridDim.y limit
// Bytes of the LUT at the front of the dynamic shared memory (x follows, 16-byte aligned).
constexpr int64_t HGEMM_LUT_BYTES = int64_t(HUFF_NUM_CTX) << (HUFF_MAX_CODE_LEN + 1);

UW_PLAN_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- huffman decode ---------------------------------------------------------------------
// Chains of one segment: P + 1 with a checkpoint index of P entries per segment (S > 0; a
// partial segment leaves its last ones without work), 1 without.
UW_PLAN_HD int64_t huffman_chains_per_segment(int64_t S, int64_t P) { return S > 0 ? P + 1 : 1; }
// CTAs for n work items (chains, gather units), at most max_ctas (they loop, grid stride).
UW_PLAN_HD int64_t huffman_grid(int64_t n_items, int64_t max_ctas) {
  const int64_t want = cdiv(n_items, HUFF_THREADS);
  return want < max_ctas ? want : max_ctas;
}
// Chain t -> i, the selected segment (for huffman_unit), and j, its checkpoint.
UW_PLAN_HD void huffman_chain(int64_t t, int64_t chains_per_segment, int64_t* i, int64_t* j) {
  *i = t / chains_per_segment;
  *j = t % chains_per_segment;
}
// Global thread index i (< n_sel_g * n_sel_c) -> segment (group, chunk) of the selection
// [g0, g0+n_sel_g) x [c0, c0+n_sel_c).  Group-fastest, the same order as the CPU codec.
UW_PLAN_HD void huffman_unit(int64_t i, int64_t g0, int64_t c0, int64_t n_sel_g, int64_t* g,
                             int64_t* c) {
  *g = g0 + i % n_sel_g;
  *c = c0 + i / n_sel_g;
}

// --- huffman row gather -----------------------------------------------------------------
// Parts per (id, chunk): the chains a row of a chunk `width` weights wide can touch,
// ceil(width / S) + 1 (the row may start mid-chain), at most the segment's P + 1; 1 without
// an index (the part decodes the segment from its start up to the row).
UW_PLAN_HD int64_t hgather_units(int64_t S, int64_t P, int64_t width) {
  if (S <= 0) return 1;
  const int64_t u = cdiv(width, S) + 1;
  return u < P + 1 ? u : P + 1;
}
// Unit t -> id index, chunk c, part u.  Id-major, so the parts of one row are neighbours.
UW_PLAN_HD void hgather_unit(int64_t t, int64_t n_chunks, int64_t units, int64_t* id, int64_t* c, int64_t* u) {
  *id = t / (n_chunks * units);
  *c = (t / units) % n_chunks;
  *u = t % units;
}

// --- palette decode ---------------------------------------------------------------------
UW_PLAN_HD int64_t pal_threads_per_row(int64_t n_cols) { return cdiv(n_cols, PAL_VEC); }
UW_PLAN_HD int64_t pal_grid(int64_t n_rows, int64_t n_cols) {
  return cdiv(n_rows * pal_threads_per_row(n_cols), PAL_THREADS);
}
// Thread t -> row r (relative), first column k (relative) and count n (1..PAL_VEC) of weights.
UW_PLAN_HD void pal_unit(int64_t t, int64_t n_cols, int64_t* r, int64_t* k, int* n) {
  const int64_t tpr = pal_threads_per_row(n_cols);
  *r = t / tpr;
  *k = (t % tpr) * PAL_VEC;
  const int64_t left = n_cols - *k;
  *n = static_cast<int>(left < PAL_VEC ? left : PAL_VEC);
}

// --- warp-per-item kernels --------------------------------------------------------------
// Palette row gather: pal_unit's threads per row, over n_ids rows.
UW_PLAN_HD int64_t pgather_grid(int64_t n_ids, int64_t n_cols) { return pal_grid(n_ids, n_cols); }
UW_PLAN_HD int64_t warp_grid(int64_t n_items) { return cdiv(n_items, WARPS_PER_CTA); }

// --- palette encode ---------------------------------------------------------------------
UW_PLAN_HD int64_t blocks_per_row(int64_t cols) { return cdiv(cols, PAL_BLOCK); }
UW_PLAN_HD int64_t enc_grid(int64_t rows, int64_t cols) {
  return cdiv(rows * blocks_per_row(cols), ENC_THREADS);
}

// --- histogram --------------------------------------------------------------------------
UW_PLAN_HD int64_t hist_grid(int64_t n_bytes) {
  const int64_t want = cdiv(cdiv(n_bytes, 16), HIST_THREADS);
  return want < 1 ? 1 : (want > HIST_MAX_CTAS ? HIST_MAX_CTAS : want);
}

// --- fused GEMV/GEMM --------------------------------------------------------------------
UW_PLAN_HD int64_t gemm_grid(int64_t n_rows) { return cdiv(n_rows, GEMM_ROWS_PER_CTA); }
UW_PLAN_HD int64_t gemm_steps(int64_t cols) { return cdiv(cols, GEMM_STEP); }

// --- fused Huffman GEMV/GEMM ------------------------------------------------------------
// Batch tile the kernel runs for M (0 when M is out of range).
UW_PLAN_HD int hgemm_mtile(int M) {
  return M < 1 ? 0 : M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : M <= HGEMM_MAX_M ? 16 : 0;
}
// CTAs along x: row groups of one chunk, HGEMM_THREADS per CTA.  (gridDim.y = n_chunks.)
UW_PLAN_HD int64_t hgemm_grid_x(int64_t n_groups) { return cdiv(n_groups, HGEMM_THREADS); }
// Thread `tid` of CTA (bx, by) -> segment (row group g, column chunk c); g may be >= n_groups
// for the threads the grid rounds up to (they only help stage x and fill the LUT).
UW_PLAN_HD void hgemm_unit(int64_t bx, int64_t by, int tid, int64_t* g, int64_t* c) {
  *g = bx * HGEMM_THREADS + tid;
  *c = by;
}
// Dynamic shared memory of one CTA: LUT + x chunk transposed to [chunk width][MT] bf16.
UW_PLAN_HD int64_t hgemm_smem_bytes(int64_t chunk_width, int mtile) {
  return HGEMM_LUT_BYTES + cdiv(chunk_width * mtile * 2, 16) * 16;
}
UW_PLAN_HD int64_t hgemm_reduce_grid(int64_t M, int64_t N) { return cdiv(M * N, HGEMM_REDUCE_THREADS); }

}  // namespace plan
}  // namespace unweight
