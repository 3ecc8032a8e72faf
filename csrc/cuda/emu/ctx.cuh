// The thread context a kernel body is written against, and its device implementation.
//
// A kernel whose threads cooperate (warp shuffles and ballots, shared memory and barriers,
// mma.sync, cp.async) is written ONCE as a template over a context type:
//
//     template <class Ctx> UW_HD void my_body(Ctx& c, const MyArgs& a) { ... c.ballot(p) ... }
//
//     __global__ void my_kernel(MyArgs a) { emu::DeviceCtx c; my_body(c, a); }      // GPU
//     emu::launch(grid, threads, smem, [&](emu::ThreadCtx& c) { my_body(c, a); });  // host
//
// DeviceCtx (here) maps every call to the hardware instruction; emu::ThreadCtx (warp_emu.h)
// runs each thread of a CTA as a fiber on the host and gives the same calls their CUDA / PTX
// meaning, so CPU-only CI runs the very code the GPU runs (index math, data layout,
// fragment shapes, pipeline order).  The interface, with CUDA's rules (every lane named in
// `mask` calls the same collective; `mask` includes the calling lane):
//
//   identity   tid() lane() warp() nthreads() block_x() block_y() grid_x() grid_y()
//   memory     smem()                         dynamic shared memory (bodies declare no
//                                             __shared__ arrays, so one buffer serves both
//                                             sides; a kernel may hand its body a static array
//                                             instead, where the emulator hands it smem())
//              lds<T>(p)  sts<T>(p, v)        a shared-memory load / store of one value of 4,
//                                             8 or 16 bytes (loads also of 1 or 2 bytes);
//              lds_v2(p, v)  lds_v4(p, v)     8 / 16 bytes into 2 / 4 words (LDS.64 /
//                                             LDS.128, p aligned to the size).  Bodies touch
//                                             shared memory only through these and cp_async16,
//                                             which is what lets the emulator check it for races
//              cp_async16(dst, src, n)        16-byte async copy global -> shared; bytes n..15
//                                             zero-filled (n in 0..16; src is still read as a
//                                             16-byte aligned address)
//              cp_async_commit()  cp_async_wait<N>()   PTX cp.async.commit_group / wait_group N
//   bulk       (sm_90+: the Hopper bulk-copy engine, completion counted on an mbarrier in
//              shared memory; PTX "Asynchronous data movement: cp.async.bulk", "mbarrier")
//              mbar_init(bar, count)          mbarrier.init: `count` arrivals complete a phase
//              mbar_init_fence()              fence.mbarrier_init: the inits are visible to the
//                                             copy engine (then a syncwarp / syncthreads)
//              mbar_arrive_expect_tx(bar, n)  one arrival, and n more bytes the phase waits for
//              bulk_copy(dst, src, n, bar)    cp.async.bulk global -> shared of n bytes (n, src
//                                             and dst multiples of 16), counted on bar
//              mbar_wait(bar, parity)         spins on mbarrier.try_wait.parity until the phase
//                                             of that parity has completed; the copies it
//                                             counted are then visible to the waiting thread
//   sync       syncthreads()  syncwarp(mask)  threadfence()
//              syncthreads_or(p)              __syncthreads_or: the barrier, returning whether
//                                             any thread of the CTA passed p true
//              grid_dep_wait()  grid_dep_launch()   programmatic dependent launch (sm_90+; no-ops
//                                             before, and for a launch without the attribute):
//                                             griddepcontrol.wait (the launches this one may have
//                                             started before are complete and their writes
//                                             visible: x, y and the scratch are touched only
//                                             after it) and griddepcontrol.launch_dependents
//              atomic_add(p, v)               atomicAdd on global or shared memory (int, unsigned,
//                                             unsigned long long); returns the old value
//              atomic_xor(p, v)               atomicXor on global or shared memory (unsigned)
//   grid       st_grid(p, v)  ld_grid(p)      an fp32 store to / load from global memory that
//                                             another CTA of the launch loads / stored (ld_grid
//                                             reads through L2); the emulator checks the
//                                             threadfences that order them (warp_emu.h)
//   warp       shfl(v, src, mask)  shfl_xor(v, lanemask, mask)  ballot(pred, mask)
//   tensor     mma_bf16_16816(d, a, b, c)     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//              (sm_90a: warpgroup MMA, every warp of an aligned group of 4 taking part)
//              smem_addr(p)                   p's shared-window address (wgmma_desc's start)
//              fence_proxy_async()            fence.proxy.async.shared::cta: the thread's
//                                             shared-memory writes, visible to wgmma's reads
//              wgmma_fence()  wgmma_commit()  wgmma_wait<N>(d)   wgmma.fence / commit_group /
//                                             wait_group N (d: the accumulators it hands back)
//              wgmma<N>(d, a, desc, scale_d)  wgmma.mma_async m64nNk16 f32 += bf16 x bf16, A
//                                             in registers, B K-major unswizzled in shared memory
//
// Free functions beside it (both sides): prmt (PTX prmt.b32, default mode), funnel_l
// (PTX shf.l.wrap.b32) and the
// m16n8k16 fragment layout (frag_a_row/col, frag_b_row/col, frag_c_row/col) as the PTX ISA
// states it, "Matrix Fragments for mma.m16n8k16 with floating point type".
#pragma once
#include <cstdint>

