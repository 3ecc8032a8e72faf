// =======================================================================================
// Palette -> BF16.  Each thread: PAL_VEC = 8 consecutive weights of one row, i.e. one 32-bit
// index word, one 64-bit sign+mantissa load and one 16-byte store -- a warp moves 1 KiB of
// input and 512 B of output per instruction triple, fully coalesced.  The wide variant
// (palette_decode.cuh, pal_decode_wide_body) does PAL_WIDE = 32 weights per thread.  The main kernel has no
// per-element branch: the palette lookup is a register permute, bad-index detection an OR.
// Verbatim blocks decode through palette entry 0 here (their nibbles are 0) and are then
// overwritten by a separate patch kernel, one warp per block, in stream order.
// =======================================================================================
// The row gather (palette_gather_rows) has its host API and emulation at the end of this file.
#include "launch_util.h"
#include "palette_decode.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

template <bool kVec>
__global__ void __launch_bounds__(plan::PAL_THREADS) palette_decode_kernel(PalArgs a, int64_t total,
                                                                            int32_t* err) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::PAL_THREADS + threadIdx.x;
  if (t >= total) return;
  if (!pal_decode_body<kVec>(t, a)) atomicAdd(err, 1);
}

template <bool kPaired>
__global__ void __launch_bounds__(plan::PAL_THREADS) palette_decode_wide_kernel(PalArgs a, int64_t total,
                                                                                 int32_t* err) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::PAL_THREADS + threadIdx.x;
  if (t >= total) return;
  if (!pal_decode_wide_body<kPaired>(t, a)) atomicAdd(err, 1);
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS) verbatim_patch_kernel(PatchArgs a,
                                                                                   int32_t* err) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= a.nv) return;
  if (!patch_lane_body(v, threadIdx.x % plan::WARP, a)) atomicAdd(err, 1);
}

template <int kKind>
__global__ void __launch_bounds__(plan::PAL_THREADS) palette_decode_slots_kernel(PalArgs a, SlotArgs sa,
                                                                                  int64_t total, int32_t* err) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::PAL_THREADS + threadIdx.x;
  if (!slot_args(sa, blockIdx.y, &a, nullptr)) {
    if (t == 0) atomicAdd(err, 1);
    return;
  }
  if (t >= total) return;
  if (!slot_decode_body(kKind, t, a)) atomicAdd(err, 1);
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS) verbatim_patch_slots_kernel(PatchArgs p, SlotArgs sa,
                                                                                         int32_t* err) {
  if (!slot_args(sa, blockIdx.y, nullptr, &p)) return;  // counted by the decode
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= p.nv) return;
  if (!patch_lane_body(v, threadIdx.x % plan::WARP, p)) atomicAdd(err, 1);
}

__global__ void __launch_bounds__(plan::PAL_THREADS) palette_gather_kernel(PGatherArgs a, int64_t total,
                                                                            int32_t* err) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::PAL_THREADS + threadIdx.x;
  if (t >= total) return;
  if (!pgather_body(t, a)) atomicAdd(err, 1);
}

}  // namespace

void launch_palette_decode(const PalArgs& a, bool vec, int64_t grid, int64_t total, int32_t* err, cudaStream_t s) {
  if (vec)
    palette_decode_kernel<true><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
  else
    palette_decode_kernel<false><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
}

void launch_palette_decode_wide(const PalArgs& a, bool paired, int64_t grid, int64_t total, int32_t* err,
                                cudaStream_t s) {
  if (paired)
    palette_decode_wide_kernel<true><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
  else
    palette_decode_wide_kernel<false><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
}

void launch_verbatim_patch(const PatchArgs& p, int32_t* err, cudaStream_t s) {
  verbatim_patch_kernel<<<static_cast<unsigned>(plan::warp_grid(p.nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(p, err);
}

void launch_palette_decode_slots(const SlotPlan& pl, int64_t slots, int32_t* err, cudaStream_t s) {
  const dim3 g(static_cast<unsigned>(pl.grid), static_cast<unsigned>(slots));
  switch (pl.kind) {
    case 0: palette_decode_slots_kernel<0><<<g, plan::PAL_THREADS, 0, s>>>(pl.a, pl.sa, pl.total, err); break;
    case 1: palette_decode_slots_kernel<1><<<g, plan::PAL_THREADS, 0, s>>>(pl.a, pl.sa, pl.total, err); break;
    case 2: palette_decode_slots_kernel<2><<<g, plan::PAL_THREADS, 0, s>>>(pl.a, pl.sa, pl.total, err); break;
    default: palette_decode_slots_kernel<3><<<g, plan::PAL_THREADS, 0, s>>>(pl.a, pl.sa, pl.total, err); break;
  }
  if (pl.sa.nv_per > 0) {
    const dim3 gp(static_cast<unsigned>(plan::warp_grid(pl.sa.nv_per)), static_cast<unsigned>(slots));
    verbatim_patch_slots_kernel<<<gp, plan::WARP_KERNEL_THREADS, 0, s>>>(pl.p, pl.sa, err);
  }
}

}  // namespace detail

using namespace detail;

namespace {
const char* check_pgather(const PGatherArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return "matrix dimensions must be positive";
  if (a.n_ids < 0 || a.out_stride < a.cols) return "bad id count or output row stride";
  if (a.pal.size < 1 || a.pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (a.nv < 0 || a.nv > a.rows * plan::blocks_per_row(a.cols)) return "bad verbatim block count";
  if (a.rows * plan::blocks_per_row(a.cols) > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  return nullptr;
}
}  // namespace

const char* palette_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* sm, const uint8_t* idx,
                                int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv,
                                const uint8_t* vexp, const uint32_t* vrow, uint16_t* out, int64_t out_stride,
                                int32_t* err, void* stream) {
  const PGatherArgs a{ids, n_ids, sm, idx, rows, cols, pal, vpos, nv, vexp, out, out_stride, vrow};
  if (const char* e = check_pgather(a)) return e;
  if (n_ids == 0) return nullptr;
  const int64_t grid = plan::pgather_grid(n_ids, cols);
  if (!grid_ok(grid)) return "too many ids for one launch";
  palette_gather_kernel<<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
      a, n_ids * plan::pal_threads_per_row(cols), err);
  return launch_status();
}

namespace emulate {
const char* palette_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* sm, const uint8_t* idx,
                                int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv,
                                const uint8_t* vexp, const uint32_t* vrow, uint16_t* out, int64_t out_stride,
                                int32_t* err) {
  const PGatherArgs a{ids, n_ids, sm, idx, rows, cols, pal, vpos, nv, vexp, out, out_stride, vrow};
  if (const char* e = check_pgather(a)) return e;
  const int64_t total = n_ids * plan::pal_threads_per_row(cols);
  for (int64_t t = 0; t < plan::pgather_grid(n_ids, cols) * plan::PAL_THREADS; ++t)
    if (t < total && !pgather_body(t, a)) ++*err;
  return nullptr;
}
}  // namespace emulate

}  // namespace cuda
}  // namespace unweight
