// =======================================================================================
// Huffman -> BF16 / exponent bytes, and the Huffman row gather.  Its own host API (argument
// checks, grid sizing) and host emulation are at the end of this file.
//
// Parallelism.  One thread per chain (huffman_decode.cuh): with the checkpoint index a
// 4096 x 4096 matrix is 16,384 independent chains of S = 1024 weights (65,536 at the
// loaders' S = 256; FORMAT.md "Checkpoint index", "Choosing S"), against 2,048 one-thread
// segments without it.  A chain is a serial dependency -- peek 12 bits, one shared-memory
// LUT load, shift by the code length -- so throughput comes from many chains in flight per
// SM, not from work inside one.  The variants (kernel_plan.h HUFF_VARIANT_*, design in
// docs/design/gpu-kernels.md) differ in when their loads are issued and in how many chains a
// thread runs at once (huff_chain_body: one, loads at use; huff_ahead_body: one or two, loads
// a block or a step ahead, or, for RING, stream copies into shared memory a step ahead), and in
// how many symbols one LUT load gives (PAIR: two, from a table of context pairs).
//
// Grid.  CTAs of HUFF_THREADS threads loop over chains (grid stride), and the grid is capped
// at the CTAs the device holds at once (occupancy API): each CTA then fills its 32 KiB LUT
// once however large the matrix, instead of once per HUFF_THREADS chains.
//
// Memory.  Per 32-weight step a lane loads 32 sign+mantissa bytes (two 16-byte loads, a full
// sector) and stores 64 bytes of BF16 (four 16-byte stores) assembled in registers; the
// stream comes in 16-byte blocks a block ahead of use (StreamBlocks).  Lanes of a warp work
// on chains S weights apart, so their accesses do not coalesce across lanes: every access is
// a whole sector (or two) of one lane's own, in address order.  Matrices whose shape or
// alignment rule the vector path out (K or C not a multiple of 32, S not a multiple of 32,
// unaligned planes) run the same chains through the scalar reader of decode_primitives.h.
//
// Corrupt data.  A chain decodes exactly its weight count (no data-dependent loop bound, so
// no hang), writes only its own weights, never loads outside the stream allocation (blocks
// past it read as zero), and adds 1 to *err when its offsets, checkpoint, codes or end
// position are wrong.
// =======================================================================================
#include <algorithm>
#include <type_traits>

#include "emu/host_buffer.h"
#include "emu/warp_emu.h"
#include "huffman_decode.cuh"
#include "launch_util.h"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

// Each kernel runs its CTA body from huffman_decode.cuh over the device thread context.
__global__ void build_lut_kernel(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err) {
  emu::DeviceCtx c;
  build_lut_body(c, table, n, lo, lut, err);
}

template <bool kExp, bool kVec>
__global__ void __launch_bounds__(plan::HUFF_THREADS)
huffman_chain_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  __shared__ __align__(16) uint16_t lut[HUFF_NUM_CTX * LUT_SIZE];
  emu::DeviceCtx c;
  huff_chain_cta<kExp, kVec>(c, lut, a, n_chains, lut_g, err);
}

// Residency: the 32 KiB LUT plus the 1 KiB an SM reserves per CTA fit 6 CTAs in an H100's
// 228 KiB, so one chain per thread may use up to 85 registers (6 CTAs); two chains are held
// to 128 (4 CTAs), which spills only in a chain's setup and end check.
template <bool kExp, int kWays>
__global__ void __launch_bounds__(plan::HUFF_THREADS, kWays == 2 ? 4 : 6)
huffman_ahead_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  __shared__ __align__(16) uint16_t lut[HUFF_NUM_CTX * LUT_SIZE];
  emu::DeviceCtx c;
  huff_ahead_cta<kExp, kWays>(c, lut, a, n_chains, lut_g, err);
}

// RING: the LUT and the threads' stream rings fill the 48 KiB of static shared memory a CTA
// may hold, 4 CTAs per SM (so up to 128 registers).
template <bool kExp>
__global__ void __launch_bounds__(plan::HUFF_THREADS, 4)
huffman_ring_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  __shared__ __align__(16) uint16_t lut[HUFF_NUM_CTX * LUT_SIZE];
  __shared__ __align__(16) unsigned char ring[kRingBytes];
  emu::DeviceCtx c;
  huff_ring_cta<kExp>(c, lut, ring, a, n_chains, lut_g, err);
}
static_assert(kLutBytes + kRingBytes <= 48 * 1024, "RING's static shared memory");

