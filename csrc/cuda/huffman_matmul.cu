// =======================================================================================
// Fused Huffman GEMV/GEMM, y[M, N] = x[M, K] @ W^T, M <= 16, W Huffman-coded.
//
// Why this shape.  A Huffman segment is a serial bit stream: its i-th symbol's position is
// known only after decoding symbols 0..i-1, and its code table is selected by the weight's
// own sign+mantissa byte (the context), so neither multi-symbol tables nor splitting a
// segment across lanes is possible (FORMAT.md, "Contexts").  Parallelism therefore comes
// from segments alone, and the kernel is organized around keeping each segment-thread's
// serial loop short: one LUT lookup, one FMA per batch row, no memory access but shared
// memory and the thread's own streams.
//   * Work unit: one thread per segment (R rows x one column chunk), HGEMM_THREADS = 64
//     segments of consecutive row groups per CTA, all in the same chunk (blockIdx.y).
//   * Shared memory: the 32 KiB LUT (4 contexts x 4096 entries: a symbol is one shared load
//     indexed by ctx and the next 12 bits) and the CTA's chunk of x, transposed to
//     [column][MT] bf16 so one column's MT batch values are one 4/8/16/32-byte load.  The
//     threads of a CTA all walk their segments in the same row-major (row, column) order,
//     one weight per iteration, so a warp reads the same x column in lockstep: a shared
//     broadcast, no bank conflict.  (Threads of a partial last row group drop out early;
//     that only idles lanes.)  The x chunk is staged once per CTA: chunk width x MT values
//     against R x width x 64 weights decoded, so its cost vanishes for R >= 4.
//   * Loads: the sign+mantissa bytes are read 16 at a time per thread (kVec, when K and C
//     are multiples of 16) with ld.global.nc *L1-allocating*: unlike the coalesced decode
//     kernels (no_allocate), each thread here owns a different row, so a 32-byte sector is
//     consumed by two consecutive loads of the same thread and must survive in L1 between
//     them.  The exponent stream is read a byte at a time by refill_bounded (a thread's bytes
//     are consecutive, so all but the first of each line hit L1) and never past the stream
//     allocation, so a corrupt segment cannot fault.  Nothing else lives in L1 here (LUT and
//     x are in shared memory), so allocating there evicts nothing useful.
//   * Accumulation: weights decode straight to fp32 bit patterns (never rounded), fp32
//     acc[MT] per W row in registers; at each row end the thread writes its MT partial sums
//     to part[chunk, m, row].  A second kernel, one thread per output, sums the chunks in
//     ascending order and rounds once (RNE) to bf16: no atomics, so repeated runs are
//     bitwise equal, and the host emulation reproduces the device bits.
//   * MT (batch tile) is a template parameter in {1, 2, 4, 8, 16} so acc[] and the FMA loop
//     unroll in registers; x rows >= M are staged as zeros.
// When this loses to decode + cuBLAS (large M, or few segments for 132 SMs), the measured
// dispatch table (unweight/runtime/tuning.py) keeps decode + cuBLAS.
// =======================================================================================
#include "huffman_matmul.cuh"

#include "launch_util.h"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

template <int MT, bool kVec>
__global__ void __launch_bounds__(plan::HGEMM_THREADS)
huffman_gemm_kernel(HGemmArgs a, const uint16_t* __restrict__ lut_g, int32_t* err) {
  // Dynamic: LUT (HGEMM_LUT_BYTES) then x [width][MT]; sized by plan::hgemm_smem_bytes and
  // opted in above 48 KiB by the launcher.
  extern __shared__ __align__(16) unsigned char hgemm_smem[];
  uint16_t* lut = reinterpret_cast<uint16_t*>(hgemm_smem);
  uint16_t* xs = reinterpret_cast<uint16_t*>(hgemm_smem + plan::HGEMM_LUT_BYTES);
  // LUT fill as in huffman_decode_kernel: 16-byte __ldg (L1/L2-allocating: every CTA reads
  // the same 32 KiB, so after the first CTA of an SM it comes from L1/L2, not DRAM).
  const uint4* src = reinterpret_cast<const uint4*>(lut_g);
  uint4* dst = reinterpret_cast<uint4*>(lut);
  constexpr int kVecs = static_cast<int>(plan::HGEMM_LUT_BYTES / 16);
  for (int j = threadIdx.x; j < kVecs; j += plan::HGEMM_THREADS) dst[j] = __ldg(src + j);
  const int64_t c = blockIdx.y;
  const int64_t nstage = hgemm_chunk_width(c, a) * MT;
  for (int64_t e = threadIdx.x; e < nstage; e += plan::HGEMM_THREADS) hgemm_stage_x<MT>(e, c, a, xs);
  __syncthreads();
  int64_t g, cc;
  plan::hgemm_unit(blockIdx.x, blockIdx.y, threadIdx.x, &g, &cc);
  if (g >= cdiv(a.N, a.R)) return;  // after the only barrier: rounded-up threads only staged
  if (!hgemm_segment_body<MT, kVec>(g, cc, a, lut, xs)) atomicAdd(err, 1);
}

__global__ void __launch_bounds__(plan::HGEMM_REDUCE_THREADS) huffman_gemm_reduce_kernel(HGemmArgs a) {
  // Consecutive threads -> consecutive n: coalesced reads of each chunk's partial row and a
  // coalesced bf16 store.
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::HGEMM_REDUCE_THREADS + threadIdx.x;
  if (t >= a.M * a.N) return;
  hgemm_reduce_body(t, a);
}

}  // namespace

template <int MT, bool kVec>
const char* launch_huffman_gemm(const HGemmArgs& a, const uint16_t* lut, int32_t* err, cudaStream_t s) {
  const int64_t smem = plan::hgemm_smem_bytes(std::min(a.C, a.K), MT);
  int dev = 0, optin = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce == cudaSuccess) ce = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();  // report it here, leave no sticky error for the next call
    return cudaGetErrorString(ce);
  }
  if (smem > optin) return "huffman_gemm: the column chunk of x does not fit in shared memory (use decode + matmul)";
  // Above 48 KiB dynamic shared memory needs an explicit per-kernel opt-in; setting it on
  // every launch costs a host call, not a device operation, so it is capture-safe.
  ce = cudaFuncSetAttribute(huffman_gemm_kernel<MT, kVec>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem));
  if (ce != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaGetErrorString(ce);
  }
  const dim3 grid(static_cast<unsigned>(plan::hgemm_grid_x(cdiv(a.N, a.R))), static_cast<unsigned>(cdiv(a.K, a.C)));
  huffman_gemm_kernel<MT, kVec><<<grid, plan::HGEMM_THREADS, static_cast<size_t>(smem), s>>>(a, lut, err);
  if (const char* e = launch_status()) return e;
  // Same stream: every partial is written before the reduction reads it.
  huffman_gemm_reduce_kernel<<<static_cast<unsigned>(plan::hgemm_reduce_grid(a.M, a.N)),
                               plan::HGEMM_REDUCE_THREADS, 0, s>>>(a);
  return launch_status();
}

// The batch tiles of plan::hgemm_mtile, each with and without the 16-byte sign+mantissa loads.
static_assert(plan::HGEMM_MAX_M == 16, "one instantiation per tile 1, 2, 4, 8, 16 below");
template const char* launch_huffman_gemm<1, false>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<1, true>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<2, false>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<2, true>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<4, false>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<4, true>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<8, false>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<8, true>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<16, false>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);
template const char* launch_huffman_gemm<16, true>(const HGemmArgs&, const uint16_t*, int32_t*, cudaStream_t);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