#include "../../decode_primitives.h"  // UW_HD

namespace unweight {
namespace emu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---------------------------------------------------------------------------------------
// prmt.b32 d, a, b, s (default mode): byte n of d is byte s[4n+2:4n] of {b, a} (a holds
// bytes 0-3, b bytes 4-7); when s[4n+3] is set, that byte's msb is replicated over all 8
// bits instead.  The replicate mode is part of the meaning: palette decodes rely on it.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
#else
  const uint64_t src = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 0xFu;
    uint32_t v = static_cast<uint32_t>(src >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) v = (v & 0x80u) ? 0xFFu : 0u;
    d |= v << (8 * n);
  }
  return d;
#endif
}

// ---------------------------------------------------------------------------------------
// Bit select (a & ~m) | (b & m) as one lop3.b32 on the device: with m a constant the compiler
// otherwise spends two (mask b, then merge), because a LOP3 takes one immediate.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t bitsel(uint32_t a, uint32_t b, uint32_t m) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xD8;" : "=r"(d) : "r"(a), "r"(b), "r"(m));  // a = 0xF0, b = 0xCC, m = 0xAA
  return d;
#else
  return (a & ~m) | (b & m);
#endif
}

// ---------------------------------------------------------------------------------------
// shf.l.wrap.b32 d, lo, hi, n (CUDA's __funnelshift_l): the high word of the 64-bit {hi, lo}
// shifted left by n & 31.  The wrap (the shift taken mod 32) is part of the meaning: the
// Huffman decoder shifts by a table entry whose bits above 4 hold the symbol.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t funnel_l(uint32_t lo, uint32_t hi, uint32_t n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(lo, hi, n);
#else
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<uint32_t>((v << (n & 31u)) >> 32);
#endif
}

