// __host__ __device__ helpers shared by the kernel families (csrc/cuda/*.cu) and their host
// emulation (emulate.cu): cache-hinted loads, bit casts, the register palette lookup.  What
// the bits of the format mean is not here but in ../decode_primitives.h, shared with the CPU
// codec.
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
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "../decode_primitives.h"
#include "emu/ctx.cuh"  // trace_global (host side of the loads)
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
namespace detail {

using plan::cdiv;

// ---------------------------------------------------------------------------------------
// Loads.  Device: inline PTX for the cache hints (see the policy above).  Host (emulation):
// memcpy, which is what the hinted loads mean for the data, and a report to the emulator's
// access profile (emu/ctx.cuh, trace_global).
// ---------------------------------------------------------------------------------------
#if !defined(__CUDA_ARCH__)
// A 4-byte global load on the host: the word, reported to the emulator.
inline uint32_t host_ld_u32(const void* p) {
  emu::trace_global(p, 4, false);
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
#endif

UW_HD uint32_t ld_stream_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
#else
  return host_ld_u32(p);
#endif
}

UW_HD void ld_stream_v2(const uint8_t* p, uint32_t& a, uint32_t& b) {
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::no_allocate.v2.b32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p));
#else
  emu::trace_global(p, 8, false);
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
  emu::trace_global(p, 16, false);
  std::memcpy(v, p, 16);
#endif
}

// A read-only word the warp's lanes reuse (the verbatim lists' row index and ids): device, the
// read-only path through L1; host, memcpy and a report to the emulator (its bounds checks).
UW_HD uint32_t ld_ro_u32(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return host_ld_u32(p);
#endif
}

// Activations: reused across rows -> L1-allocating read-only load.
UW_HD void ld_reuse_v4(const uint16_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
#else
  emu::trace_global(p, 16, false);
  std::memcpy(v, p, 16);
#endif
}

// An L2 prefetch of [p, p + bytes) (1 <= bytes <= 128: at most one 128-byte line boundary
// crossed): the lines come from DRAM into L2 while the thread goes on, at no register cost, so
// a later load of them waits for L2 only.  Two per-thread line prefetches (its first and its
// last byte's line), not sm_90's bulk prefetch: that one is a warp-uniform instruction, which
// the compiler wraps in a loop over the lanes' distinct addresses (~9 instructions each).
// Host: the emulator checks the range against the launch's buffers (a prefetch must name
// valid memory).
UW_HD void prefetch_l2(const uint8_t* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p + bytes - 1));
#else
  emu::trace_prefetch(p, bytes);
#endif
}

// A prefetch of the 128-byte line holding p: into L2 (prefetch_l2 with one instruction, for
// callers that walk whole lines), or with kL1 into L1, for bytes the warp reads much later (a
// verbatim block's id and exponents), which then wait on L1 rather than on L2 or DRAM.  No
// register is held.  Host: the emulator checks the byte against the launch's buffers.
template <bool kL1 = false>
UW_HD void prefetch_line(const void* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (kL1) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
  } else {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
  }
#else
  emu::trace_prefetch(p, 1);
#endif
}

UW_HD void st_v4(uint16_t* p, const uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
#else
  emu::trace_global(p, 16, true);
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

// Bit counts of a ballot (device: the intrinsic; host: the builtin).  lowest_bit(0) is undefined.
UW_HD int popc(unsigned v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}
UW_HD int lowest_bit(unsigned v) {
#if defined(__CUDA_ARCH__)
  return __ffs(v) - 1;
#else
  return __builtin_ctz(v);
#endif
}

// Row r's entries [*lo, *hi) of a verbatim list of nv entries, from its row index (vrow[r], the
// first entry of row r or a later one: ops.verbatim_rows); an index that does not fit the list
// is clamped to it, so no read leaves vpos.
UW_HD void vrow_bounds(const uint32_t* vrow, int64_t r, int64_t nv, int64_t* lo, int64_t* hi) {
  const int64_t h = ld_ro_u32(vrow + r + 1), l = ld_ro_u32(vrow + r);
  *hi = h < nv ? h : nv;
  *lo = l < *hi ? l : *hi;
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

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
