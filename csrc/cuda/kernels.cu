// CUDA kernels of unweight format v1: Huffman and palette decode to BF16, the on-device
// Huffman -> palette transcode, and the fused palette and Huffman GEMV/GEMM.
//
// Structure.  Every kernel is a thin __global__ shell around a __host__ __device__ "body"
// that does one thread's (or one warp lane's) unit of work, addressed through the launch
// geometry of kernel_plan.h.  The bodies decode with the shared primitives of
// decode_primitives.h (build_lut, BitReader / decode_segment_bounded, ctx_of, lut_*,
// bf16_from_parts, pal_nibble), i.e. with the very code the CPU codec runs.  The
// `emulate::` functions at the end run the same bodies serially on the host over the same
// geometry, so CPU-only CI checks the kernels' index math and decode logic bit for bit
// (tests/cuda/test_kernel_logic.py); only the shells (shared-memory staging, warp
// collectives, cache-hinted loads) are GPU-only, and they are kept small.
//
// Cache policy, in one place (the "why" for every hint below):
//   * weight planes (sm, idx, exponent stream, exponent plane) are read exactly once per
//     launch and are far larger than L1: ld.global.nc.L1::no_allocate streams them through
//     the read-only path without evicting what *is* reused from L1 (the activations x in the
//     GEMV, the LUT source in the Huffman kernel);
//   * activations x are re-read by every row of W, so they use plain __ldg (read-only path,
//     L1-allocating): after the first warp touches a line, the other warps of the SM hit L1;
//   * decoded BF16 output is stored with default write-back stores (L2-allocating): the
//     matmul that follows a decode reads it right back, often while it is still in L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "../decode_primitives.h"
#include "kernel_plan.h"
#include "kernels.cuh"

// `#pragma unroll` only where nvcc compiles device code: the host pass (the emulation) would
// warn about an unknown pragma under -Wall.
#if defined(__CUDA_ARCH__)
#define UW_PRAGMA(x) _Pragma(#x)
#define UW_UNROLL(...) UW_PRAGMA(unroll __VA_ARGS__)
#else
#define UW_UNROLL(...)
#endif

namespace unweight {
namespace cuda {
namespace {

using plan::cdiv;

// ---------------------------------------------------------------------------------------
// Loads.  Device: inline PTX for the cache hints (see the policy above).  Host (emulation):
// memcpy, which is what the hinted loads mean for the data.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t ld_stream_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

UW_HD void ld_stream_v2(const uint8_t* p, uint32_t& a, uint32_t& b) {
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p));
#else
  uint32_t v[2];
  std::memcpy(v, p, 8);
  a = v[0];
  b = v[1];
#endif
}

UW_HD void ld_stream_v4(const uint8_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
      : "l"(p));
#else
  std::memcpy(v, p, 16);
#endif
}

// Activations: reused across rows -> L1-allocating read-only load.
UW_HD void ld_reuse_v4(const uint16_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
#else
  std::memcpy(v, p, 16);
#endif
}

UW_HD void st_v4(uint16_t* p, const uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
#else
  std::memcpy(p, v, 16);
#endif
}

UW_HD float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

UW_HD uint32_t bits_from_f32(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}

// Palette entry `nib` (0..15).  Device: two byte-permutes over the four packed palette words
// and a select -- all in registers, so the decode has no memory access and no branch for
// the table (a __constant__ or shared table would serialize on divergent indices or cost a
// load per weight).
UW_HD uint32_t pal_exp(const Palette& p, uint32_t nib) {
#if defined(__CUDA_ARCH__)
  const uint32_t lo = __byte_perm(p.w[0], p.w[1], nib & 7u);
  const uint32_t hi = __byte_perm(p.w[2], p.w[3], nib & 7u);
  return ((nib & 8u) ? hi : lo) & 0xFFu;
#else
  return (p.w[nib >> 2] >> ((nib & 3u) * 8)) & 0xFFu;
#endif
}