// ---------------------------------------------------------------------------------------
// m16n8k16 fragments (bf16 A 16x16 row-major, B 16x8 "col", C/D 16x8 fp32), per the PTX
// ISA: groupID = lane >> 2, threadID_in_group = lane % 4.  Element i of a lane's fragment:
//   A (8 bf16 in 4 regs, reg = i/2, low half first): row = groupID (+8 for i in 2,3,6,7),
//     col = 2*threadID_in_group + (i & 1) (+8 for i >= 4)
//   B (4 bf16 in 2 regs): row (k) = 2*threadID_in_group + (i & 1) (+8 for i >= 2), col = groupID
//   C/D (4 fp32): row = groupID (+8 for i >= 2), col = 2*threadID_in_group + (i & 1)
// ---------------------------------------------------------------------------------------
UW_HD int frag_a_row(int lane, int i) { return (lane >> 2) + (((i >> 1) & 1) ? 8 : 0); }
UW_HD int frag_a_col(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 4 ? 8 : 0); }
UW_HD int frag_b_row(int lane, int i) { return 2 * (lane & 3) + (i & 1) + (i >= 2 ? 8 : 0); }
UW_HD int frag_b_col(int lane, int /*i*/) { return lane >> 2; }
UW_HD int frag_c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
UW_HD int frag_c_col(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

// ---------------------------------------------------------------------------------------
// Host side of the global-memory helpers of device_util.cuh (ld_stream_*, ld_reuse_v4, st_v4).
// Plain loads and stores of a body do not pass through the context, so while the emulator
// profiles a launch (warp_emu.h, profile()) it points this at the thread it is running and
// each helper reports its address and size there.  Null otherwise: the serial emulations
// and unprofiled launches pay one thread-local test per access.  Host functions: the device
// side of the helpers never calls them.
// ---------------------------------------------------------------------------------------
// kind: what the access is (a prefetch moves no data: the emulator checks its address range
// against the launch's buffers and leaves it out of the profile).
enum class GlobalKind { kLoad, kStore, kPrefetch };
struct GlobalTrace {
  void (*fn)(void* thread, const void* p, unsigned bytes, GlobalKind kind) = nullptr;
  void* thread = nullptr;
};
inline GlobalTrace& global_trace() {
  static thread_local GlobalTrace t;
  return t;
}
// Forced inline: the emulator names an access's instruction by the return address of the
// call below, which must therefore lie in the body's code at the helper's call site.
__attribute__((always_inline)) inline void trace_global(const void* p, unsigned bytes, bool store) {
  const GlobalTrace& t = global_trace();
  if (t.fn != nullptr) t.fn(t.thread, p, bytes, store ? GlobalKind::kStore : GlobalKind::kLoad);
}
__attribute__((always_inline)) inline void trace_prefetch(const void* p, unsigned bytes) {
  const GlobalTrace& t = global_trace();
  if (t.fn != nullptr) t.fn(t.thread, p, bytes, GlobalKind::kPrefetch);
}

// ---------------------------------------------------------------------------------------
// wgmma.mma_async m64nNk16, bf16 inputs, fp32 accumulators, A from registers and B (K-major,
// imm-trans-b = 0) from shared memory through a matrix descriptor (PTX ISA, "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate"; sm_90a only).  One wrapper per n: the
// accumulator count is part of the instruction's operand list.  d += A B when scale_d != 0.
// ---------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define UW_HAS_WGMMA 1
template <int N>
__device__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc, int scale_d);
template <>
__device__ __forceinline__ void wgmma_rs<8>(float (&d)[1][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %9, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3"
      "}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<32>(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<64>(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
template <>
__device__ __forceinline__ void wgmma_rs<128>(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
#endif

// The shared-memory matrix descriptor of a K-major, unswizzled ("interleaved") operand: core
// matrices of 8 rows x 16 bytes, each 128 contiguous bytes; lbo: bytes from a core matrix to
// the next along K, sbo: to the next along M / N; start: the operand's shared-window address
// (ctx smem_addr).  Bits 0-13 start >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4; base offset 0 and
// swizzle mode 0 (none).  The emulator decodes the same fields.
UW_HD uint64_t wgmma_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((start & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32);
}

// ---------------------------------------------------------------------------------------
// The GPU side: each call is the instruction (inline PTX where the CUDA intrinsic would
// hide a detail the emulator has to reproduce: cp.async's zero fill, wait_group's count).
// Methods are __host__ __device__ so that a body instantiated for either context compiles
// in both nvcc passes; only the device pass ever runs these.
// ---------------------------------------------------------------------------------------
struct DeviceCtx {
#if defined(__CUDA_ARCH__)
  UW_HD int tid() const { return static_cast<int>(threadIdx.x); }
  UW_HD int lane() const { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }
  UW_HD int warp() const { return static_cast<int>(threadIdx.x / kWarpSize); }  // (unsigned: a shift)
  UW_HD int nthreads() const { return static_cast<int>(blockDim.x); }
  UW_HD int64_t block_x() const { return blockIdx.x; }
  UW_HD int64_t block_y() const { return blockIdx.y; }
  UW_HD int64_t grid_x() const { return gridDim.x; }
  UW_HD int64_t grid_y() const { return gridDim.y; }
  UW_HD unsigned char* smem() const {
    extern __shared__ __align__(16) unsigned char uw_dynamic_smem[];
    return uw_dynamic_smem;
  }
  template <class T>
  UW_HD T lds(const T* p) const { return *p; }
  template <class T>
  UW_HD void sts(T* p, T v) const { *p = v; }
  UW_HD void lds_v4(const unsigned char* p, uint32_t (&v)[4]) const {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  }
  UW_HD void lds_v2(const unsigned char* p, uint32_t (&v)[2]) const {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = q.x; v[1] = q.y;
  }
  UW_HD void syncthreads() { __syncthreads(); }
  UW_HD bool syncthreads_or(bool p) { return __syncthreads_or(p) != 0; }
  UW_HD void syncwarp(unsigned mask = kFullMask) { __syncwarp(mask); }
  UW_HD void threadfence() { __threadfence(); }
  UW_HD void grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  }
  UW_HD void grid_dep_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  }
  UW_HD void st_grid(float* p, float v) const { *p = v; }
  // Through L2 (ld.global.cg): never a stale L1 line of what another SM wrote.
  UW_HD float ld_grid(const float* p) const {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
  }
  template <class T>
  UW_HD T atomic_add(T* p, T v) { return atomicAdd(p, v); }
  UW_HD unsigned atomic_xor(unsigned* p, unsigned v) { return atomicXor(p, v); }
  template <class T>
  UW_HD T shfl(T v, int src, unsigned mask = kFullMask) { return __shfl_sync(mask, v, src); }
  template <class T>
  UW_HD T shfl_xor(T v, int lanemask, unsigned mask = kFullMask) { return __shfl_xor_sync(mask, v, lanemask); }
  UW_HD unsigned ballot(bool p, unsigned mask = kFullMask) { return __ballot_sync(mask, p); }
  // .cg: the data goes to shared memory through L2 only (weights are read once; keep L1 for
  // what is reused).  src-size < 16 zero-fills the rest of the 16 bytes.
  UW_HD void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
  }
  UW_HD void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
  template <int N>
  UW_HD void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
  // The bulk-copy engine (sm_90+; the sm_80 build traps, and no launcher runs these there).
  static UW_HD unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
  UW_HD void mbar_init(uint64_t* bar, unsigned count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#else
    __trap();
#endif
  }
  UW_HD void mbar_init_fence() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    __trap();
#endif
  }
  UW_HD void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