// RING_WIDE: RING's body in CTAs of HUFF_RING_WIDE_THREADS, the LUT and the rings in dynamic
// shared memory (64 KiB: past the 48 KiB a CTA may hold statically); 3 CTAs per SM, so up to
// 85 registers (the body takes 80 without spilling).
constexpr int kRingWideSmem = kLutBytes + ring_bytes(plan::HUFF_RING_WIDE_THREADS);
template <bool kExp>
__global__ void __launch_bounds__(plan::HUFF_RING_WIDE_THREADS, 3)
huffman_ring_wide_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  emu::DeviceCtx c;
  huff_ring_cta<kExp, plan::HUFF_RING_WIDE_THREADS>(c, reinterpret_cast<uint16_t*>(c.smem()), c.smem() + kLutBytes,
                                                     a, n_chains, lut_g, err);
}

// RING_MAX: RING's body in CTAs of HUFF_RING_MAX_THREADS, the LUT and the rings in dynamic
// shared memory (96 KiB), HUFF_RING_MAX_CTAS_PER_SM per SM, so up to 64 registers.
constexpr int kRingMaxSmem = kLutBytes + ring_bytes(plan::HUFF_RING_MAX_THREADS);
static_assert(plan::HUFF_RING_MAX_CTAS_PER_SM * (kRingMaxSmem + 1024) <= 228 * 1024,
              "RING_MAX's CTAs share an sm_90 SM");
template <bool kExp>
__global__ void __launch_bounds__(plan::HUFF_RING_MAX_THREADS, plan::HUFF_RING_MAX_CTAS_PER_SM)
huffman_ring_max_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  emu::DeviceCtx c;
  huff_ring_cta<kExp, plan::HUFF_RING_MAX_THREADS>(c, reinterpret_cast<uint16_t*>(c.smem()), c.smem() + kLutBytes,
                                                    a, n_chains, lut_g, err);
}

// PAIR: the LUT, the pair table and 256 rings in dynamic shared memory (96 KiB),
// HUFF_PAIR_CTAS_PER_SM per SM, so up to 128 registers.
constexpr int kPairSmem = pair_smem_bytes(plan::HUFF_PAIR_THREADS);
static_assert(plan::HUFF_PAIR_CTAS_PER_SM * (kPairSmem + 1024) <= 228 * 1024, "PAIR's CTAs share an sm_90 SM");
template <bool kExp>
__global__ void __launch_bounds__(plan::HUFF_PAIR_THREADS, plan::HUFF_PAIR_CTAS_PER_SM)
huffman_pair_kernel(HuffArgs a, int64_t n_chains, const uint16_t* __restrict__ lut_g, int32_t* err) {
  emu::DeviceCtx c;
  huff_pair_cta<kExp, plan::HUFF_PAIR_THREADS>(c, c.smem(), a, n_chains, lut_g, err);
}

__global__ void __launch_bounds__(plan::HUFF_THREADS)
huffman_gather_kernel(HGatherArgs a, int64_t n_units, const uint16_t* __restrict__ lut_g, int32_t* err) {
  __shared__ __align__(16) uint16_t lut[HUFF_NUM_CTX * LUT_SIZE];
  emu::DeviceCtx c;
  hgather_cta(c, lut, a, n_units, lut_g, err);
}

// CTAs of `kernel` (CTAs of `threads`, `smem` bytes of dynamic shared memory) the current
// device holds at once: the cap of a grid-stride launch.  The two queries cost a few
// microseconds, so each kernel's answer is kept per device.
int64_t resident_ctas(const void* kernel, int slot, int threads = plan::HUFF_THREADS, int smem = 0) {
  constexpr int kDevices = 64, kSlots = 17;
  static int64_t cache[kSlots][kDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) return 1;
  if (cache[slot][dev] > 0) return cache[slot][dev];
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    return 1;  // the launch that follows reports the error
  cache[slot][dev] = std::max<int64_t>(1, static_cast<int64_t>(sms) * std::max(1, per_sm));
  return cache[slot][dev];
}

template <bool kExp, bool kVec>
void launch_chains(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s, int slot) {
  const void* k = reinterpret_cast<const void*>(&huffman_chain_kernel<kExp, kVec>);
  const int64_t grid = plan::huffman_grid(n_chains, resident_ctas(k, slot));
  huffman_chain_kernel<kExp, kVec><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, n_chains, lut, err);
}