// First index in sorted a[0..n) with a[i] >= key.
UW_HD int64_t lower_bound_u32(const uint32_t* a, int64_t n, uint64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (static_cast<uint64_t>(a[mid]) < key) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// =======================================================================================
// Huffman -> BF16 / exponents.  One thread per segment: a segment is an independent bit
// stream that starts byte aligned, so threads need no coordination; the format makes
// segments >= 4096 weights so the per-thread serial decode amortizes the CTA's LUT fill.
// =======================================================================================
struct HuffArgs {
  const uint8_t* stream;
  int64_t stream_bytes;
  const uint32_t* off;
  int64_t rows, cols, R, C, g0, g1, c0, c1;
  const uint8_t* sm;
  int64_t sm_stride;
  uint16_t* out16;
  uint8_t* out8;
  int64_t out_stride;
};

// Decodes the i-th selected segment; false when it is corrupt (bad offsets, invalid code,
// or a consumed bit count that does not round up to the segment's byte length).
template <bool kExp>
UW_HD bool huff_segment_body(int64_t i, const HuffArgs& a, const uint16_t* lut) {
  const int64_t ng = cdiv(a.rows, a.R);
  int64_t g, c;
  plan::huffman_unit(i, a.g0, a.c0, a.g1 - a.g0, &g, &c);
  const int64_t s = c * ng + g;
  const uint32_t b0 = a.off[s], b1 = a.off[s + 1];
  // Offsets are checked per segment (not in a host pre-pass as on the CPU) so a corrupt
  // table never makes a thread read outside the stream allocation.
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const int64_t r0 = g * a.R, r1 = std::min(a.rows, r0 + a.R);
  const int64_t k0 = c * a.C, k1 = std::min(a.cols, k0 + a.C);
  const int64_t lr = r0 - a.g0 * a.R, lk = k0 - a.c0 * a.C;
  const int64_t o = lr * a.out_stride + lk;
  const uint64_t used = decode_segment_bounded<kExp>(
      a.stream + b0, a.stream + a.stream_bytes, lut, a.sm + lr * a.sm_stride + lk, a.sm_stride,
      kExp ? nullptr : a.out16 + o, kExp ? a.out8 + o : nullptr, a.out_stride,
      static_cast<int>(r1 - r0), static_cast<int>(k1 - k0));
  return used != ~static_cast<uint64_t>(0) && (used + 7) / 8 == static_cast<uint64_t>(b1 - b0);
}

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

// =======================================================================================
// Palette -> BF16.  Each thread: PAL_VEC = 8 consecutive weights of one row, i.e. one 32-bit
// index word, one 64-bit sign+mantissa load and one 16-byte store -- a warp moves 1 KiB of
// input and 512 B of output per instruction triple, fully coalesced.  The main kernel has no
// per-element branch: the palette lookup is a register permute, bad-index detection an OR.
// Verbatim blocks decode through palette entry 0 here (their nibbles are 0) and are then
// overwritten by a separate patch kernel, one warp per block, in stream order.
// =======================================================================================
struct PalArgs {
  const uint8_t* sm;
  const uint8_t* idx;
  int64_t rows, cols, r0, r1, k0, k1;
  Palette pal;
  uint16_t* out;
  int64_t out_stride;
};

// kVec: the launcher proved 8-byte alignment of sm rows, 4-byte of idx rows and 16-byte of
// output chunks (cols, k0, out_stride multiples of 8); a tail chunk (< 8 weights) of a
// rectangle whose width is not a multiple of 8 takes the scalar path (one branch per thread).
template <bool kVec>
UW_HD bool pal_decode_body(int64_t t, const PalArgs& a) {
  int64_t r, k;
  int n;
  plan::pal_unit(t, a.k1 - a.k0, &r, &k, &n);
  const int64_t row = a.r0 + r, col = a.k0 + k;
  const int64_t ib = (a.cols + 1) / 2;
  const uint8_t* smr = a.sm + row * a.cols;
  const uint8_t* ir = a.idx + row * ib;
  uint16_t* o = a.out + r * a.out_stride + k;
  const uint32_t size = static_cast<uint32_t>(a.pal.size);
  uint32_t bad = 0;
  if (kVec && n == plan::PAL_VEC) {
    const uint32_t nib = ld_stream_u32(ir + col / 2);  // 8 nibbles, column j at bits 4j
    uint32_t s0, s1;
    ld_stream_v2(smr + col, s0, s1);
    uint32_t w[4];
UW_UNROLL()
    for (int j = 0; j < 8; j += 2) {
      const uint32_t sw = j < 4 ? s0 : s1;
      const uint32_t na = (nib >> (4 * j)) & 0xFu, nb = (nib >> (4 * j + 4)) & 0xFu;
      bad |= (na >= size) | (nb >= size);
      const uint16_t ha = bf16_from_parts(static_cast<uint8_t>(sw >> (8 * (j & 3))), pal_exp(a.pal, na));
      const uint16_t hb = bf16_from_parts(static_cast<uint8_t>(sw >> (8 * ((j & 3) + 1))), pal_exp(a.pal, nb));
      w[j / 2] = static_cast<uint32_t>(ha) | (static_cast<uint32_t>(hb) << 16);
    }
    st_v4(o, w);
  } else {
    for (int j = 0; j < n; ++j) {
      const uint32_t nb = pal_nibble(ir, col + j);
      bad |= nb >= size;
      o[j] = bf16_from_parts(smr[col + j], pal_exp(a.pal, nb));
    }
  }
  return bad == 0;
}

template <bool kVec>
__global__ void __launch_bounds__(plan::PAL_THREADS) palette_decode_kernel(PalArgs a, int64_t total,
                                                                            int32_t* err) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::PAL_THREADS + threadIdx.x;
  if (t >= total) return;
  if (!pal_decode_body<kVec>(t, a)) atomicAdd(err, 1);
}