#else
    __trap();
#endif
  }
  UW_HD void bulk_copy(void* smem_dst, const void* gmem_src, unsigned bytes, uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#else
    __trap();
#endif
  }
  UW_HD void mbar_wait(uint64_t* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
    unsigned done = 0;
    do {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.b32 %0, 1, 0, p;\n}"
          : "=r"(done)
          : "r"(smem_u32(bar)), "r"(parity)
          : "memory");
    } while (!done);
#else
    __trap();
#endif
  }
  // The shared-window address of p (what a wgmma descriptor holds).
  UW_HD uint32_t smem_addr(const void* p) const { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
  // Warpgroup MMA (sm_90a; elsewhere these trap and no launcher runs them).  fence_proxy_async:
  // this thread's generic-proxy writes of shared memory (stores, cp.async) become visible to
  // the async proxy wgmma reads B through.  wgmma_fence: before the first wgmma of a batch,
  // ordering the registers it reads (A, the accumulators) after the instructions that wrote
  // them.  wgmma: d += A B (scale_d != 0) or d = A B, A this warp's 16 rows of the m64 tile in
  // registers (the mma.sync m16n8k16 A layout), B [16, N] K-major in shared memory (desc), d[j]
  // the m16n8 accumulator fragment of columns 8j..8j+7 (the mma.sync C layout, per warp);
  // asynchronous: d, a and B's bytes stay untouched until wgmma_wait retires its group.
  UW_HD void fence_proxy_async() {
#if defined(UW_HAS_WGMMA)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    __trap();
#endif
  }
  UW_HD void wgmma_fence() {
#if defined(UW_HAS_WGMMA)
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
    __trap();
#endif
  }
  template <int N>
  UW_HD void wgmma(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc, bool scale_d) {
#if defined(UW_HAS_WGMMA)
    wgmma_rs<N>(d, a, desc, scale_d ? 1 : 0);
#else
    (void)d; (void)a; (void)desc; (void)scale_d;
    __trap();
#endif
  }
  UW_HD void wgmma_commit() {
#if defined(UW_HAS_WGMMA)
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
    __trap();
#endif
  }
  // wgmma_wait<N>(d): d, the accumulators of the groups it retires, pass through an empty asm
  // after the wait, so the compiler moves no read of them above it (a read there makes ptxas
  // serialise every wgmma of the kernel: its C7514 advisory).
  template <int N, int R>
  UW_HD void wgmma_wait(float (&d)[R][4]) {
#if defined(UW_HAS_WGMMA)
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#pragma unroll
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[r][e])::"memory");
#else
    (void)d;
    __trap();
