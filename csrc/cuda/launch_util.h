// Host-side helpers of the launchers (defined in launch.cu): launch status, grid and
// alignment tests, and the argument checks that the launchers (launch.cu) and their host
// emulation (emulate.cu) share, so both reject the same arguments with the same message.
#pragma once
#include <cstdint>

#include "kernels.cuh"

namespace unweight {
namespace cuda {
namespace detail {

// nullptr, or the error string of the last launch (cleared).
const char* launch_status();
bool grid_ok(int64_t g);
// Whether the tensor-core GEMV and wgmma GEMM launches may use programmatic dependent launch
// (sm_90+: set_programmatic_launch, kernels.cuh).
bool programmatic_launch();
// The wgmma GEMM's schedule (set_wgmma_tile_wait, kernels.cuh): whether each tile waits for its
// own wgmmas.
bool wgmma_tile_wait();
// Whether the tensor-core GEMVs prefetch x's lines into L1 ahead of its loads
// (set_gemv_x_prefetch, kernels.cuh).
bool gemv_x_prefetch();
bool aligned(const void* p, uintptr_t a);

const char* check_huff(int64_t stream_bytes, int64_t rows, int64_t cols, int64_t R, int64_t C,
                       int64_t g0, int64_t g1, int64_t c0, int64_t c1, int64_t sm_stride,
                       const uint16_t* out16, const uint8_t* out8, int64_t out_stride);
const char* check_pal(int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                      const Palette& pal, int64_t nv, int64_t out_stride, int tiled);
// The planes' order flag of every palette launcher (kernel_plan.h pal_offset): 0 (file order)
// or 1 (tile-major, which needs whole 16 x 64 tiles).
const char* check_plane_order(int64_t rows, int64_t cols, int tiled);
// The palette decode variant to run (plan::PAL_VARIANT_*; DEFAULT resolved, unknown refused):
// *variant becomes VEC8 or WIDE, WIDE only where VEC8's vector path applies (its chunks are
// VEC8's) and the width k1 - k0 is whole chunks.  *vec: whether that path applies (cols, k0
// and out_stride multiples of 8, the output 16-byte, the sign+mantissa plane 8-byte and the
// index plane 4-byte aligned).
const char* pal_path(int* variant, bool* vec, int64_t cols, int64_t k0, int64_t k1, int64_t out_stride,
                     const void* out, const void* sm, const void* idx);
// Threads (*total, the kernels' bound on t) and CTAs of a palette decode of n_rows x width
// weights by the resolved `variant`: the wide variant's whole warps, else a thread per chunk.
void pal_launch_size(int variant, int64_t n_rows, int64_t width, int64_t* total, int64_t* grid);

#if defined(__CUDACC__)
// Past 48 KiB a kernel must opt in to its dynamic shared memory: done once per kernel and
// device, before its first launch there (a failure shows in the launch's own status).
template <auto Kernel>
void opt_in_smem(int smem) {
  if (smem <= 48 * 1024) return;
  constexpr int kDevices = 64;
  static bool done[kDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kDevices && !done[dev]) {
    cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    done[dev] = true;
  }
}

// kernel<<<grid, block, smem, s>>>(args...), with programmatic dependent launch allowed when
// `pdl` (sm_90+): the kernel may start while the launch ahead of it on the stream ends, so it
// must griddepcontrol.wait before it touches what that launch writes or reads.
template <class... Params, class... Args>
void launch_maybe_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t s, bool pdl,
                      Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, static_cast<size_t>(smem), s>>>(static_cast<Params>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
