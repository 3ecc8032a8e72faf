// Huffman -> palette transcode (from the exponent plane the Huffman kernel wrote with
// kExp = true): histogram -> (host picks the palette) -> nibbles + verbatim flags ->
// per-row counts -> exclusive scan -> ordered compaction -> verbatim exponents.  The
// count/scan/compaction (rather than an atomic append + sort) makes vpos come out ascending
// and bit-identical to the CPU encoder with no sort and no nondeterminism.
//
// Each kernel's body is written once over the thread context of emu/ctx.cuh: transcode.cu
// runs it as the kernel (emu::DeviceCtx) and emulate.cu through the warp emulator
// (emu::ThreadCtx), so the cooperative parts (shared-memory histograms and atomics, the
// scan's barriers, the compaction's ballots) run on the CPU as written and are checked there
// for shared-memory races.
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct EncArgs {
  const uint8_t* exps;
  int64_t rows, cols;
  uint8_t* idx;
  uint8_t* flags;
};

// pmap value of an exponent outside the palette.
constexpr uint8_t kMiss = 0x10;

// Shared memory of each body (dynamic: the bodies use no static __shared__).
constexpr int kHistSmemBytes = plan::HIST_THREADS / plan::WARP * 256 * 4;
constexpr int kEncSmemBytes = 256 * 4;
constexpr int kScanSmemBytes = plan::SCAN_THREADS * 4;

// Histogram of an exponent plane into hist[256] (added to it).  One 256-bin sub-histogram
// per warp: exponents concentrate on ~10 bins, so a single per-CTA histogram would
// serialise all 8 warps on the same few shared atomics.  Grid-stride over 16-byte vectors,
// the tail in CTA 0, then one global atomic per non-empty bin and CTA.
template <class Ctx>
UW_HD void hist_body(Ctx& c, const uint8_t* e, int64_t n, unsigned long long* hist) {
  constexpr int kWarps = plan::HIST_THREADS / plan::WARP;
  uint32_t* h = reinterpret_cast<uint32_t*>(c.smem());  // [kWarps][256]
  const int tid = c.tid();
  for (int j = tid; j < kWarps * 256; j += plan::HIST_THREADS) c.sts(h + j, 0u);
  c.syncthreads();
  uint32_t* mine = h + c.warp() * 256;
  const int64_t nvec = n / 16;
  const int64_t stride = c.grid_x() * plan::HIST_THREADS;
  for (int64_t v = c.block_x() * plan::HIST_THREADS + tid; v < nvec; v += stride) {
    uint32_t q[4];
    ld_stream_v4(e + 16 * v, q);
UW_UNROLL()
    for (int j = 0; j < 16; ++j) c.atomic_add(mine + ((q[j / 4] >> (8 * (j % 4))) & 0xFFu), 1u);
  }
  if (c.block_x() == 0)
    for (int64_t j = nvec * 16 + tid; j < n; j += plan::HIST_THREADS) c.atomic_add(mine + e[j], 1u);
  c.syncthreads();
  for (int b = tid; b < 256; b += plan::HIST_THREADS) {
    unsigned long long s = 0;
    for (int w = 0; w < kWarps; ++w) s += c.lds(h + w * 256 + b);
    if (s) c.atomic_add(hist + b, s);
  }
}

// One thread per (row, PAL_BLOCK-weight block): the verbatim decision is per block, so a thread that
// owns the whole block decides it with no inter-thread traffic.  Writes the block's index
// bytes (all 0 for a verbatim block, as the format requires) and its flag.  pmap(e): the
// nibble of exponent e, kMiss when it is not in the palette.
template <class Map>
UW_HD void enc_block_body(int64_t t, const EncArgs& a, const Map& pmap) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const int64_t r = t / bpr, b = t % bpr;
  const int64_t k0 = b * PAL_BLOCK, n = std::min<int64_t>(PAL_BLOCK, a.cols - k0);
  const uint8_t* er = a.exps + r * a.cols + k0;
  uint8_t* ir = a.idx + r * ((a.cols + 1) / 2) + k0 / 2;
  uint32_t miss = 0;
  for (int64_t c = 0; c < n; ++c) miss |= pmap(er[c]);
  miss &= kMiss;
  for (int64_t c = 0; c < n; c += 2) {
    const uint32_t lo = pmap(er[c]) & 0xFu;
    const uint32_t hi = c + 1 < n ? (pmap(er[c + 1]) & 0xFu) : 0u;
    ir[c / 2] = miss ? 0 : static_cast<uint8_t>(lo | (hi << 4));
  }
  a.flags[t] = miss ? 1 : 0;
}

// The encode CTA: the exponent -> nibble map (kMiss when absent) rebuilt per CTA in shared
// memory from the 16 register-resident palette entries (1 KB, cheaper than passing a device
// table; 32-bit entries, one per thread), then enc_block_body per thread.
template <class Ctx>
UW_HD void enc_body(Ctx& c, const EncArgs& a, const Palette& pal) {
  static_assert(plan::ENC_THREADS == 256, "enc_body fills its 256-entry map one entry per thread");
  uint32_t* pmap = reinterpret_cast<uint32_t*>(c.smem());  // [256]
  const int tid = c.tid();
  c.sts(pmap + tid, static_cast<uint32_t>(kMiss));
  c.syncthreads();
  if (tid < pal.size) c.sts(pmap + pal_exp(pal, static_cast<uint32_t>(tid)), static_cast<uint32_t>(tid));
  c.syncthreads();
  const int64_t t = c.block_x() * plan::ENC_THREADS + tid;
  if (t >= a.rows * plan::blocks_per_row(a.cols)) return;
  enc_block_body(t, a, [&](uint8_t e) { return c.lds(pmap + e); });
}