#endif
  }
  UW_HD void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  }
#else
  // Host pass: declarations only (a body instantiated for DeviceCtx never runs on the host).
  UW_HD int tid() const { return 0; }
  UW_HD int lane() const { return 0; }
  UW_HD int warp() const { return 0; }
  UW_HD int nthreads() const { return 0; }
  UW_HD int64_t block_x() const { return 0; }
  UW_HD int64_t block_y() const { return 0; }
  UW_HD int64_t grid_x() const { return 0; }
  UW_HD int64_t grid_y() const { return 0; }
  UW_HD unsigned char* smem() const { return nullptr; }
  template <class T>
  UW_HD T lds(const T*) const { return T(); }
  template <class T>
  UW_HD void sts(T*, T) const {}
  UW_HD void lds_v4(const unsigned char*, uint32_t (&)[4]) const {}
  UW_HD void lds_v2(const unsigned char*, uint32_t (&)[2]) const {}
  UW_HD void syncthreads() {}
  UW_HD bool syncthreads_or(bool) { return false; }
  UW_HD void syncwarp(unsigned = kFullMask) {}
  UW_HD void threadfence() {}
  UW_HD void grid_dep_wait() {}
  UW_HD void grid_dep_launch() {}
  UW_HD void st_grid(float*, float) const {}
  UW_HD float ld_grid(const float*) const { return 0.f; }
  template <class T>
  UW_HD T atomic_add(T*, T) { return T(); }
  UW_HD unsigned atomic_xor(unsigned*, unsigned) { return 0; }
  template <class T>
  UW_HD T shfl(T v, int, unsigned = kFullMask) { return v; }
  template <class T>
  UW_HD T shfl_xor(T v, int, unsigned = kFullMask) { return v; }
  UW_HD unsigned ballot(bool, unsigned = kFullMask) { return 0; }
  UW_HD void cp_async16(void*, const void*, int = 16) {}
  UW_HD void cp_async_commit() {}
  template <int N>
  UW_HD void cp_async_wait() {}
  UW_HD void mbar_init(uint64_t*, unsigned) {}
  UW_HD void mbar_init_fence() {}
  UW_HD void mbar_arrive_expect_tx(uint64_t*, unsigned) {}
  UW_HD void bulk_copy(void*, const void*, unsigned, uint64_t*) {}
  UW_HD void mbar_wait(uint64_t*, unsigned) {}
  UW_HD uint32_t smem_addr(const void*) const { return 0; }
  UW_HD void fence_proxy_async() {}
  UW_HD void wgmma_fence() {}
  template <int N>
  UW_HD void wgmma(float (&)[N / 8][4], const uint32_t (&)[4], uint64_t, bool) {}
  UW_HD void wgmma_commit() {}
  template <int N, int R>
  UW_HD void wgmma_wait(float (&)[R][4]) {}
  UW_HD void mma_bf16_16816(float (&)[4], const uint32_t (&)[4], const uint32_t (&)[2], const float (&)[4]) {}
#endif
};

}  // namespace emu
}  // namespace unweight
