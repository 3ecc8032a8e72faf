// Launch geometry of the unweight CUDA kernels: which grid/block each launch uses and which
// unit of work (segment, 8-weight chunk, verbatim block, row) each thread or warp owns.
//
// Plain C++17 with no CUDA headers so that three parties can share it:
//   * kernels.cu (host launchers and device code, via UW_PLAN_HD),
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

// Huffman -> BF16/exponents: one thread per segment.  64 threads per CTA because each CTA
// first fills a 32 KiB shared LUT: small CTAs keep that fill cheap per segment decoded while
// still letting ~7 CTAs (448 threads) share an SM's 228 KiB of shared memory, and a typical
// 4096x4096 matrix (4096 segments) still spreads over 64 CTAs.
constexpr int HUFF_THREADS = 64;
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

UW_PLAN_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- huffman decode ---------------------------------------------------------------------
UW_PLAN_HD int64_t huffman_grid(int64_t n_sel_segments) { return cdiv(n_sel_segments, HUFF_THREADS); }
// Global thread index i (< n_sel_g * n_sel_c) -> segment (group, chunk) of the selection
// [g0, g0+n_sel_g) x [c0, c0+n_sel_c).  Group-fastest, the same order as the CPU codec.
UW_PLAN_HD void huffman_unit(int64_t i, int64_t g0, int64_t c0, int64_t n_sel_g, int64_t* g,
                             int64_t* c) {
  *g = g0 + i % n_sel_g;
  *c = c0 + i / n_sel_g;
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

}  // namespace plan
}  // namespace unweight