template <bool kExp, int kWays>
void launch_ahead(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s, int slot) {
  const void* k = reinterpret_cast<const void*>(&huffman_ahead_kernel<kExp, kWays>);
  const int64_t grid = plan::huffman_grid(cdiv(n_chains, kWays), resident_ctas(k, slot));
  huffman_ahead_kernel<kExp, kWays><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, n_chains, lut, err);
}

template <bool kExp>
void launch_ring(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s, int slot) {
  const void* k = reinterpret_cast<const void*>(&huffman_ring_kernel<kExp>);
  const int64_t grid = plan::huffman_grid(n_chains, resident_ctas(k, slot));
  huffman_ring_kernel<kExp><<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0, s>>>(a, n_chains, lut, err);
}

// RING's body in CTAs of kT threads whose LUT and rings take kSmem bytes of dynamic shared
// memory (RING_WIDE, RING_MAX).
template <auto kKernel, int kT, int kSmem>
void launch_ring_dyn(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s,
                     int slot) {
  opt_in_smem<kKernel>(kSmem);  // (before the occupancy query counts it)
  const void* k = reinterpret_cast<const void*>(kKernel);
  const int64_t grid = plan::huffman_grid(n_chains, resident_ctas(k, slot, kT, kSmem), kT);
  kKernel<<<static_cast<unsigned>(grid), kT, kSmem, s>>>(a, n_chains, lut, err);
}

template <bool kExp>
void launch_ring_wide(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s,
                      int slot) {
  launch_ring_dyn<huffman_ring_wide_kernel<kExp>, plan::HUFF_RING_WIDE_THREADS, kRingWideSmem>(a, n_chains, lut, err,
                                                                                             s, slot);
}

template <bool kExp>
void launch_ring_max(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s,
                     int slot) {
  launch_ring_dyn<huffman_ring_max_kernel<kExp>, plan::HUFF_RING_MAX_THREADS, kRingMaxSmem>(a, n_chains, lut, err,
                                                                                           s, slot);
}

template <bool kExp>
void launch_pair(const HuffArgs& a, int64_t n_chains, const uint16_t* lut, int32_t* err, cudaStream_t s, int slot) {
  launch_ring_dyn<huffman_pair_kernel<kExp>, plan::HUFF_PAIR_THREADS, kPairSmem>(a, n_chains, lut, err, s, slot);
}

}  // namespace

void launch_build_lut(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err, cudaStream_t s) {
  build_lut_kernel<<<1, 32, 0, s>>>(table, n, lo, lut, err);
}

}  // namespace detail

using namespace detail;