struct PatchArgs {
  const uint8_t* sm;
  int64_t rows, cols, r0, r1, k0, k1;
  const uint32_t* vpos;
  int64_t nv;
  const uint8_t* vexp;
  uint16_t* out;
  int64_t out_stride;
};

// Lane `lane` of the warp for verbatim block v writes its columns lane, lane+32, ... of the
// block when they fall inside the decoded rectangle.  Returns false (lane 0 only) on an id
// that is out of range or not strictly ascending.
UW_HD bool patch_lane_body(int64_t v, int lane, const PatchArgs& a) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const uint32_t id = a.vpos[v];
  if (static_cast<int64_t>(id) >= a.rows * bpr || (v > 0 && a.vpos[v - 1] >= id)) return lane != 0;
  const int64_t r = id / bpr, b = id % bpr;
  if (r < a.r0 || r >= a.r1) return true;
  for (int64_t jb = lane; jb < PAL_BLOCK; jb += plan::WARP) {  // lane-strided: coalesced
    const int64_t c = b * PAL_BLOCK + jb;
    if (c < a.k0 || c >= a.k1) continue;
    a.out[(r - a.r0) * a.out_stride + (c - a.k0)] =
        bf16_from_parts(a.sm[r * a.cols + c], a.vexp[v * PAL_BLOCK + jb]);
  }
  return true;
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS) verbatim_patch_kernel(PatchArgs a,
                                                                                   int32_t* err) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= a.nv) return;
  if (!patch_lane_body(v, threadIdx.x % plan::WARP, a)) atomicAdd(err, 1);
}

// =======================================================================================
// Huffman -> palette transcode (from the exponent plane the Huffman kernel wrote with
// kExp = true): histogram -> (host picks the palette) -> nibbles + verbatim flags ->
// per-row counts -> exclusive scan -> ordered compaction -> verbatim exponents.  The
// count/scan/compaction (rather than an atomic append + sort) makes vpos come out ascending
// and bit-identical to the CPU encoder with no sort and no nondeterminism.
// =======================================================================================
__global__ void __launch_bounds__(plan::HIST_THREADS) exp_hist_kernel(const uint8_t* __restrict__ e,
                                                                      int64_t n,
                                                                      unsigned long long* hist) {
  // One 256-bin sub-histogram per warp: exponents concentrate on ~10 bins, so a single
  // per-CTA histogram would serialize all 8 warps on the same few shared atomics.
  __shared__ uint32_t h[plan::HIST_THREADS / plan::WARP][256];
  for (int j = threadIdx.x; j < (plan::HIST_THREADS / plan::WARP) * 256; j += plan::HIST_THREADS)
    (&h[0][0])[j] = 0;
  __syncthreads();
  uint32_t* mine = h[threadIdx.x / plan::WARP];
  const int64_t nvec = n / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * plan::HIST_THREADS;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * plan::HIST_THREADS + threadIdx.x; v < nvec;
       v += stride) {
    uint32_t q[4];
    ld_stream_v4(e + 16 * v, q);
UW_UNROLL()
    for (int j = 0; j < 16; ++j) atomicAdd(&mine[(q[j / 4] >> (8 * (j % 4))) & 0xFFu], 1u);
  }
  if (blockIdx.x == 0)
    for (int64_t j = nvec * 16 + threadIdx.x; j < n; j += plan::HIST_THREADS) atomicAdd(&mine[e[j]], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += plan::HIST_THREADS) {
    unsigned long long s = 0;
    for (int w = 0; w < plan::HIST_THREADS / plan::WARP; ++w) s += h[w][b];
    if (s) atomicAdd(&hist[b], s);
  }
}

struct EncArgs {
  const uint8_t* exps;
  int64_t rows, cols;
  uint8_t* idx;
  uint8_t* flags;
};

constexpr uint8_t kMiss = 0x10;
static_assert(plan::ENC_THREADS == 256, "palette_encode_kernel fills its 256-entry map one per thread");  // pmap value of an exponent outside the palette

// One thread per (row, PAL_BLOCK-weight block): the verbatim decision is per block, so a thread that
// owns the whole block decides it with no inter-thread traffic.  Writes the block's index
// bytes (all 0 for a verbatim block, as the format requires) and its flag.
UW_HD void enc_block_body(int64_t t, const EncArgs& a, const uint8_t* pmap) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const int64_t r = t / bpr, b = t % bpr;
  const int64_t k0 = b * PAL_BLOCK, n = std::min<int64_t>(PAL_BLOCK, a.cols - k0);
  const uint8_t* er = a.exps + r * a.cols + k0;
  uint8_t* ir = a.idx + r * ((a.cols + 1) / 2) + k0 / 2;
  uint32_t miss = 0;
  for (int64_t c = 0; c < n; ++c) miss |= pmap[er[c]];
  miss &= kMiss;
  for (int64_t c = 0; c < n; c += 2) {
    const uint32_t lo = pmap[er[c]] & 0xFu;
    const uint32_t hi = c + 1 < n ? (pmap[er[c + 1]] & 0xFu) : 0u;
    ir[c / 2] = miss ? 0 : static_cast<uint8_t>(lo | (hi << 4));
  }
  a.flags[t] = miss ? 1 : 0;
}

