// Host emulation of the CUDA kernels (kernels.cuh, namespace emulate): the per-thread bodies
// of the kernel families, run serially on the host over the kernels' launch geometry, so
// CPU-only CI checks the index math and decode logic bit for bit.  Compiled by nvcc like the
// kernels, so the bodies see the same __host__ __device__ definitions as on the device.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "huffman_decode.cuh"
#include "huffman_matmul.cuh"
#include "launch_util.h"
#include "palette_decode.cuh"
#include "palette_matmul.cuh"
#include "transcode.cuh"

namespace unweight {
namespace cuda {

using namespace detail;

namespace {

// Host emulation of the warp butterfly: after `acc += shfl_xor(acc, o)` for o = 16..1, lane 0
// holds this exact sum order.
float warp_sum_lane0(float (&p)[plan::WARP]) {
  for (int o = 16; o > 0; o >>= 1) {
    float q[plan::WARP];
    for (int l = 0; l < plan::WARP; ++l) q[l] = p[l] + p[l ^ o];
    std::memcpy(p, q, sizeof(q));
  }
  return p[0];
}

template <int MT>
void emulate_gemm_m(const GemmArgs& a) {
  for (int64_t row = 0; row < a.N; ++row) {
    float part[MT][plan::WARP];
    for (int lane = 0; lane < plan::WARP; ++lane) {
      float acc[MT];
      for (int m = 0; m < MT; ++m) acc[m] = 0.f;
      gemm_lane_body<MT>(row, lane, a, acc);
      for (int m = 0; m < MT; ++m) part[m][lane] = acc[m];
    }
    float acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = warp_sum_lane0(part[m]);
    gemm_finish_row<MT>(row, a, acc);
  }
}

template <int... Ms>
struct EmuGemmTable {
  static void run(int M, const GemmArgs& a) {
    (void)std::initializer_list<int>{(M == Ms ? (emulate_gemm_m<Ms>(a), 0) : 0)...};
  }
};

// Host emulation over the kernel's grid: per CTA, stage x (all threads' staging elements),
// then every thread's segment; then the reduction's threads.  No thread reads what another
// writes before the barrier / the second launch, so the serial order reproduces the device.
template <int MT, bool kVec>
void emulate_hgemm_t(const HGemmArgs& a, const uint16_t* lut, int32_t* err) {
  const int64_t ng = cdiv(a.N, a.R), nc = cdiv(a.K, a.C);
  std::vector<uint16_t> xs(static_cast<size_t>(std::min(a.C, a.K) * MT));
  for (int64_t by = 0; by < nc; ++by)
    for (int64_t bx = 0; bx < plan::hgemm_grid_x(ng); ++bx) {
      const int64_t nstage = hgemm_chunk_width(by, a) * MT;
      for (int64_t e = 0; e < nstage; ++e) hgemm_stage_x<MT>(e, by, a, xs.data());
      for (int tid = 0; tid < plan::HGEMM_THREADS; ++tid) {
        int64_t g, c;
        plan::hgemm_unit(bx, by, tid, &g, &c);
        if (g >= ng) continue;
        if (!hgemm_segment_body<MT, kVec>(g, c, a, lut, xs.data())) ++*err;
      }
    }
  const int64_t total = a.M * a.N;
  for (int64_t t = 0; t < plan::hgemm_reduce_grid(a.M, a.N) * plan::HGEMM_REDUCE_THREADS; ++t)
    if (t < total) hgemm_reduce_body(t, a);
}

template <int MT>
void emulate_hgemm_m(const HGemmArgs& a, bool vec, const uint16_t* lut, int32_t* err) {
  if (vec) emulate_hgemm_t<MT, true>(a, lut, err); else emulate_hgemm_t<MT, false>(a, lut, err);
}

}  // namespace

// =======================================================================================
// Host emulation: the kernel bodies, serially, over the kernels' launch geometry (including
// the threads a grid rounds up to, which must do nothing).
// =======================================================================================
namespace emulate {

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride)) return e;
  const PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride};
  const int64_t total = (r1 - r0) * plan::pal_threads_per_row(k1 - k0);
  const bool vec = cols % 8 == 0 && k0 % 8 == 0 && out_stride % 8 == 0 && aligned(out, 16) &&
                   aligned(sm, 8) && aligned(idx, 4);
  const int64_t grid = plan::pal_grid(r1 - r0, k1 - k0);
  for (int64_t t = 0; t < grid * plan::PAL_THREADS; ++t) {
    if (t >= total) continue;
    if (!(vec ? pal_decode_body<true>(t, a) : pal_decode_body<false>(t, a))) ++*err;
  }
  const PatchArgs p{sm, rows, cols, r0, r1, k0, k1, vpos, nv, vexp, out, out_stride};
  for (int64_t w = 0; w < plan::warp_grid(nv) * plan::WARPS_PER_CTA; ++w) {
    if (w >= nv) continue;
    for (int lane = 0; lane < plan::WARP; ++lane)
      if (!patch_lane_body(w, lane, p)) ++*err;
  }
  return nullptr;
}

void exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist) {
  // Bin counts do not depend on the kernel's order; this mirrors its vector/tail split.
  const int64_t nvec = n / 16;
  for (int64_t v = 0; v < nvec; ++v) {
    uint32_t q[4];
    ld_stream_v4(exps + 16 * v, q);
    for (int j = 0; j < 16; ++j) ++hist[(q[j / 4] >> (8 * (j % 4))) & 0xFFu];
  }
  for (int64_t j = nvec * 16; j < n; ++j) ++hist[exps[j]];
}

void palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                          uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                          uint32_t* row_offsets) {
  uint8_t pmap[256];
  for (int i = 0; i < 256; ++i) pmap[i] = kMiss;
  for (int i = 0; i < pal.size; ++i) pmap[pal_exp(pal, i)] = static_cast<uint8_t>(i);
  const int64_t bpr = plan::blocks_per_row(cols);
  const EncArgs a{exps, rows, cols, idx, flags};
  for (int64_t t = 0; t < plan::enc_grid(rows, cols) * plan::ENC_THREADS; ++t)
    if (t < rows * bpr) enc_block_body(t, a, pmap);
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t s = 0;
    for (int64_t b = 0; b < bpr; ++b) s += flags[r * bpr + b];
    row_counts[r] = s;
  }
  uint32_t run = 0;
  for (int64_t r = 0; r < rows; ++r) {
    row_offsets[r] = run;
    run += row_counts[r];
  }
  row_offsets[rows] = run;
}

void palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                          const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp) {
  const int64_t bpr = plan::blocks_per_row(cols);
  for (int64_t r = 0; r < rows; ++r) {  // compact_kernel's ballot order, lane by lane
    uint32_t base = row_offsets[r];
    for (int64_t b = 0; b < bpr; ++b)
      if (flags[r * bpr + b]) vpos[base++] = static_cast<uint32_t>(r * bpr + b);
  }
  for (int64_t v = 0; v < nv; ++v)
    for (int lane = 0; lane < plan::WARP; ++lane) gather_lane_body(v, lane, exps, cols, vpos, vexp);
}

const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                         const uint32_t* vpos, int64_t nv, const uint8_t* vexp, float* corr,
                         uint16_t* y, int64_t ldy) {
  if (const char* e = check_gemm(M, N, K, ldx, ldy, pal, nv, corr)) return e;
  const GemmArgs a{x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, corr, y, ldy};
  for (int64_t v = 0; v < nv; ++v)
    for (int m = 0; m < M; ++m) {
      float p[plan::WARP];
      for (int lane = 0; lane < plan::WARP; ++lane) p[lane] = corr_lane_body(v, lane, m, a);
      corr[v * M + m] = warp_sum_lane0(p);
    }
  EmuGemmTable<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>::run(M, a);
  return nullptr;
}

const char* huffman_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                         int64_t N, int64_t K, int64_t R, int64_t C, const uint8_t* table,
                         int exp_lo, int exp_hi, float* part, uint16_t* y, int64_t ldy,
                         int32_t* err) {
  if (const char* e = check_hgemm(M, N, K, R, C, ldx, ldy, stream_bytes, part)) return e;
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  const int n = exp_hi - exp_lo + 1;
  std::vector<uint16_t> lut(HUFF_NUM_CTX * LUT_SIZE);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    if (!build_lut(table + t * n, n, exp_lo, &lut[t * LUT_SIZE], nullptr)) ++*err;
  const HGemmArgs a{x, ldx, M, sm, stream, stream_bytes, off, N, K, R, C, part, y, ldy};
  const bool vec = hgemm_vec(sm, K, C);
  switch (plan::hgemm_mtile(M)) {
    case 1: emulate_hgemm_m<1>(a, vec, lut.data(), err); break;
    case 2: emulate_hgemm_m<2>(a, vec, lut.data(), err); break;
    case 4: emulate_hgemm_m<4>(a, vec, lut.data(), err); break;
    case 8: emulate_hgemm_m<8>(a, vec, lut.data(), err); break;
    default: emulate_hgemm_m<16>(a, vec, lut.data(), err); break;
  }
  return nullptr;
}

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