// Warp per row: the row's verbatim blocks (flags) counted by a butterfly.
template <class Ctx>
UW_HD void row_count_body(Ctx& c, const uint8_t* flags, int64_t rows, int64_t bpr, uint32_t* counts) {
  const int64_t r = c.block_x() * plan::WARPS_PER_CTA + c.warp();
  if (r >= rows) return;  // uniform per warp, so the full-mask shuffles below are legal
  const int lane = c.lane();
  uint32_t s = 0;
  for (int64_t b = lane; b < bpr; b += plan::WARP) s += flags[r * bpr + b];
  for (int o = 16; o > 0; o >>= 1) s += c.shfl_xor(s, o);
  if (lane == 0) counts[r] = s;
}

// Single CTA: exclusive scan of counts[rows] into offsets[rows+1].  Each thread owns a
// contiguous run of rows (serial sums), then a Hillis-Steele scan over the 1024 run totals.
// rows is at most a few hundred thousand, so one CTA is far below a microsecond per 1K rows.
template <class Ctx>
UW_HD void scan_body(Ctx& c, const uint32_t* counts, int64_t rows, uint32_t* offsets) {
  uint32_t* s = reinterpret_cast<uint32_t*>(c.smem());  // [SCAN_THREADS]
  const int tid = c.tid();
  const int64_t chunk = cdiv(rows, plan::SCAN_THREADS);
  const int64_t t0 = std::min(rows, tid * chunk), t1 = std::min(rows, t0 + chunk);
  uint32_t local = 0;
  for (int64_t r = t0; r < t1; ++r) local += counts[r];
  c.sts(s + tid, local);
  c.syncthreads();
  for (int off = 1; off < plan::SCAN_THREADS; off <<= 1) {
    const uint32_t v = tid >= off ? c.lds(s + tid - off) : 0u;
    c.syncthreads();
    c.sts(s + tid, c.lds(s + tid) + v);
    c.syncthreads();
  }
  uint32_t run = c.lds(s + tid) - local;
  for (int64_t r = t0; r < t1; ++r) {
    offsets[r] = run;
    run += counts[r];
  }
  if (tid == plan::SCAN_THREADS - 1) offsets[rows] = c.lds(s + tid);
}

// Warp per row: ballot over 32 blocks at a time, each flagged lane writes its id at
// base + (flagged lanes below it), so ids land in ascending order.
template <class Ctx>
UW_HD void compact_body(Ctx& c, const uint8_t* flags, int64_t rows, int64_t bpr, const uint32_t* offsets,
                        uint32_t* vpos) {
  const int64_t r = c.block_x() * plan::WARPS_PER_CTA + c.warp();
  if (r >= rows) return;  // uniform per warp, so the full-mask ballot below is legal
  const int lane = c.lane();
  uint32_t base = offsets[r];
  for (int64_t b0 = 0; b0 < bpr; b0 += plan::WARP) {
    const int64_t b = b0 + lane;
    const bool f = b < bpr && flags[r * bpr + b];
    const unsigned ballot = c.ballot(f);
    if (f) vpos[base + popc(ballot & ((1u << lane) - 1u))] = static_cast<uint32_t>(r * bpr + b);
    base += popc(ballot);
  }
}

// Warp per verbatim entry v: lane L copies exponents L, L+32, ... of the block (lane-strided:
// coalesced; 0 past the end of the row, as the CPU encoder pads).
template <class Ctx>
UW_HD void gather_vexp_body(Ctx& c, const uint8_t* exps, int64_t cols, const uint32_t* vpos, int64_t nv,
                            uint8_t* vexp) {
  const int64_t v = c.block_x() * plan::WARPS_PER_CTA + c.warp();
  if (v >= nv) return;
  const int64_t bpr = plan::blocks_per_row(cols);
  const int64_t r = vpos[v] / bpr, b = vpos[v] % bpr;
  for (int64_t jb = c.lane(); jb < PAL_BLOCK; jb += plan::WARP) {
    const int64_t col = b * PAL_BLOCK + jb;
    vexp[v * PAL_BLOCK + jb] = col < cols ? exps[r * cols + col] : 0;
  }
}

// ---------------------------------------------------------------------------------------
// Launchers (transcode.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
void launch_exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, cudaStream_t s);
// Nibbles + flags, per-row verbatim counts, exclusive scan: three launches in stream order.
void launch_palette_encode_pass1(const EncArgs& a, Palette pal, uint32_t* row_counts, uint32_t* row_offsets,
                                 cudaStream_t s);
// Ordered compaction of the flags into vpos, then the verbatim exponents (nv > 0).
void launch_palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                                 const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp,
                                 cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
