// Fused palette GEMV/GEMM: the argument block and the per-lane bodies (dot products, row
// finish, verbatim correction), run by the kernels of palette_matmul.cu (design notes there)
// and, serially on the host, by emulate.cu.
#pragma once
#include "device_util.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct GemmArgs {
  const uint16_t* x;
  int64_t ldx;
  int M;
  const uint8_t* sm;
  const uint8_t* idx;
  int64_t N, K;
  Palette pal;
  const uint32_t* vpos;
  int64_t nv;
  const uint8_t* vexp;
  float* corr;
  uint16_t* y;
  int64_t ldy;
};

// Lane partial dot products of W row `row` with x[0..MT), columns lane*8 + s*256.
template <int MT>
UW_HD void gemm_lane_body(int64_t row, int lane, const GemmArgs& a, float (&acc)[MT]) {
  const uint8_t* smr = a.sm + row * a.K;
  const uint8_t* ir = a.idx + row * (a.K / 2);
  const int64_t steps = plan::gemm_steps(a.K);
UW_UNROLL(2)
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t c = s * plan::GEMM_STEP + static_cast<int64_t>(lane) * plan::GEMM_VEC;
    if (c >= a.K) break;  // last step only; K % 8 == 0 so a chunk is all-in or all-out
    const uint32_t nib = ld_stream_u32(ir + c / 2);
    uint32_t s0, s1;
    ld_stream_v2(smr + c, s0, s1);
    float w[8];
UW_UNROLL()
    for (int j = 0; j < 8; ++j) {
      const uint8_t sb = static_cast<uint8_t>((j < 4 ? s0 : s1) >> (8 * (j & 3)));
      w[j] = f32_from_bits(f32_bits_from_parts(sb, pal_exp(a.pal, (nib >> (4 * j)) & 0xFu)));
    }
UW_UNROLL()
    for (int m = 0; m < MT; ++m) {
      uint32_t xv[4];
      ld_reuse_v4(a.x + m * a.ldx + c, xv);
UW_UNROLL()
      for (int j = 0; j < 8; ++j) {
        const uint32_t xb = (j & 1) ? (xv[j / 2] & 0xFFFF0000u) : (xv[j / 2] << 16);
        acc[m] = fmaf(w[j], f32_from_bits(xb), acc[m]);
      }
    }
  }
}

// Lane 0 after the butterfly: add the row's verbatim corrections, round, store.
template <int MT>
UW_HD void gemm_finish_row(int64_t row, const GemmArgs& a, float (&acc)[MT]) {
  if (a.nv > 0) {
    const int64_t bpr = plan::blocks_per_row(a.K);
    const int64_t lo = lower_bound_u32(a.vpos, a.nv, static_cast<uint64_t>(row) * bpr);
    const int64_t hi = lower_bound_u32(a.vpos, a.nv, static_cast<uint64_t>(row + 1) * bpr);
    for (int64_t v = lo; v < hi; ++v)
UW_UNROLL()
      for (int m = 0; m < MT; ++m) acc[m] += a.corr[v * MT + m];
  }
UW_UNROLL()
  for (int m = 0; m < MT; ++m) a.y[m * a.ldy + row] = bf16_round_bits(bits_from_f32(acc[m]));
}

// Lane partials of the correction of verbatim block v for one m: (w_true - w_decoded) * x
// over the lane's columns of the block.
UW_HD float corr_lane_body(int64_t v, int lane, int m, const GemmArgs& a) {
  const int64_t bpr = plan::blocks_per_row(a.K);
  const int64_t r = a.vpos[v] / bpr, b = a.vpos[v] % bpr;
  float p = 0.f;
  for (int64_t jb = lane; jb < PAL_BLOCK; jb += plan::WARP) {  // lane-strided: coalesced
    const int64_t c = b * PAL_BLOCK + jb;
    if (c >= a.K) continue;
    const uint8_t s = a.sm[r * a.K + c];
    const float wt = f32_from_bits(f32_bits_from_parts(s, a.vexp[v * PAL_BLOCK + jb]));
    const float wd = f32_from_bits(f32_bits_from_parts(s, pal_exp(a.pal, pal_nibble(a.idx + r * (a.K / 2), c))));
    const float xf = f32_from_bits(static_cast<uint32_t>(a.x[m * a.ldx + c]) << 16);
    p = fmaf(wt - wd, xf, p);
  }
  return p;
}

// ---------------------------------------------------------------------------------------
// Launchers (palette_matmul.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
// One warp per verbatim block: corr[v, m] (a.nv > 0); must run before the product.
void launch_gemm_correction(const GemmArgs& a, cudaStream_t s);
// The product for batch size MT == a.M; instantiated for MT = 1..GEMM_MAX_M (launch.cu's
// table picks one).
template <int MT>
void launch_palette_gemm(const GemmArgs& a, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
