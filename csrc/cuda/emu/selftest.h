// Self-tests of the warp emulator (selftest.cu): small bodies that exercise each part of the
// context interface, run on the host through emu::launch and, for the mma, on a GPU through
// the same body, so the two can be compared where a GPU exists.  No CUDA types here (the
// bindings compile with the host compiler).
#pragma once
#include <cstdint>

namespace unweight {
namespace emu {

// D[16][8] = A[16][16] @ B[16][8] + C[16][8] through one warp's mma_bf16_16816, with the
// fragments loaded by the PTX ISA's formulas (written out in the body, independently of
// the layout helpers the emulator uses).  A, B: bf16 bits, row-major; C, D: fp32 row-major.
const char* selftest_mma_host(const uint16_t* A, const uint16_t* B, const float* C, float* D);
// The same body on the device (device pointers; stream a cudaStream_t or 0).
const char* selftest_mma_device(const uint16_t* A, const uint16_t* B, const float* C, float* D, void* stream);

// One CTA of 64 threads; out[64][kCollectiveFields] int32 per thread:
//   0 warp sum of lane ids by a shfl_xor butterfly   1 ballot(lane % 3 == 0)
//   2 shfl from lane (lane + 5) % 32                 3 smem[63 - tid] after a barrier (tid^2 stored)
//   4 first word of the thread's cp.async stage read BEFORE its wait (must be 0xA5A5A5A5)
//   5 the same word after cp_async_wait<0> (src[8 * tid])
//   6 after cp_async_wait<1> with two groups in flight: the older group's word (src[8 * tid])
//   7 the newer group's word at that point (still 0xA5A5A5A5)
//   8 shfl from lane 3 under mask 0x0000FFFF (lanes 0-15 only; -1 elsewhere)
constexpr int kCollectiveFields = 9;
const char* selftest_collectives_host(const uint32_t* src, int32_t* out);

// Bodies that break a rule; each must return an error string:
//   kind 0: lane 0 skips a syncwarp (a hang on the GPU)
//   kind 1: lane 5 names another mask than the rest of its warp in one ballot
//   kind 2: one thread waits in syncthreads while its warp waits for it in a syncwarp
const char* selftest_error_host(int kind);

}  // namespace emu
}  // namespace unweight
