// L2 prefetch of whole weights: brings the planes a coming matmul streams from DRAM into L2
// while compute-light kernels run (runtime/prefetch.py launches it on a side stream between
// two matmuls), so the matmul's loads wait on L2, not DRAM.  A hint: it writes nothing and a
// line evicted before use costs only the DRAM read it was meant to save.
//
// The body is written once over the thread context of emu/ctx.cuh: prefetch.cu runs it as the
// kernel and emulate.cu through the warp emulator, which checks every prefetched line against
// the launch's buffers.
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct PrefetchArgs {
  const uint8_t* p[plan::PREFETCH_MAX_RANGES];
  int64_t bytes[plan::PREFETCH_MAX_RANGES];
  int n;  // ranges used
};

// Thread t of the grid prefetches lines t, t + stride, ... of each range, the range's first
// byte's line and then every PREFETCH_LINE bytes on, and thread 0 its last byte's line too
// (a range need not start on a line).
template <class Ctx>
UW_HD void prefetch_body(Ctx& c, const PrefetchArgs& a) {
  const int64_t t = c.block_x() * plan::PREFETCH_THREADS + c.tid();
  const int64_t stride = c.grid_x() * plan::PREFETCH_THREADS;
  // Unrolled over the ranges so each is read from the kernel's parameters at a constant offset
  // (a loop with a variable index copies them to the stack first).
UW_UNROLL()
  for (int r = 0; r < plan::PREFETCH_MAX_RANGES; ++r) {
    if (r >= a.n) break;
    const int64_t lines = plan::cdiv(a.bytes[r], plan::PREFETCH_LINE);
    for (int64_t l = t; l < lines; l += stride) prefetch_line(a.p[r] + l * plan::PREFETCH_LINE);
    if (t == 0 && a.bytes[r] > 0) prefetch_line(a.p[r] + a.bytes[r] - 1);
  }
}

// The arguments of n ranges (empty ones dropped), or the error (launch.cu); *lines: the most
// lines of one range, which sizes the grid (plan::prefetch_grid).
const char* prefetch_plan(const uint8_t* const* p, const int64_t* bytes, int n, PrefetchArgs* a, int64_t* lines);

// The launch alone (prefetch.cu); launch.cu checks the ranges and sizes the grid first.
void launch_prefetch_l2(const PrefetchArgs& a, int64_t ctas, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