__global__ void __launch_bounds__(plan::ENC_THREADS) palette_encode_kernel(EncArgs a, Palette pal) {
  // Exponent -> nibble map (kMiss when absent), rebuilt per CTA from the 16 register-resident
  // palette entries: 256 bytes of shared memory, cheaper than passing a device table.
  __shared__ uint8_t pmap[256];
  pmap[threadIdx.x] = kMiss;
  __syncthreads();
  if (threadIdx.x < static_cast<unsigned>(pal.size))
    pmap[pal_exp(pal, threadIdx.x)] = static_cast<uint8_t>(threadIdx.x);
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::ENC_THREADS + threadIdx.x;
  if (t >= a.rows * plan::blocks_per_row(a.cols)) return;
  enc_block_body(t, a, pmap);
}

// Warp per row: verbatim blocks of the row.
__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
row_count_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr, uint32_t* counts) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (r >= rows) return;
  const int lane = threadIdx.x % plan::WARP;
  uint32_t s = 0;
  for (int64_t b = lane; b < bpr; b += plan::WARP) s += flags[r * bpr + b];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  if (lane == 0) counts[r] = s;
}

// Single CTA: exclusive scan of counts[rows] into offsets[rows+1].  Each thread owns a
// contiguous run of rows (serial sums), then a Hillis-Steele scan over the 1024 run totals.
// rows is at most a few hundred thousand, so one CTA is far below a microsecond per 1K rows.
__global__ void __launch_bounds__(plan::SCAN_THREADS)
scan_kernel(const uint32_t* __restrict__ counts, int64_t rows, uint32_t* offsets) {
  __shared__ uint32_t s[plan::SCAN_THREADS];
  const int tid = threadIdx.x;
  const int64_t chunk = cdiv(rows, plan::SCAN_THREADS);
  const int64_t t0 = std::min(rows, tid * chunk), t1 = std::min(rows, t0 + chunk);
  uint32_t local = 0;
  for (int64_t r = t0; r < t1; ++r) local += counts[r];
  s[tid] = local;
  __syncthreads();
  for (int off = 1; off < plan::SCAN_THREADS; off <<= 1) {
    const uint32_t v = tid >= off ? s[tid - off] : 0u;
    __syncthreads();
    s[tid] += v;
    __syncthreads();
  }
  uint32_t run = s[tid] - local;
  for (int64_t r = t0; r < t1; ++r) {
    offsets[r] = run;
    run += counts[r];
  }
  if (tid == plan::SCAN_THREADS - 1) offsets[rows] = s[tid];
}

// Warp per row: ballot over 32 blocks at a time, each flagged lane writes its id at
// base + (flagged lanes below it), so ids land in ascending order.
__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
compact_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr,
               const uint32_t* __restrict__ offsets, uint32_t* vpos) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (r >= rows) return;  // uniform per warp, so the full-mask ballot below is legal
  const int lane = threadIdx.x % plan::WARP;
  uint32_t base = offsets[r];
  for (int64_t b0 = 0; b0 < bpr; b0 += plan::WARP) {
    const int64_t b = b0 + lane;
    const bool f = b < bpr && flags[r * bpr + b];
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, f);
    if (f) vpos[base + __popc(ballot & ((1u << lane) - 1u))] = static_cast<uint32_t>(r * bpr + b);
    base += __popc(ballot);
  }
}

// Lane `lane` of the warp for verbatim entry v copies exponents lane, lane+32, ... of the block
// (0 past the end of the row, as the CPU encoder pads).
UW_HD void gather_lane_body(int64_t v, int lane, const uint8_t* exps, int64_t cols,
                            const uint32_t* vpos, uint8_t* vexp) {
  const int64_t bpr = plan::blocks_per_row(cols);
  const int64_t r = vpos[v] / bpr, b = vpos[v] % bpr;
  for (int64_t jb = lane; jb < PAL_BLOCK; jb += plan::WARP) {  // lane-strided: coalesced
    const int64_t c = b * PAL_BLOCK + jb;
    vexp[v * PAL_BLOCK + jb] = c < cols ? exps[r * cols + c] : 0;
  }
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
gather_vexp_kernel(const uint8_t* __restrict__ exps, int64_t cols, const uint32_t* __restrict__ vpos,
                   int64_t nv, uint8_t* vexp) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= nv) return;
  gather_lane_body(v, threadIdx.x % plan::WARP, exps, cols, vpos, vexp);
}

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
struct HGemmArgs {
  const uint16_t* x;
  int64_t ldx;
  int M;
  const uint8_t* sm;
  const uint8_t* stream;
  int64_t stream_bytes;
  const uint32_t* off;
  int64_t N, K, R, C;
  float* part;
  uint16_t* y;
  int64_t ldy;
};

