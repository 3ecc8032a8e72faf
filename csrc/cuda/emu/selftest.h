// Self-tests of the warp emulator (selftest.cu): small bodies that exercise each part of the
// context interface, run on the host through emu::launch and, for the mma, on a GPU through
// the same body, so the two can be compared where a GPU exists; and the emulator's settings,
// the CTA order and the memory-access profile.  No CUDA types here (the bindings compile with the host compiler).
#pragma once
#include <cstdint>
#include <string>

namespace unweight {
namespace emu {

// D[16][8] = A[16][16] @ B[16][8] + C[16][8] through one warp's mma_bf16_16816, with the
// fragments loaded by the PTX ISA's formulas (written out in the body, independently of
// the layout helpers the emulator uses).  A, B: bf16 bits, row-major; C, D: fp32 row-major.
const char* selftest_mma_host(const uint16_t* A, const uint16_t* B, const float* C, float* D);
// The same body on the device (device pointers; stream a cudaStream_t or 0).
const char* selftest_mma_device(const uint16_t* A, const uint16_t* B, const float* C, float* D, void* stream);

// D[64][n] = A[64][16] @ B[16][n] (A, B bf16 bits row-major, D fp32 row-major) through one
// warpgroup's wgmma m64nNk16, n in 8, 16, 32, 64, 128, A in registers and B in shared memory
// laid out by the PTX ISA's formulas written out in the body.  kind 0 by the rules; 1-5 each
// break one (no fence.proxy.async, no wgmma.fence, B rewritten before the wait by another
// thread, a swizzled descriptor, B rewritten before the wait by the issuing thread) and must
// return the emulator's error.
const char* selftest_wgmma_host(int kind, int n, const uint16_t* A, const uint16_t* B, float* D);
// The kind-0 body on the device (sm_90a; device pointers; stream a cudaStream_t or 0).
const char* selftest_wgmma_device(int n, const uint16_t* A, const uint16_t* B, float* D, void* stream);

// One CTA of 64 threads; out[64][kCollectiveFields] int32 per thread:
//   0 warp sum of lane ids by a shfl_xor butterfly   1 ballot(lane % 3 == 0)
//   2 shfl from lane (lane + 5) % 32                 3 smem[63 - tid] after a barrier (tid^2 stored)
//   4 the word lane (lane + 1) % 32 of the warp stored (3 x its tid), read after a syncwarp
//   5 first word of the thread's cp.async stage after cp_async_wait<0> (src[8 * tid])
//   6 after cp_async_wait<1> with two groups in flight: the older group's word (src[8 * tid + 4])
//   7 the newer group's word after cp_async_wait<0> (src[8 * tid])
//   8 shfl from lane 3 under mask 0x0000FFFF (lanes 0-15 only; -1 elsewhere)
constexpr int kCollectiveFields = 9;
const char* selftest_collectives_host(const uint32_t* src, int32_t* out);

// Bodies that break a rule; each must return an error string (64 threads, 64 words of
// shared memory then a 16-byte stage per thread):
//   kind 0: lane 0 skips a syncwarp (a hang on the GPU)
//   kind 1: lane 5 names another mask than the rest of its warp in one ballot
//   kind 2: one thread waits in syncthreads while its warp waits for it in a syncwarp
//   kind 3: a thread reads a word the other warp wrote, with only a syncwarp in between
//   kind 4: a lane reads its neighbour's word with only a ballot in between
//   kind 5: a lane rewrites its word after lane 0 read it, with no syncwarp in between
//   kind 6: a thread reads its cp.async stage before waiting for it
//   kind 7: a thread reads a neighbour's stage that the neighbour has not waited for
//   kind 8: a read one word past the launch's shared memory
//   kind 9: an 8-byte read at a 4-byte aligned address
//   kind 10: a read of a word no thread wrote
//   kind 11: every thread adds to one word atomically, then reads it with no barrier between
//   kind 12: a 2-byte read of the other warp's word, with no barrier between
//   kind 13: a 2-byte store (stores must cover whole words)
const char* selftest_error_host(int kind);

// One warp streams 4 steps of 512 bytes (src: 512 uint32) through a ring of two shared-memory
// slots filled by bulk copies (lane 0 issues, one mbarrier per slot, every lane waits on its
// slot's parity and reads its 16 bytes of the step); out[32][4]: per lane, the sums over the
// steps of its four words.  kind 0 follows the rules; each other kind breaks one and must
// return an error: 1 step 1 read before its wait, 2 a slot refilled before the syncwarp that
// orders the other lanes' reads of it, 3 no fence.mbarrier_init before the first copy, 4 the
// last step never waited for, 5 a phase expecting 16 bytes more than its copies bring (a hang
// on the GPU), 6 a copy of 8 bytes (sizes are multiples of 16), 7 two arrivals on a barrier
// initialised for one.
const char* selftest_bulk_host(int kind, uint32_t* out);

// Two CTAs handing each other fp32 words through global memory as the split-K fix-up does
// (st_grid, threadfence, an arrival count, ld_grid): kind 0 correctly, out[32] = t + 100 + t;
// kind 1 without the storing threads' threadfence, 2 without the loading threads', 3 with the
// storing threads' threadfence after the arrival.  Returns the emulator's error (none for 0).
const char* selftest_grid_host(int kind, float* out);
// One warp of a launch that may start before the one ahead of it ends (programmatic dependent
// launch): it streams a buffer no launch writes, then reads x, counts itself on a counter and
// writes y, all three marked GlobalBounds::after_wait.  kind 0 waits (grid_dep_wait) before
// them and lets the next launch start after; 1 reads x before its wait, 2 counts itself before
// it, 3 stores to y before it, 4 lets the next launch start before it: each an error.
const char* selftest_grid_dep_host(int kind);

// One warp of 32 threads makes one access per lane in `lanes` (a bit per lane), lane l at
// byte l * stride of its buffer, for the access profile (warp_emu.h, profile()):
//   op 0: shared load of `bytes` (1, 2, 4, 8 or 16; the words are first written by 4-byte stores)
//   op 1: shared store of `bytes` (4, 8 or 16)
//   op 2: cp.async of 16 bytes, global l * stride -> shared l * stride
//   op 3: global load of `bytes` (4, 8 or 16) through device_util.cuh's streaming loads
//   op 4: global store of 16 bytes through device_util.cuh's st_v4
// stride: 0..512, a multiple of the size.  bound >= 0: the launch runs with the global buffer's
// first `bound` bytes as its only buffer (global_bounds.h), so an access past them fails.
// Returns the emulator's error, or a message for bad arguments.
const char* selftest_access_host(int op, int bytes, int stride, uint32_t lanes, int64_t bound = -1);

// The access profile: every emulated launch from now on is profiled when `on`.  out[kind *
// kProfileFields + field] receives the totals since the last call (which are then reset):
// kind 0..5 shared load, shared store, cp.async shared write, global load, global store,
// cp.async global read; field requests, units (wavefronts or sectors), ideal units, bytes,
// requests above their ideal, largest bank degree.  worst: the shared request phase of the
// largest degree, described.
constexpr int kProfileKinds = 6, kProfileFields = 6;
void take_profile(bool on, uint64_t* out, std::string* worst);

// The order every later emulated launch runs its CTAs in (warp_emu.h, cta_order): 0 x
// fastest, then y; 1 the reverse; 2 a permutation drawn from `seed`; with `resident` CTAs in
// flight at once, taking turns drawn from `seed`.  False for another order or resident < 1
// (the setting is then unchanged).
bool set_cta_order(int order, uint64_t seed, int resident);

}  // namespace emu
}  // namespace unweight
