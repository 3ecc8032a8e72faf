// =======================================================================================
// Huffman -> BF16 / exponents.  One thread per segment: a segment is an independent bit
// stream that starts byte aligned, so threads need no coordination; the format makes
// segments >= 4096 weights so the per-thread serial decode amortizes the CTA's LUT fill.
// =======================================================================================
#include "huffman_decode.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

// One thread per context: build_lut is the shared canonical-code constructor.  Runs once per
// tensor (the tables are cached by the caller), so its serial 4096-entry fill is irrelevant.
__global__ void build_lut_kernel(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err) {
  const int t = threadIdx.x;
  if (t >= HUFF_NUM_CTX) return;
  if (!build_lut(table + t * n, n, lo, lut + t * LUT_SIZE, nullptr)) atomicAdd(err, 1);
}

template <bool kExp>
__global__ void __launch_bounds__(plan::HUFF_THREADS)
huffman_decode_kernel(HuffArgs a, const uint16_t* __restrict__ lut_g, int32_t* err) {
  // 4 contexts x 4096 entries x 2 B = 32 KiB: the whole code space of a <=12-bit code, so a
  // symbol is one shared load indexed by the next 12 stream bits (no tree walk, no branch).
  // Copied from the global tables (built once per tensor) with 16-byte loads: 2048 vectors
  // over 64 threads.  They are read by every CTA, so the default (L1/L2-allocating) __ldg.
  __shared__ __align__(16) uint16_t lut[HUFF_NUM_CTX * LUT_SIZE];
  const uint4* src = reinterpret_cast<const uint4*>(lut_g);
  uint4* dst = reinterpret_cast<uint4*>(lut);
  constexpr int kVecs = HUFF_NUM_CTX * LUT_SIZE * 2 / 16;
  for (int j = threadIdx.x; j < kVecs; j += plan::HUFF_THREADS) dst[j] = __ldg(src + j);
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * plan::HUFF_THREADS + threadIdx.x;
  if (i >= (a.g1 - a.g0) * (a.c1 - a.c0)) return;
  if (!huff_segment_body<kExp>(i, a, lut)) atomicAdd(err, 1);
}

}  // namespace

void launch_build_lut(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err, cudaStream_t s) {
  build_lut_kernel<<<1, 32, 0, s>>>(table, n, lo, lut, err);
}

void launch_huffman_decode(const HuffArgs& a, int64_t grid, const uint16_t* lut, int32_t* err, cudaStream_t s) {
  if (a.out8)
    huffman_decode_kernel<true><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, lut, err);
  else
    huffman_decode_kernel<false><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, lut, err);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