UW_HD int64_t hgemm_chunk_width(int64_t c, const HGemmArgs& a) {
  return std::min(a.K, (c + 1) * a.C) - c * a.C;
}

// Staging element e (< width * MT) of chunk c: (m = e / width, col = e % width), so
// consecutive threads read consecutive columns of one x row (coalesced global loads); the
// transposed shared stores conflict on banks, but they are a one-off per CTA.
template <int MT>
UW_HD void hgemm_stage_x(int64_t e, int64_t c, const HGemmArgs& a, uint16_t* xs) {
  const int64_t w = hgemm_chunk_width(c, a);
  const int64_t m = e / w, col = e % w;
  xs[col * MT + m] = m < a.M ? a.x[m * a.ldx + c * a.C + col] : static_cast<uint16_t>(0);
}

// The MT staged batch values of column `col` as fp32 (bf16 bits in the top half).
template <int MT>
UW_HD void hgemm_load_x(const uint16_t* xs, int col, float (&xf)[MT]) {
  const uint16_t* p = xs + static_cast<int64_t>(col) * MT;
  if constexpr (MT == 1) {
    xf[0] = f32_from_bits(static_cast<uint32_t>(p[0]) << 16);
  } else {
    uint32_t v[MT / 2];
#if defined(__CUDA_ARCH__)
    // Widest shared load the tile allows (column stride MT * 2 bytes keeps it aligned).
    if constexpr (MT >= 8) {
UW_UNROLL()
      for (int q = 0; q < MT / 8; ++q) {
        const uint4 t = reinterpret_cast<const uint4*>(p)[q];
        v[4 * q] = t.x; v[4 * q + 1] = t.y; v[4 * q + 2] = t.z; v[4 * q + 3] = t.w;
      }
    } else if constexpr (MT == 4) {
      const uint2 t = *reinterpret_cast<const uint2*>(p);
      v[0] = t.x; v[1] = t.y;
    } else {
      v[0] = *reinterpret_cast<const uint32_t*>(p);
    }
#else
    std::memcpy(v, p, MT * 2);
#endif
UW_UNROLL()
    for (int q = 0; q < MT / 2; ++q) {
      xf[2 * q] = f32_from_bits(v[q] << 16);  // little-endian: even row in the low half
      xf[2 * q + 1] = f32_from_bits(v[q] & 0xFFFF0000u);
    }
  }
}

// 16 sign+mantissa bytes of one row (kVec path): read-only, L1-allocating (see above).
UW_HD void ld_rowbytes_v4(const uint8_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
      : "l"(p));
#else
  std::memcpy(v, p, 16);
#endif
}

// One thread's segment (row group g, chunk c): decode every weight, multiply with the staged
// x column, write the rows' partial sums.  False when the segment is corrupt (bad offsets,
// invalid code, or consumed bits that do not round up to its byte length).
template <int MT, bool kVec>
UW_HD bool hgemm_segment_body(int64_t g, int64_t c, const HGemmArgs& a, const uint16_t* lut,
                              const uint16_t* xs) {
  const int64_t ng = cdiv(a.N, a.R);
  const int64_t s = c * ng + g;
  const uint32_t b0 = a.off[s], b1 = a.off[s + 1];
  // Checked per segment so a corrupt offset table never sends a thread outside the stream.
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const int64_t r0 = g * a.R, r1 = std::min(a.N, r0 + a.R);
  const int64_t k0 = c * a.C;
  const int w = static_cast<int>(hgemm_chunk_width(c, a));
  const uint8_t* seg = a.stream + b0;
  const uint8_t* limit = a.stream + a.stream_bytes;
  BitReader br;
  init_bounded(br, seg, limit);
  uint32_t bad = 0;
  constexpr int kV = kVec ? 16 : 1;  // weights per sign+mantissa load
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* smr = a.sm + r * a.K + k0;
    float acc[MT];
UW_UNROLL()
    for (int m = 0; m < MT; ++m) acc[m] = 0.f;
    for (int col0 = 0; col0 < w; col0 += kV) {
      uint32_t sv[4] = {0u, 0u, 0u, 0u};
      if (kVec) ld_rowbytes_v4(smr + col0, sv); else sv[0] = smr[col0];
UW_UNROLL()
      for (int j = 0; j < kV; ++j) {
        // The bounded refill tops the window up to >= 57 bits; one symbol takes <= 12.
        if (br.nbits < HUFF_MAX_CODE_LEN) refill_bounded(br, limit);
        const uint8_t sb = static_cast<uint8_t>(sv[j / 4] >> (8 * (j % 4)));
        const uint16_t e = lut[(ctx_of(sb) << HUFF_MAX_CODE_LEN) | br.peek()];
        bad |= (e == 0);
        br.consume(lut_len(e));
        const float wf = f32_from_bits(f32_bits_from_parts(sb, lut_sym(e)));
        float xf[MT];
        hgemm_load_x<MT>(xs, col0 + j, xf);
UW_UNROLL()
        for (int m = 0; m < MT; ++m) acc[m] = fmaf(wf, xf[m], acc[m]);
      }
    }
    // Once per W row: MT scattered 4-byte stores, nothing next to the row's w weights.
UW_UNROLL()
    for (int m = 0; m < MT; ++m)
      if (m < a.M) a.part[(c * a.M + m) * a.N + r] = acc[m];
  }
  const uint64_t used = br.consumed(seg);
  return bad == 0 && (used + 7) / 8 == static_cast<uint64_t>(b1 - b0);
}

