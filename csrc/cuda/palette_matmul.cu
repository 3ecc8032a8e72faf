// =======================================================================================
// Fused palette GEMV/GEMM, y[M, N] = x[M, K] @ W^T, M <= 16, on CUDA cores.
//
// Why this shape.  At M <= 16 the product is bound by reading W (1.5 B/weight here vs 2 B for
// dense BF16), so the kernel is organized around streaming W once at full coalescing:
//   * one warp per W row, lanes on consecutive 8-column chunks: a warp step reads 128 B of
//     nibbles + 256 B of sign/mantissa, contiguous, and the fp32 dot products need only a
//     final 5-step butterfly (no shared memory, no atomics -> deterministic);
//   * 4 warps (rows) per CTA: small CTAs fill all SMs even for N = 1024 (256 CTAs) while the
//     4 warps share x through L1 (x is read with L1-allocating __ldg, W with no_allocate);
//   * weights are decoded in registers straight to fp32 bit patterns (sign/mantissa byte +
//     register-permute palette lookup), never rounded, so the only rounding is fp32
//     accumulation + one final RNE to bf16 -- the same error budget as cuBLAS' fp32-accum.
//   * M is a template parameter so acc[M] stays in registers and every m-loop unrolls.
// Verbatim blocks are not special-cased in the main loop: their nibbles are 0, so it
// multiplies with palette entry 0; a correction kernel that runs first computes, per verbatim
// block v, corr[v, m] = sum_c (w_true - w_decoded) * x[m, c], and lane 0 of the row's warp
// adds the row's corrections (a binary search in the sorted vpos, in ascending v order:
// deterministic) before rounding.  mma.sync (m16n8k16) for M >= 8 is left to a follow-up:
// at M <= 16 the fp32 FMA rate still exceeds what the memory system feeds on H100.
// =======================================================================================
#include "palette_matmul.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

template <int MT>
__global__ void __launch_bounds__(plan::GEMM_THREADS) palette_gemm_kernel(GemmArgs a) {
  const int lane = threadIdx.x % plan::WARP;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * plan::GEMM_ROWS_PER_CTA + threadIdx.x / plan::WARP;
  if (row >= a.N) return;  // uniform per warp: the shuffles below stay full-mask
  float acc[MT];
UW_UNROLL()
  for (int m = 0; m < MT; ++m) acc[m] = 0.f;
  gemm_lane_body<MT>(row, lane, a, acc);
UW_UNROLL()
  for (int m = 0; m < MT; ++m)
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], o);
  if (lane == 0) gemm_finish_row<MT>(row, a, acc);
}


__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS) gemm_correction_kernel(GemmArgs a) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= a.nv) return;
  const int lane = threadIdx.x % plan::WARP;
  for (int m = 0; m < a.M; ++m) {
    float p = corr_lane_body(v, lane, m, a);
    for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xFFFFFFFFu, p, o);
    if (lane == 0) a.corr[v * a.M + m] = p;
  }
}

}  // namespace

void launch_gemm_correction(const GemmArgs& a, cudaStream_t s) {
  gemm_correction_kernel<<<static_cast<unsigned>(plan::warp_grid(a.nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(a);
}

template <int MT>
void launch_palette_gemm(const GemmArgs& a, cudaStream_t s) {
  palette_gemm_kernel<MT><<<static_cast<unsigned>(plan::gemm_grid(a.N)), plan::GEMM_THREADS, 0, s>>>(a);
}

// One kernel per batch size, for launch.cu's table (M is a template parameter so that acc[M]
// stays in registers).
static_assert(plan::GEMM_MAX_M == 16, "one instantiation per M = 1..GEMM_MAX_M below");
template void launch_palette_gemm<1>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<2>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<3>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<4>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<5>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<6>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<7>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<8>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<9>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<10>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<11>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<12>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<13>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<14>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<15>(const GemmArgs&, cudaStream_t);
template void launch_palette_gemm<16>(const GemmArgs&, cudaStream_t);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