namespace {

// The checkpoint index arguments: none (S = 0, P = 0, no plane), or S as FORMAT.md allows it
// with P = ceil(n_max / S) - 1 entries per segment.
const char* check_index(const uint16_t* chk, int64_t S, int64_t P, int64_t rows, int64_t cols, int64_t R, int64_t C) {
  if (S == 0) return P == 0 && chk == nullptr ? nullptr : "checkpoint index given without its interval";
  if (S < 0 || S % CHK_ALIGN || S > CHK_MAX_INTERVAL) return "bad checkpoint interval";
  if (chk == nullptr) return "checkpoint interval given without the index";
  if (P != cdiv(std::min(R, rows) * std::min(C, cols), S) - 1)
    return "checkpoint index has the wrong number of entries per segment";
  return nullptr;
}

// Arguments of a decode, checked the same way by the launch and its emulation.
const char* check_chain_args(const HuffArgs& a) {
  if (const char* e = check_huff(a.stream_bytes, a.rows, a.cols, a.R, a.C, a.g0, a.g1, a.c0, a.c1, a.sm_stride,
                                 a.out16, a.out8, a.out_stride))
    return e;
  return check_index(a.chk, a.S, a.P, a.rows, a.cols, a.R, a.C);
}

// The vector path's conditions: every chain starts and ends on a 32-weight step inside one
// row of its segment (S, C and K multiples of 32), and the planes are 16-byte aligned.
bool huff_vec_ok(const HuffArgs& a) {
  if (a.S % kChainStep || a.C % kChainStep || a.cols % kChainStep) return false;
  if (!aligned(a.stream, 16) || !aligned(a.sm, 16) || a.sm_stride % 16) return false;
  return a.out16 ? aligned(a.out16, 16) && a.out_stride % 8 == 0 : aligned(a.out8, 16) && a.out_stride % 16 == 0;
}

// The variant a decode runs (checked by check_variant first): the one asked for, SCALAR
// when the vector conditions fail, and CHAIN for a look-ahead variant whose chains could
// exceed its 32-bit bit counts (segments of over ~178M weights decoded without an index).
int path_of(const HuffArgs& a, int variant) {
  if (variant == plan::HUFF_VARIANT_SCALAR || !huff_vec_ok(a)) return plan::HUFF_VARIANT_SCALAR;
  const int64_t chain_max = a.S ? a.S : std::min(a.R, a.rows) * std::min(a.C, a.cols);
  if (variant != plan::HUFF_VARIANT_CHAIN && chain_max * HUFF_MAX_CODE_LEN + 256 >= (int64_t{1} << 31))
    return plan::HUFF_VARIANT_CHAIN;
  return variant;
}

int64_t n_chains_of(const HuffArgs& a) {
  return (a.g1 - a.g0) * (a.c1 - a.c0) * plan::huffman_chains_per_segment(a.S, a.P);
}

const char* check_gather_args(const HGatherArgs& a) {
  if (a.rows <= 0 || a.cols <= 0 || a.R <= 0 || a.C <= 0) return "grid dimensions must be positive";
  if (a.R > (1 << 30) || a.C > (1 << 30)) return "segment too large";
  if (a.n_ids < 0 || a.out_stride < a.cols) return "bad id count or output row stride";
  if (a.stream_bytes < STREAM_SLACK_BYTES) return "exponent stream shorter than its slack";
  return check_index(a.chk, a.S, a.P, a.rows, a.cols, a.R, a.C);
}

int64_t n_units_of(const HGatherArgs& a) {
  return a.n_ids * cdiv(a.cols, a.C) * plan::hgather_units(a.S, a.P, std::min(a.C, a.cols));
}

// The variant of a decode: DEFAULT becomes the runtime's choice; anything else unknown is an
// error, not a silent fallback.
const char* check_variant(int* variant) {
  if (*variant == plan::HUFF_VARIANT_DEFAULT) *variant = plan::HUFF_DEFAULT_VARIANT;
  if (*variant < plan::HUFF_VARIANT_CHAIN || *variant > plan::HUFF_VARIANT_LAST)
    return "unknown huffman decode variant";
  return nullptr;
}

// The global LUT of a decode (kLutBytes of `store`, aligned as a device buffer), built as the
// device builds it (build_lut_kernel's body).
const char* host_lut(const uint8_t* table, int exp_lo, int exp_hi, int32_t* err, const emu::HostBuffer& store) {
  uint16_t* p = reinterpret_cast<uint16_t*>(store.data());
  const int n = exp_hi - exp_lo + 1;
  return emu::launch(1, 1, plan::WARP, 0, [&](emu::ThreadCtx& c) { build_lut_body(c, table, n, exp_lo, p, err); });
}

}  // namespace

// =======================================================================================
// Host API.
// =======================================================================================
const char* huffman_build_lut(const uint8_t* table, int exp_lo, int exp_hi, uint16_t* lut,
                              int32_t* err, void* stream) {
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  launch_build_lut(table, exp_hi - exp_lo + 1, exp_lo, lut, err, static_cast<cudaStream_t>(stream));
  return launch_status();
}