// Output t = m * N + n: the chunks' partial sums in ascending chunk order, one rounding.
UW_HD void hgemm_reduce_body(int64_t t, const HGemmArgs& a) {
  const int64_t m = t / a.N, n = t % a.N;
  const int64_t nc = cdiv(a.K, a.C);
  float acc = 0.f;
  for (int64_t c = 0; c < nc; ++c) acc += a.part[(c * a.M + m) * a.N + n];
  a.y[m * a.ldy + n] = bf16_round_bits(bits_from_f32(acc));
}

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

// ---------------------------------------------------------------------------------------
// Launch helpers.
// ---------------------------------------------------------------------------------------
const char* launch_status() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

bool grid_ok(int64_t g) { return g >= 1 && g <= 0x7FFFFFFF; }

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

const char* check_huff(int64_t stream_bytes, int64_t rows, int64_t cols, int64_t R, int64_t C,
                       int64_t g0, int64_t g1, int64_t c0, int64_t c1, int64_t sm_stride,
                       const uint16_t* out16, const uint8_t* out8, int64_t out_stride) {
  if (rows <= 0 || cols <= 0 || R <= 0 || C <= 0) return "grid dimensions must be positive";
  if (!(0 <= g0 && g0 < g1 && g1 <= cdiv(rows, R) && 0 <= c0 && c0 < c1 && c1 <= cdiv(cols, C)))
    return "segment range out of bounds";
  if (R > (1 << 30) || C > (1 << 30)) return "segment too large";
  const int64_t w = std::min(cols, c1 * C) - c0 * C;
  if (sm_stride < w || out_stride < w) return "row stride smaller than the decoded width";
  if ((out16 == nullptr) == (out8 == nullptr)) return "exactly one of out16/out8 must be given";
  if (stream_bytes < STREAM_SLACK_BYTES) return "exponent stream shorter than its slack";
  return nullptr;
}

const char* check_pal(int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                      const Palette& pal, int64_t nv, int64_t out_stride) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  if (!(0 <= r0 && r0 < r1 && r1 <= rows && 0 <= k0 && k0 < k1 && k1 <= cols))
    return "decode rectangle out of bounds";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > rows * plan::blocks_per_row(cols)) return "bad verbatim block count";
  if (out_stride < k1 - k0) return "row stride smaller than the decoded width";
  if (rows * plan::blocks_per_row(cols) > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  return nullptr;
}

const char* check_gemm(int M, int64_t N, int64_t K, int64_t ldx, int64_t ldy, const Palette& pal,
                       int64_t nv, const float* corr) {
  if (M < 1 || M > plan::GEMM_MAX_M) return "palette_gemm supports 1 <= M <= 16";
  if (N <= 0 || K <= 0) return "matrix dimensions must be positive";
  if (K % 8 != 0) return "palette_gemm needs K % 8 == 0 (decode + matmul instead)";
  if (ldx < K || ldx % 8 != 0) return "x row stride must be >= K and a multiple of 8";
  if (ldy < N) return "y row stride must be >= N";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > N * plan::blocks_per_row(K)) return "bad verbatim block count";
  if (nv > 0 && corr == nullptr) return "corr scratch [nv, M] is required when nv > 0";
  return nullptr;
}

const char* check_hgemm(int M, int64_t N, int64_t K, int64_t R, int64_t C, int64_t ldx, int64_t ldy,
                        int64_t stream_bytes, const float* part) {
  if (M < 1 || M > plan::HGEMM_MAX_M) return "huffman_gemm supports 1 <= M <= 16";
  if (N <= 0 || K <= 0 || R <= 0 || C <= 0) return "matrix and grid dimensions must be positive";
  if (R > (1 << 30) || C > (1 << 30)) return "segment too large";
  if (cdiv(K, C) > plan::HGEMM_MAX_CHUNKS) return "huffman_gemm: too many column chunks for one launch";
  if (!grid_ok(plan::hgemm_grid_x(cdiv(N, R))) || !grid_ok(plan::hgemm_reduce_grid(M, N)))
    return "matrix too large for one launch";
  if (ldx < K) return "x row stride must be >= K";
  if (ldy < N) return "y row stride must be >= N";
  if (stream_bytes < STREAM_SLACK_BYTES) return "exponent stream shorter than its slack";
  if (part == nullptr) return "huffman_gemm needs the fp32 workspace [n_chunks, M, N]";
  return nullptr;
}

