// Host emulation of the palette decode and transcode kernels (kernels.cuh, namespace
// emulate): their bodies on the host over the kernels' launch geometry (the per-thread
// palette decode serially, or through the warp emulator while its access profile is on; the
// cooperative transcode kernels through the warp emulator), so
// CPU-only CI checks the index math and decode logic bit for bit.  Compiled by nvcc like the
// kernels, so the bodies see the same __host__ __device__ definitions as on the device.
#include <algorithm>
#include <cstring>
#include <vector>

#include "emu/warp_emu.h"
#include "crc32.cuh"
#include "launch_util.h"
#include "palette_decode.cuh"
#include "prefetch.cuh"
#include "transcode.cuh"

namespace unweight {
namespace cuda {

using namespace detail;

// =======================================================================================
// Host emulation: the kernel bodies, serially, over the kernels' launch geometry (including
// the threads a grid rounds up to, which must do nothing).
// =======================================================================================
namespace emulate {

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, int variant, int tiled, int* path) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride, tiled)) return e;
  bool vec = false;
  if (const char* e = pal_path(&variant, &vec, cols, k0, k1, out_stride, out, sm, idx)) return e;
  if (path) *path = variant;
  PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride, {}, tiled != 0};
  const bool wide = variant == plan::PAL_VARIANT_WIDE, paired = pal_tables(pal, a.pt);
  int64_t total, grid;
  pal_launch_size(variant, r1 - r0, k1 - k0, &total, &grid);
  auto thread = [&](int64_t t) {
    if (t >= total) return;
    const bool ok = wide ? (paired ? pal_decode_wide_body<true>(t, a) : pal_decode_wide_body<false>(t, a))
                         : (vec ? pal_decode_body<true>(t, a) : pal_decode_body<false>(t, a));
    if (!ok) ++*err;
  };
  if (emu::profiling()) {
    // Through the warp emulator, so that the access profile sees the warps' loads and stores
    // (the bodies have no collectives: serially, below, they give the same bits faster).
    if (const char* e = emu::launch(grid, 1, plan::PAL_THREADS, 0, [&](emu::ThreadCtx& c) {
          thread(c.block_x() * plan::PAL_THREADS + c.tid());
        }))
      return e;
  } else {
    for (int64_t t = 0; t < grid * plan::PAL_THREADS; ++t) thread(t);
  }
  const PatchArgs p{sm, rows, cols, r0, r1, k0, k1, vpos, nv, vexp, out, out_stride, tiled != 0};
  for (int64_t w = 0; w < plan::warp_grid(nv) * plan::WARPS_PER_CTA; ++w) {
    if (w >= nv) continue;
    for (int lane = 0; lane < plan::WARP; ++lane)
      if (!patch_lane_body(w, lane, p)) ++*err;
  }
  return nullptr;
}

const char* palette_decode_slots(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                                 int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv_per,
                                 const uint8_t* vexp, uint16_t* out, int32_t* err, int variant, int* kind) {
  SlotPlan pl;
  if (const char* e = slots_plan(ids, slots, n, sm, idx, rows, cols, pal, vpos, nv_per, vexp, out, variant, &pl))
    return e;
  if (kind) *kind = pl.kind;
  for (int64_t slot = 0; slot < slots; ++slot) {  // grid y
    PalArgs a = pl.a;
    if (!slot_args(pl.sa, slot, &a, nullptr)) {
      ++*err;
      continue;
    }
    for (int64_t t = 0; t < pl.grid * plan::PAL_THREADS; ++t) {
      if (t < pl.total && !slot_decode_body(pl.kind, t, a)) ++*err;
    }
  }
  // The patch kernel runs after the decode kernel: every slot's decode first.
  for (int64_t slot = 0; slot < slots; ++slot) {
    PatchArgs p = pl.p;
    if (!slot_args(pl.sa, slot, nullptr, &p)) continue;
    for (int64_t w = 0; w < plan::warp_grid(nv_per) * plan::WARPS_PER_CTA; ++w) {
      if (w >= p.nv) continue;
      for (int lane = 0; lane < plan::WARP; ++lane)
        if (!patch_lane_body(w, lane, p)) ++*err;
    }
  }
  return nullptr;
}

const char* prefetch_l2(const uint8_t* const* p, const int64_t* bytes, int n) {
  PrefetchArgs a;
  int64_t lines = 0;
  if (const char* e = prefetch_plan(p, bytes, n, &a, &lines)) return e;
  if (a.n == 0) return nullptr;
  return emu::launch(plan::prefetch_grid(lines), 1, plan::PREFETCH_THREADS, 0,
                     [&](emu::ThreadCtx& c) { prefetch_body(c, a); });
}

const char* crc32_ranges(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out) {
  Crc32Args a;
  if (const char* e = crc32_plan(p, bytes, ranges, table, out, &a)) return e;
  std::fill(out, out + ranges, 0u);
  if (ranges == 0 || a.pieces == 0) return nullptr;
  return emu::launch(plan::crc_grid(ranges * a.pieces), 1, plan::CRC_THREADS, plan::CRC_TABLE_WORDS * 4,
                     [&](emu::ThreadCtx& c) { crc32_body(c, a); });
}

const char* exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist) {
  return emu::launch(plan::hist_grid(n), 1, plan::HIST_THREADS, kHistSmemBytes,
                     [&](emu::ThreadCtx& c) { hist_body(c, exps, n, hist); });
}

const char* palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                                 uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                                 uint32_t* row_offsets) {
  const int64_t bpr = plan::blocks_per_row(cols);
  const EncArgs a{exps, rows, cols, idx, flags};
  if (const char* e = emu::launch(plan::enc_grid(rows, cols), 1, plan::ENC_THREADS, kEncSmemBytes,
                                  [&](emu::ThreadCtx& c) { enc_body(c, a, pal); }))
    return e;
  if (const char* e = emu::launch(plan::warp_grid(rows), 1, plan::WARP_KERNEL_THREADS, 0,
                                  [&](emu::ThreadCtx& c) { row_count_body(c, flags, rows, bpr, row_counts); }))
    return e;
  return emu::launch(1, 1, plan::SCAN_THREADS, kScanSmemBytes,
                     [&](emu::ThreadCtx& c) { scan_body(c, row_counts, rows, row_offsets); });
}

const char* palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                                 const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp) {
  const int64_t bpr = plan::blocks_per_row(cols);
  if (const char* e = emu::launch(plan::warp_grid(rows), 1, plan::WARP_KERNEL_THREADS, 0, [&](emu::ThreadCtx& c) {
        compact_body(c, flags, rows, bpr, row_offsets, vpos);
      }))
    return e;
  return emu::launch(plan::warp_grid(nv), 1, plan::WARP_KERNEL_THREADS, 0,
                     [&](emu::ThreadCtx& c) { gather_vexp_body(c, exps, cols, vpos, nv, vexp); });
}

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