const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint16_t* lut,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out16, uint8_t* out8, int64_t out_stride,
                           const uint16_t* chk, int64_t S, int64_t P, int32_t* err, int variant,
                           void* stream_handle) {
  const HuffArgs a{stream, stream_bytes, off, rows, cols, R, C, g0, g1, c0, c1,
                   sm, sm_stride, out16, out8, out_stride, chk, S, P};
  if (const char* e = check_chain_args(a)) return e;
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  if (const char* e = check_variant(&variant)) return e;
  const int64_t n = n_chains_of(a);
  if (!grid_ok(cdiv(n, plan::HUFF_THREADS))) return "too many chains for one launch";
  const cudaStream_t s = static_cast<cudaStream_t>(stream_handle);
  switch (path_of(a, variant)) {
    case plan::HUFF_VARIANT_AHEAD:
      out8 ? launch_ahead<true, 1>(a, n, lut, err, s, 4) : launch_ahead<false, 1>(a, n, lut, err, s, 5);
      break;
    case plan::HUFF_VARIANT_AHEAD2:
      out8 ? launch_ahead<true, 2>(a, n, lut, err, s, 6) : launch_ahead<false, 2>(a, n, lut, err, s, 7);
      break;
    case plan::HUFF_VARIANT_RING:
      out8 ? launch_ring<true>(a, n, lut, err, s, 9) : launch_ring<false>(a, n, lut, err, s, 10);
      break;
    case plan::HUFF_VARIANT_RING_WIDE:
      out8 ? launch_ring_wide<true>(a, n, lut, err, s, 11) : launch_ring_wide<false>(a, n, lut, err, s, 12);
      break;
    case plan::HUFF_VARIANT_RING_MAX:
      out8 ? launch_ring_max<true>(a, n, lut, err, s, 13) : launch_ring_max<false>(a, n, lut, err, s, 14);
      break;
    case plan::HUFF_VARIANT_PAIR:
      out8 ? launch_pair<true>(a, n, lut, err, s, 15) : launch_pair<false>(a, n, lut, err, s, 16);
      break;
    case plan::HUFF_VARIANT_CHAIN:
      out8 ? launch_chains<true, true>(a, n, lut, err, s, 0) : launch_chains<false, true>(a, n, lut, err, s, 2);
      break;
    default:
      out8 ? launch_chains<true, false>(a, n, lut, err, s, 1) : launch_chains<false, false>(a, n, lut, err, s, 3);
  }
  return launch_status();
}

const char* huffman_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* stream, int64_t stream_bytes,
                                const uint32_t* off, int64_t rows, int64_t cols, int64_t R, int64_t C,
                                const uint16_t* lut, const uint8_t* sm, const uint16_t* chk, int64_t S, int64_t P,
                                uint16_t* out, int64_t out_stride, int32_t* err, void* stream_handle) {
  const HGatherArgs a{ids, n_ids, stream, stream_bytes, off, rows, cols, R, C, sm, chk, S, P, out, out_stride};
  if (const char* e = check_gather_args(a)) return e;
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  const int64_t n = n_units_of(a);
  if (n == 0) return nullptr;
  if (!grid_ok(cdiv(n, plan::HUFF_THREADS))) return "too many ids for one launch";
  const void* k = reinterpret_cast<const void*>(&huffman_gather_kernel);
  const int64_t grid = plan::huffman_grid(n, resident_ctas(k, 8));
  huffman_gather_kernel<<<static_cast<unsigned>(grid), plan::HUFF_THREADS, 0,
                          static_cast<cudaStream_t>(stream_handle)>>>(a, n, lut, err);
  return launch_status();
}