// The 16-byte sign+mantissa path needs every (row, chunk) start 16-byte aligned.
bool hgemm_vec(const uint8_t* sm, int64_t K, int64_t C) { return K % 16 == 0 && C % 16 == 0 && aligned(sm, 16); }

template <int MT>
void launch_gemm_m(const GemmArgs& a, cudaStream_t s) {
  palette_gemm_kernel<MT><<<static_cast<unsigned>(plan::gemm_grid(a.N)), plan::GEMM_THREADS, 0, s>>>(a);
}

template <int... Ms>
struct GemmTable {
  static void launch(int M, const GemmArgs& a, cudaStream_t s) {
    (void)std::initializer_list<int>{(M == Ms ? (launch_gemm_m<Ms>(a, s), 0) : 0)...};
  }
};

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

template <int MT, bool kVec>
const char* launch_hgemm_t(const HGemmArgs& a, const uint16_t* lut, int32_t* err, cudaStream_t s) {
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

template <int MT>
const char* launch_hgemm_m(const HGemmArgs& a, bool vec, const uint16_t* lut, int32_t* err, cudaStream_t s) {
  return vec ? launch_hgemm_t<MT, true>(a, lut, err, s) : launch_hgemm_t<MT, false>(a, lut, err, s);
}

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

#define UW_STR2(...) #__VA_ARGS__
#define UW_STR(...) UW_STR2(__VA_ARGS__)

}  // namespace

// =======================================================================================
// Host API.
// =======================================================================================
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: report 0, leave no sticky error
    return 0;
  }
  return n;
}

const char* compiled_archs() {
#if defined(__CUDA_ARCH_LIST__)
  return UW_STR(__CUDA_ARCH_LIST__);
#else
  return "";
#endif
}

const char* huffman_build_lut(const uint8_t* table, int exp_lo, int exp_hi, uint16_t* lut,
                              int32_t* err, void* stream) {
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  build_lut_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(table, exp_hi - exp_lo + 1, exp_lo,
                                                                     lut, err);
  return launch_status();
}

const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint16_t* lut,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out16, uint8_t* out8, int64_t out_stride,
                           int32_t* err, void* stream_handle) {
  if (const char* e = check_huff(stream_bytes, rows, cols, R, C, g0, g1, c0, c1, sm_stride, out16,
                                 out8, out_stride))
    return e;
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  const int64_t grid = plan::huffman_grid((g1 - g0) * (c1 - c0));
  if (!grid_ok(grid)) return "too many segments for one launch";
  const HuffArgs a{stream, stream_bytes, off, rows, cols, R, C, g0, g1, c0, c1,
                   sm, sm_stride, out16, out8, out_stride};
  const cudaStream_t s = static_cast<cudaStream_t>(stream_handle);
  if (out8)
    huffman_decode_kernel<true><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, lut, err);
  else
    huffman_decode_kernel<false><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, lut, err);
  return launch_status();
}

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, void* stream) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride)) return e;
  const int64_t grid = plan::pal_grid(r1 - r0, k1 - k0);
  if (!grid_ok(grid) || (nv > 0 && !grid_ok(plan::warp_grid(nv)))) return "matrix too large for one launch";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride};
  const int64_t total = (r1 - r0) * plan::pal_threads_per_row(k1 - k0);
  const bool vec = cols % 8 == 0 && k0 % 8 == 0 && out_stride % 8 == 0 && aligned(out, 16) &&
                   aligned(sm, 8) && aligned(idx, 4);
  if (vec)
    palette_decode_kernel<true><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
  else
    palette_decode_kernel<false><<<static_cast<unsigned>(grid), plan::PAL_THREADS, 0, s>>>(a, total, err);
  if (const char* e = launch_status()) return e;
  if (nv > 0) {
    const PatchArgs p{sm, rows, cols, r0, r1, k0, k1, vpos, nv, vexp, out, out_stride};
    verbatim_patch_kernel<<<static_cast<unsigned>(plan::warp_grid(nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(p, err);
  }
  return launch_status();
}

const char* exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, void* stream) {
  if (n <= 0) return nullptr;
  if (!aligned(exps, 16)) return "exponent plane must be 16-byte aligned";
  exp_hist_kernel<<<static_cast<unsigned>(plan::hist_grid(n)), plan::HIST_THREADS, 0,
                    static_cast<cudaStream_t>(stream)>>>(exps, n, hist);
  return launch_status();
}

