// Host emulation of the CUDA kernels (kernels.cuh, namespace emulate): the per-thread bodies
// of the kernel families, run serially on the host over the kernels' launch geometry, so
// CPU-only CI checks the index math and decode logic bit for bit.  Compiled by nvcc like the
// kernels, so the bodies see the same __host__ __device__ definitions as on the device.
#include <algorithm>
#include <cstring>
#include <vector>

#include "huffman_decode.cuh"
#include "launch_util.h"
#include "palette_decode.cuh"
#include "transcode.cuh"

namespace unweight {
namespace cuda {

using namespace detail;

// =======================================================================================
// Host emulation: the kernel bodies, serially, over the kernels' launch geometry (including
// the threads a grid rounds up to, which must do nothing).
// =======================================================================================
namespace emulate {

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, int variant, int* path) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride)) return e;
  bool vec = false;
  if (const char* e = pal_path(&variant, &vec, cols, k0, out_stride, out, sm, idx)) return e;
  if (path) *path = variant;
  PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride, {}};
  const bool wide = variant == plan::PAL_VARIANT_WIDE, paired = pal_tables(pal, a.pt);
  const int per = wide ? plan::PAL_WIDE : plan::PAL_VEC;
  const int64_t total = (r1 - r0) * plan::pal_threads_per_row(k1 - k0, per);
  const int64_t grid = plan::pal_grid(r1 - r0, k1 - k0, per);
  for (int64_t t = 0; t < grid * plan::PAL_THREADS; ++t) {
    if (t >= total) continue;
    const bool ok = wide ? (paired ? pal_decode_wide_body<true>(t, a) : pal_decode_wide_body<false>(t, a))
                         : (vec ? pal_decode_body<true>(t, a) : pal_decode_body<false>(t, a));
    if (!ok) ++*err;
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

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