// =======================================================================================
// Host emulation: the kernels' CTA bodies through the warp emulator (LUT fill, barrier and
// every lookup checked as shared memory), over the kernels' grid with its cap replaced by
// `max_ctas` (a small cap runs each thread through several chains, as a big matrix does).
// =======================================================================================
namespace emulate {

// The LUT of an emulated CTA: the launch's dynamic shared memory (kLutBytes), which is what the
// emulator's race check covers.
uint16_t* emu_lut(emu::ThreadCtx& c) { return reinterpret_cast<uint16_t*>(c.smem()); }

const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint8_t* table,
                           int exp_lo, int exp_hi, int64_t g0, int64_t g1, int64_t c0, int64_t c1,
                           const uint8_t* sm, int64_t sm_stride, uint16_t* out16, uint8_t* out8,
                           int64_t out_stride, const uint16_t* chk, int64_t S, int64_t P, int32_t* err,
                           int64_t max_ctas, int variant, int* path) {
  const HuffArgs a{stream, stream_bytes, off, rows, cols, R, C, g0, g1, c0, c1,
                   sm, sm_stride, out16, out8, out_stride, chk, S, P};
  if (const char* e = check_chain_args(a)) return e;
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  if (const char* e = check_variant(&variant)) return e;
  const emu::HostBuffer lut_g(kLutBytes);
  const uint16_t* lut = reinterpret_cast<const uint16_t*>(lut_g.data());
  if (const char* e = host_lut(table, exp_lo, exp_hi, err, lut_g)) return e;
  const int64_t n = n_chains_of(a);
  const int run = path_of(a, variant);
  if (path) *path = run;
  if (n == 0) return nullptr;
  const bool vec = run != plan::HUFF_VARIANT_SCALAR;
  const int64_t cap = max_ctas > 0 ? max_ctas : INT64_MAX;
  // RING, RING_WIDE and RING_MAX: the same body in CTAs of their sizes.
  auto ring = [&](auto threads) {
    constexpr int kT = decltype(threads)::value;
    return emu::launch(plan::huffman_grid(n, cap, kT), 1, kT, kLutBytes + ring_bytes(kT), [&](emu::ThreadCtx& c) {
      uint16_t* s = emu_lut(c);
      unsigned char* rs = c.smem() + kLutBytes;
      if (out8) huff_ring_cta<true, kT>(c, s, rs, a, n, lut, err);
      else huff_ring_cta<false, kT>(c, s, rs, a, n, lut, err);
    });
  };
  if (run == plan::HUFF_VARIANT_RING) return ring(std::integral_constant<int, plan::HUFF_THREADS>{});
  if (run == plan::HUFF_VARIANT_RING_WIDE) return ring(std::integral_constant<int, plan::HUFF_RING_WIDE_THREADS>{});
  if (run == plan::HUFF_VARIANT_RING_MAX) return ring(std::integral_constant<int, plan::HUFF_RING_MAX_THREADS>{});
  if (run == plan::HUFF_VARIANT_PAIR) {
    constexpr int kT = plan::HUFF_PAIR_THREADS;
    return emu::launch(plan::huffman_grid(n, cap, kT), 1, kT, kPairSmem, [&](emu::ThreadCtx& c) {
      if (out8) huff_pair_cta<true, kT>(c, c.smem(), a, n, lut, err);
      else huff_pair_cta<false, kT>(c, c.smem(), a, n, lut, err);
    });
  }
  if (run == plan::HUFF_VARIANT_AHEAD || run == plan::HUFF_VARIANT_AHEAD2) {
    const int ways = plan::huffman_ways(run);
    return emu::launch(plan::huffman_grid(cdiv(n, ways), cap), 1, plan::HUFF_THREADS, kLutBytes,
                       [&](emu::ThreadCtx& c) {
                         uint16_t* s = emu_lut(c);
                         if (ways == 2 && out8) huff_ahead_cta<true, 2>(c, s, a, n, lut, err);
                         if (ways == 2 && !out8) huff_ahead_cta<false, 2>(c, s, a, n, lut, err);
                         if (ways == 1 && out8) huff_ahead_cta<true, 1>(c, s, a, n, lut, err);
                         if (ways == 1 && !out8) huff_ahead_cta<false, 1>(c, s, a, n, lut, err);
                       });
  }
  return emu::launch(plan::huffman_grid(n, cap), 1, plan::HUFF_THREADS, kLutBytes, [&](emu::ThreadCtx& c) {
    uint16_t* s = emu_lut(c);
    if (vec && out8) huff_chain_cta<true, true>(c, s, a, n, lut, err);
    if (vec && !out8) huff_chain_cta<false, true>(c, s, a, n, lut, err);
    if (!vec && out8) huff_chain_cta<true, false>(c, s, a, n, lut, err);
    if (!vec && !out8) huff_chain_cta<false, false>(c, s, a, n, lut, err);
  });
}

const char* huffman_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* stream, int64_t stream_bytes,
                                const uint32_t* off, int64_t rows, int64_t cols, int64_t R, int64_t C,
                                const uint8_t* table, int exp_lo, int exp_hi, const uint8_t* sm, const uint16_t* chk,
                                int64_t S, int64_t P, uint16_t* out, int64_t out_stride, int32_t* err,
                                int64_t max_ctas) {
  const HGatherArgs a{ids, n_ids, stream, stream_bytes, off, rows, cols, R, C, sm, chk, S, P, out, out_stride};
  if (const char* e = check_gather_args(a)) return e;
  if (!(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255)) return "bad exponent range";
  const emu::HostBuffer lut_g(kLutBytes);
  const uint16_t* lut = reinterpret_cast<const uint16_t*>(lut_g.data());
  if (const char* e = host_lut(table, exp_lo, exp_hi, err, lut_g)) return e;
  const int64_t n = n_units_of(a);
  if (n == 0) return nullptr;
  return emu::launch(plan::huffman_grid(n, max_ctas > 0 ? max_ctas : INT64_MAX), 1, plan::HUFF_THREADS, kLutBytes,
                     [&](emu::ThreadCtx& c) { hgather_cta(c, emu_lut(c), a, n, lut, err); });
}

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