const char* palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                                 uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                                 uint32_t* row_offsets, void* stream) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  const int64_t bpr = plan::blocks_per_row(cols);
  if (rows * bpr > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  if (!grid_ok(plan::enc_grid(rows, cols)) || !grid_ok(plan::warp_grid(rows))) return "matrix too large";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  palette_encode_kernel<<<static_cast<unsigned>(plan::enc_grid(rows, cols)), plan::ENC_THREADS, 0, s>>>(
      EncArgs{exps, rows, cols, idx, flags}, pal);
  row_count_kernel<<<static_cast<unsigned>(plan::warp_grid(rows)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      flags, rows, bpr, row_counts);
  scan_kernel<<<1, plan::SCAN_THREADS, 0, s>>>(row_counts, rows, row_offsets);
  return launch_status();
}

const char* palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols,
                                 const uint8_t* flags, const uint32_t* row_offsets, int64_t nv,
                                 uint32_t* vpos, uint8_t* vexp, void* stream) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  const int64_t bpr = plan::blocks_per_row(cols);
  if (nv < 0 || nv > rows * bpr) return "bad verbatim block count";
  if (nv == 0) return nullptr;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  compact_kernel<<<static_cast<unsigned>(plan::warp_grid(rows)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      flags, rows, bpr, row_offsets, vpos);
  gather_vexp_kernel<<<static_cast<unsigned>(plan::warp_grid(nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      exps, cols, vpos, nv, vexp);
  return launch_status();
}

const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                         const uint32_t* vpos, int64_t nv, const uint8_t* vexp, float* corr,
                         uint16_t* y, int64_t ldy, void* stream) {
  if (const char* e = check_gemm(M, N, K, ldx, ldy, pal, nv, corr)) return e;
  if (!aligned(x, 16) || !aligned(sm, 8) || !aligned(idx, 4))
    return "palette_gemm needs x 16-byte, sm 8-byte and idx 4-byte aligned";
  if (!grid_ok(plan::gemm_grid(N)) || (nv > 0 && !grid_ok(plan::warp_grid(nv)))) return "matrix too large";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GemmArgs a{x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, corr, y, ldy};
  // The correction must be complete before any row adds it: same stream, launched first.
  if (nv > 0)
    gemm_correction_kernel<<<static_cast<unsigned>(plan::warp_grid(nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(a);
  GemmTable<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>::launch(M, a, s);
  return launch_status();
}

const char* huffman_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                         int64_t N, int64_t K, int64_t R, int64_t C, const uint16_t* lut,
                         float* part, uint16_t* y, int64_t ldy, int32_t* err, void* stream_handle) {
  if (const char* e = check_hgemm(M, N, K, R, C, ldx, ldy, stream_bytes, part)) return e;
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  const HGemmArgs a{x, ldx, M, sm, stream, stream_bytes, off, N, K, R, C, part, y, ldy};
  const bool vec = hgemm_vec(sm, K, C);
  const cudaStream_t s = static_cast<cudaStream_t>(stream_handle);
  switch (plan::hgemm_mtile(M)) {
    case 1: return launch_hgemm_m<1>(a, vec, lut, err, s);
    case 2: return launch_hgemm_m<2>(a, vec, lut, err, s);
    case 4: return launch_hgemm_m<4>(a, vec, lut, err, s);
    case 8: return launch_hgemm_m<8>(a, vec, lut, err, s);
    default: return launch_hgemm_m<16>(a, vec, lut, err, s);
  }
}

// =======================================================================================
// Host emulation: the bodies above, serially, over the kernels' launch geometry (including
// the threads a grid rounds up to, which must do nothing).
// =======================================================================================
namespace emulate {

const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint8_t* table,
                           int exp_lo, int exp_hi, int64_t g0, int64_t g1, int64_t c0, int64_t c1,
                           const uint8_t* sm, int64_t sm_stride, uint16_t* out16, uint8_t* out8,
                           int64_t out_stride, int32_t* err) {
  if (const char* e = check_huff(stream_bytes, rows, cols, R, C, g0, g1, c0, c1, sm_stride, out16,
                                 out8, out_stride))
    return e;
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  const int n = exp_hi - exp_lo + 1;
  std::vector<uint16_t> lut(HUFF_NUM_CTX * LUT_SIZE);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    if (!build_lut(table + t * n, n, exp_lo, &lut[t * LUT_SIZE], nullptr)) ++*err;
  const HuffArgs a{stream, stream_bytes, off, rows, cols, R, C, g0, g1, c0, c1,
                   sm, sm_stride, out16, out8, out_stride};
  const int64_t nsel = (g1 - g0) * (c1 - c0);
  const int64_t grid = plan::huffman_grid(nsel);
  for (int64_t b = 0; b < grid; ++b)
    for (int t = 0; t < plan::HUFF_THREADS; ++t) {
      const int64_t i = b * plan::HUFF_THREADS + t;
      if (i >= nsel) continue;
      const bool ok = out8 ? huff_segment_body<true>(i, a, lut.data()) : huff_segment_body<false>(i, a, lut.data());
      if (!ok) ++*err;
    }
  return nullptr;
}

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
