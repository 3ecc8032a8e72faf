// =======================================================================================
// Palette -> BF16.  Each thread: PAL_VEC = 8 consecutive weights of one row, i.e. one 32-bit
// index word, one 64-bit sign+mantissa load and one 16-byte store -- a warp moves 1 KiB of
// input and 512 B of output per instruction triple, fully coalesced.  The main kernel has no
// per-element branch: the palette lookup is a register permute, bad-index detection an OR.
// Verbatim blocks decode through palette entry 0 here (their nibbles are 0) and are then
// overwritten by a separate patch kernel, one warp per block, in stream order.
// =======================================================================================
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

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS) verbatim_patch_kernel(PatchArgs a,
                                                                                   int32_t* err) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= a.nv) return;
  if (!patch_lane_body(v, threadIdx.x % plan::WARP, a)) atomicAdd(err, 1);
}

}  // namespace

void launch_palette_decode(const PalArgs& a, bool vec, int64_t grid, int64_t total, int32_t* err, cudaStream_t s) {
  if (vec)
    palette_decode_kernel<true><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
  else
    palette_decode_kernel<false><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
}

void launch_verbatim_patch(const PatchArgs& p, int32_t* err, cudaStream_t s) {
  verbatim_patch_kernel<<<static_cast<unsigned>(plan::warp_grid(p.nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(p, err);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
