// Palette GEMV on CUDA cores (batches of 1..PGEMV_MAX_M): the kernel instantiations, the host
// API (palette_gemv: argument checks, palette tables, grid) and its host emulation through
// the warp emulator.  The body is pgemv_body in palette_gemv.cuh.
//
// __launch_bounds__(256, 3): 24 resident warps per SM (plan::PGEMV_WARPS_PER_SM), what the
// parts heuristic plans for; it caps registers at 80 per thread (64 spilled up to 400 bytes
// at four batch rows).  The deep variant: __launch_bounds__(256, 2), PGEMV_DEEP_UNROLL steps
// per batch of loads (kernel_plan.h).  The staged variant: __launch_bounds__(256, 4), loads
// through cp.async into per-warp shared-memory rings (PGEMV_STAGED_SMEM_BYTES of dynamic
// shared memory, under the 48 KB that needs no opt-in).  The tensor-core variant
// (pgemv_mma_body): batches of up to 32 rows; __launch_bounds__(256, 2) for one or two
// n-tiles of 8, (256, 1) for four.  Its staged form: (256, 2) at every batch (its loads in
// flight hold no registers, so four n-tiles fit 128), loads through cp.async into per-warp
// rings (PGEMV_MMA_STAGED_SMEM_BYTES, past 48 KB: opted in per device).  Its prefetching form:
// the register-direct kernel's bounds and shared memory.  Its bulk-copy form (sm_90+,
// tile-major planes): the staged form's bounds, steps fetched by cp.async.bulk into per-warp
// rings (PGEMV_MMA_BULK_SMEM_BYTES, opted in); the launcher refuses it on an older device.  Its
// queued form (pgemv_mma_queue_body, palette_gemv_queue): the register-direct kernel's bounds,
// no shared memory, a persistent grid the caller sizes (plan::pgemv_mma_queue_grid).
#include <cuda_runtime.h>

#include <type_traits>

#include "emu/warp_emu.h"
#include "launch_util.h"
#include "palette_gemv.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

// A variant's compile-time parameters (V: a resolved plan::PGEMV_VARIANT_*): pgemv_body's steps
// per batch of loads and staging, and the launch's dynamic shared memory.
template <int V>
struct PgemvVariant {
  static constexpr bool kMma = plan::pgemv_is_mma(V);
  static constexpr bool kStaged = V == plan::PGEMV_VARIANT_STAGED || V == plan::PGEMV_VARIANT_MMA_STAGED;
  static constexpr bool kPrefetch = V == plan::PGEMV_VARIANT_MMA_PREFETCH;
  static constexpr bool kBulk = V == plan::PGEMV_VARIANT_MMA_BULK;
  static constexpr bool kQueue = V == plan::PGEMV_VARIANT_MMA_QUEUE;
  static constexpr bool kSplit = V == plan::PGEMV_VARIANT_MMA_SPLIT;
  static constexpr int kUnroll = V == plan::PGEMV_VARIANT_DEEP ? plan::PGEMV_DEEP_UNROLL : kStaged ? 1 : plan::PGEMV_UNROLL;
  static constexpr int kSmem = kMma ? (kStaged ? plan::PGEMV_MMA_STAGED_SMEM_BYTES
                                      : kBulk  ? plan::PGEMV_MMA_BULK_SMEM_BYTES
                                      : kQueue ? 0
                                               : plan::PGEMV_MMA_SMEM_BYTES)
                                    : kStaged ? plan::PGEMV_STAGED_SMEM_BYTES : plan::PGEMV_SMEM_BYTES;
  static_assert(kUnroll >= 1, "steps per batch of loads");  // (also what keeps kUnroll referenced for MMA)
  static_assert(!kPrefetch || (kMma && !kStaged), "the L2 prefetch feeds the register-direct tensor-core GEMV");
  static_assert(!kSplit || (kMma && !kStaged && !kBulk), "the split layout feeds the register-direct tensor-core GEMV");
};

// MB: batch rows the registers hold (the tensor-core variant: 8 per n-tile).
template <int MB, bool kPaired, int V, class Ctx>
UW_HD void pgemv_variant_body(Ctx& c, const PgemvArgs& a) {
  if constexpr (PgemvVariant<V>::kQueue)
    pgemv_mma_queue_body<MB / 8, kPaired>(c, a);
  else if constexpr (PgemvVariant<V>::kSplit)
    pgemv_mma_body<MB / 8, true, false, false, false, plan::PGEMV_PROBE_NONE, true>(c, a);
  else if constexpr (PgemvVariant<V>::kMma)
    pgemv_mma_body<MB / 8, kPaired, PgemvVariant<V>::kStaged, PgemvVariant<V>::kPrefetch, PgemvVariant<V>::kBulk>(
        c, a);
  else
    pgemv_body<MB, kPaired, PgemvVariant<V>::kUnroll, PgemvVariant<V>::kStaged>(c, a);
}

// One kernel per variant: each has its own __launch_bounds__ (and name, for the profiles).
template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS, plan::PGEMV_CTAS_PER_SM) pgemv_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_STD>(c, a);
}

template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS, plan::PGEMV_DEEP_CTAS_PER_SM) pgemv_deep_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_DEEP>(c, a);
}

template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS, plan::PGEMV_STAGED_CTAS_PER_SM)
    pgemv_staged_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_STAGED>(c, a);
}
static_assert(plan::PGEMV_STAGED_SMEM_BYTES <= 48 * 1024, "the staged GEMV's rings need no shared-memory opt-in");

// V: PGEMV_VARIANT_MMA, or PGEMV_VARIANT_MMA_SPLIT (the same kernel on split planes).
template <int MB, bool kPaired, int V = plan::PGEMV_VARIANT_MMA>
__global__ void __launch_bounds__(plan::PGEMV_THREADS,
                                  MB > 16 ? plan::PGEMV_MMA4_CTAS_PER_SM : plan::PGEMV_MMA_CTAS_PER_SM)
    pgemv_mma_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, V>(c, a);
}

template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS,
                                  MB > 16 ? plan::PGEMV_MMA4_RING_CTAS_PER_SM : plan::PGEMV_MMA_STAGED_CTAS_PER_SM)
    pgemv_mma_staged_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_MMA_STAGED>(c, a);
}
template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS,
                                  MB > 16 ? plan::PGEMV_MMA4_CTAS_PER_SM : plan::PGEMV_MMA_CTAS_PER_SM)
    pgemv_mma_prefetch_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_MMA_PREFETCH>(c, a);
}
template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS,
                                  MB > 16 ? plan::PGEMV_MMA4_RING_CTAS_PER_SM : plan::PGEMV_MMA_BULK_CTAS_PER_SM)
    pgemv_mma_bulk_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_MMA_BULK>(c, a);
}
template <int MB, bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS,
                                  MB > 16 ? plan::PGEMV_MMA4_CTAS_PER_SM : plan::PGEMV_MMA_CTAS_PER_SM)
    pgemv_mma_queue_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_variant_body<MB, kPaired, plan::PGEMV_VARIANT_MMA_QUEUE>(c, a);
}
// The register-direct tensor-core GEMV at MB 8 on a paired palette with one stage left out
// (kProbe: plan::PGEMV_PROBE_*; palette_gemv_probe): its bounds, shared memory and grid.
template <int kProbe>
__global__ void __launch_bounds__(plan::PGEMV_THREADS, plan::PGEMV_MMA_CTAS_PER_SM)
    pgemv_mma_probe_kernel(PgemvArgs a) {
  emu::DeviceCtx c;
  pgemv_mma_body<1, true, false, false, false, kProbe>(c, a);
}
static_assert(plan::PGEMV_MMA4_CTAS_PER_SM == plan::pgemv_mma_queue_ctas_per_sm(32) &&
                  plan::PGEMV_MMA_CTAS_PER_SM == plan::pgemv_mma_queue_ctas_per_sm(16),
              "the queued GEMV's grid plan holds its kernels' CTAs per SM");
static_assert(plan::PGEMV_MMA_BULK_CTAS_PER_SM * (plan::PGEMV_MMA_BULK_SMEM_BYTES + 1024) <= 228 * 1024,
              "the bulk-copy tensor-core GEMV's rings let PGEMV_MMA_BULK_CTAS_PER_SM CTAs share an sm_90 SM");
static_assert(plan::PGEMV_MMA_ROWS * plan::PGEMV_MMA_MAX_M * 4 <= plan::PGEMV_MMA_BULK_DEPTH * plan::PGEMV_MMA_BULK_SLOT,
              "a warp's sums fit its bulk ring");
static_assert(plan::PGEMV_MMA_STAGED_CTAS_PER_SM * (plan::PGEMV_MMA_STAGED_SMEM_BYTES + 1024) <= 228 * 1024,
              "the staged tensor-core GEMV's rings let PGEMV_MMA_STAGED_CTAS_PER_SM CTAs share an sm_90 SM");
static_assert(plan::PGEMV_MMA4_RING_CTAS_PER_SM <= plan::PGEMV_MMA_STAGED_CTAS_PER_SM &&
                  plan::PGEMV_MMA4_RING_CTAS_PER_SM <= plan::PGEMV_MMA_BULK_CTAS_PER_SM,
              "the ring variants' rings are the same at every batch: as many CTAs share an SM at batch 17-32");

// The kernel of a resolved variant V at MB batch rows.
template <int MB, bool kPaired, int V>
constexpr auto pgemv_kernel_of() {
  if constexpr (V == plan::PGEMV_VARIANT_MMA) return &pgemv_mma_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_MMA_STAGED) return &pgemv_mma_staged_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_MMA_PREFETCH) return &pgemv_mma_prefetch_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_MMA_BULK) return &pgemv_mma_bulk_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_MMA_QUEUE) return &pgemv_mma_queue_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_MMA_SPLIT) return &pgemv_mma_kernel<MB, kPaired, V>;
  else if constexpr (V == plan::PGEMV_VARIANT_DEEP) return &pgemv_deep_kernel<MB, kPaired>;
  else if constexpr (V == plan::PGEMV_VARIANT_STAGED) return &pgemv_staged_kernel<MB, kPaired>;
  else return &pgemv_kernel<MB, kPaired>;
}

// Resolves DEFAULT to STD; false for a variant that is not plan::PGEMV_VARIANT_*.
bool resolve_pgemv_variant(int* variant) {
  if (*variant == plan::PGEMV_VARIANT_DEFAULT) *variant = plan::PGEMV_VARIANT_STD;
  return *variant == plan::PGEMV_VARIANT_STD || *variant == plan::PGEMV_VARIANT_DEEP ||
         *variant == plan::PGEMV_VARIANT_STAGED ||
         (plan::pgemv_is_mma(*variant) && *variant != plan::PGEMV_VARIANT_MMA_QUEUE);  // (palette_gemv_queue)
}

// The current device is an sm_90 or later one (cp.async.bulk, programmatic dependent launch);
// asked once per device, since a forward launches this per layer.
bool device_sm90() {
  constexpr int kDevices = 64;
  static signed char known[kDevices] = {};  // 0 unknown, 1 yes, -1 no
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < kDevices && known[dev] != 0) return known[dev] > 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  if (dev >= 0 && dev < kDevices) known[dev] = ok ? 1 : -1;
  return ok;
}

const char* check_pgemv(int M, int64_t N, int64_t K, int64_t ldx, int64_t ldy, const Palette& pal, int64_t nv,
                        int parts, const void* x, const void* sm, const void* idx, const void* vexp, int variant,
                        int tiled) {
  if (plan::pgemv_is_mma(variant)) {
    if (M < 1 || M > plan::PGEMV_MMA_MAX_M) return "the tensor-core palette_gemv supports 1 <= M <= 32";
  } else if (M < 1 || M > plan::PGEMV_MAX_M) {
    return "palette_gemv supports 1 <= M <= 4";
  }
  if (N <= 0 || K <= 0) return "matrix dimensions must be positive";
  if (K % plan::PMMA_TILE_K != 0) return "palette_gemv needs K % 64 == 0 (decode + matmul instead)";
  if (const char* e = check_pal_product(N, K, ldx, ldy, pal.size, nv, tiled)) return e;
  if (plan::pgemv_any_parts(variant)) {
    if (parts < 1 || parts > plan::PGEMV_MAX_PARTS) return "palette_gemv: parts must be 1 .. 8";
  } else if (!plan::pgemv_parts_pow2(parts)) {
    return "palette_gemv: parts must be 1, 2, 4 or 8 for this variant";
  }
  if (!grid_ok(plan::pgemv_variant_grid(N, parts, variant))) return "matrix too large for one launch";
  if (!aligned(x, 16) || !aligned(sm, 16) || !aligned(idx, 16) || (nv > 0 && !aligned(vexp, 16)))
    return "palette_gemv needs x, sm, idx and vexp 16-byte aligned";
  if (variant == plan::PGEMV_VARIANT_MMA_BULK && !tiled)
    return "the bulk-copy tensor-core palette_gemv needs tile-major planes";
  return nullptr;
}

// Runs f(MB, paired, variant) with all three as compile-time constants (variant resolved; MB
// 1, 2 or 4 for the CUDA-core variants, 8, 16 or 32 for the tensor-core one).
template <class F>
void with_variant(int M, bool paired, int variant, F&& f) {
  using plan::PGEMV_VARIANT_DEEP, plan::PGEMV_VARIANT_STAGED, plan::PGEMV_VARIANT_STD, plan::PGEMV_VARIANT_MMA,
      plan::PGEMV_VARIANT_MMA_STAGED, plan::PGEMV_VARIANT_MMA_PREFETCH, plan::PGEMV_VARIANT_MMA_BULK,
      plan::PGEMV_VARIANT_MMA_QUEUE, plan::PGEMV_VARIANT_MMA_SPLIT;
  auto go = [&](auto mb, auto v) {
    if constexpr (decltype(v)::value == PGEMV_VARIANT_MMA_SPLIT)
      f(mb, std::true_type{}, v);  // (its decode is always the paired lookup)
    else if (paired)
      f(mb, std::true_type{}, v);
    else
      f(mb, std::false_type{}, v);
  };
  auto go_m = [&](auto v) {
    if (M == 1) go(std::integral_constant<int, 1>{}, v);
    else if (M == 2) go(std::integral_constant<int, 2>{}, v);
    else go(std::integral_constant<int, 4>{}, v);
  };
  auto go_mma = [&](auto v) {
    if (M <= 8) go(std::integral_constant<int, 8>{}, v);
    else if (M <= 16) go(std::integral_constant<int, 16>{}, v);
    else go(std::integral_constant<int, 32>{}, v);
  };
  if (variant == PGEMV_VARIANT_MMA) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA>{});
  } else if (variant == PGEMV_VARIANT_MMA_STAGED) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA_STAGED>{});
  } else if (variant == PGEMV_VARIANT_MMA_PREFETCH) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA_PREFETCH>{});
  } else if (variant == PGEMV_VARIANT_MMA_BULK) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA_BULK>{});
  } else if (variant == PGEMV_VARIANT_MMA_QUEUE) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA_QUEUE>{});
  } else if (variant == PGEMV_VARIANT_MMA_SPLIT) {
    go_mma(std::integral_constant<int, PGEMV_VARIANT_MMA_SPLIT>{});
  } else if (variant == PGEMV_VARIANT_DEEP) {
    go_m(std::integral_constant<int, PGEMV_VARIANT_DEEP>{});
  } else if (variant == PGEMV_VARIANT_STAGED) {
    go_m(std::integral_constant<int, PGEMV_VARIANT_STAGED>{});
  } else {
    go_m(std::integral_constant<int, PGEMV_VARIANT_STD>{});
  }
}

PgemvArgs make_args(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                    int64_t K, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                    const uint32_t* vrow, int parts, uint16_t* y,
                    int64_t ldy, int tiled) {
  PgemvArgs a{};
  a.x = x; a.ldx = ldx; a.M = M;
  a.sm = sm; a.idx = idx; a.N = N; a.K = K;
  a.set_order(tiled != 0);
  a.vpos = vpos; a.nv = nv; a.vexp = vexp; a.vrow = vrow;
  a.parts = parts;
  a.lparts = plan::pgemv_log2_parts(plan::pgemv_parts_pow2(parts) ? parts : plan::PGEMV_WARPS);
  a.part_steps = plan::pgemv_mma_part_steps(K, parts);
  a.cta_warps = plan::pgemv_mma_cta_warps(parts);
  a.y = y; a.ldy = ldy;
  a.x_prefetch = gemv_x_prefetch() ? 1 : 0;
  return a;
}

// Threads of a GEMV CTA: PGEMV_THREADS, or one tile's `parts` warps (plan::pgemv_mma_cta_warps)
// when its parts count is no power of two.
int cta_threads(const PgemvArgs& a) { return a.cta_warps * plan::WARP; }

// A GEMV's palette tables: the split layout's for PGEMV_VARIANT_MMA_SPLIT (which must have them),
// else the stored layout's, paired unless it cannot be or force_general.
const char* gemv_tables(const Palette& pal, int variant, bool force_general, PgemvArgs* a, bool* paired) {
  if (variant == plan::PGEMV_VARIANT_MMA_SPLIT) {
    *paired = true;
    return pal_split_tables(pal, a->pt) ? nullptr
                                        : "the split palette layout needs at most 8 exponent halves (e >> 1)";
  }
  *paired = pal_tables(pal, a->pt) && !force_general;
  return nullptr;
}

// Checks a queued GEMV and fills its arguments; nullptr or the error.
const char* queue_plan(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                       int64_t K, const Palette& pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                       const uint32_t* vrow, int units,
                       int64_t ctas, float* ws, int32_t* queue, uint16_t* y, int64_t ldy, int tiled, PgemvArgs* a) {
  constexpr int V = plan::PGEMV_VARIANT_MMA_QUEUE;
  if (const char* e = check_pgemv(M, N, K, ldx, ldy, pal, nv, 1, x, sm, idx, vexp, V, tiled)) return e;
  const int64_t steps = plan::cdiv(K, plan::PGEMV_MMA_COLS), tiles = plan::cdiv(N, plan::PGEMV_MMA_ROWS);
  if (units < 1 || units > steps) return "palette_gemv_queue: units per tile must be 1 .. the tile's steps";
  if (ctas < 1 || !grid_ok(ctas)) return "palette_gemv_queue: bad grid";
  // (the kernel counts units, rows and its queue's answers in 32 bits)
  if (N > 0x7FFFFFFFll - plan::PGEMV_MMA_ROWS || tiles * units + 2 * ctas * plan::PGEMV_WARPS > 0x7FFFFFFFll)
    return "palette_gemv_queue: more units than a 32-bit queue counts";
  // (and a lane's two rows of a tile, at most 16 rows apart, a 32-bit distance in the planes)
  if (K >= (int64_t{1} << 27)) return "palette_gemv_queue: K past 2^27 columns";
  if (queue == nullptr || (units > 1 && ws == nullptr)) return "palette_gemv_queue: null workspace or counters";
  // Units past the tile's steps would be empty (cdiv(steps, units) each): the kernel takes the
  // count that leaves none, which sums the same parts (an empty part adds +0 to a sum that
  // starts at +0, so the bits do not change).
  units = static_cast<int>(plan::cdiv(steps, plan::cdiv(steps, units)));
  *a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, units, y, ldy, tiled);
  a->lparts = 0;
  a->cta_warps = plan::PGEMV_WARPS;
  a->units = tiles * units;
  a->ws = ws;
  a->queue = queue;
  return nullptr;
}

}  // namespace

template <int MB, bool kPaired, int kVariant>
void launch_pgemv(const PgemvArgs& a, int64_t ctas, cudaStream_t s) {
  const auto grid = static_cast<unsigned>(ctas);
  constexpr int smem = PgemvVariant<kVariant>::kSmem;
  constexpr auto kernel = pgemv_kernel_of<MB, kPaired, kVariant>();
  opt_in_smem<kernel>(smem);  // (nothing to do at 48 KiB or less)
  // The tensor-core kernels wait for the launch ahead of them only before they touch x, y and
  // the scratch (pgemv_mma_body, pgemv_mma_queue_body), so with programmatic launch on they may
  // start streaming their planes while it ends.  The CUDA-core ones do not wait: never.
  const bool pdl = PgemvVariant<kVariant>::kMma && programmatic_launch() && device_sm90();
  launch_maybe_pdl(kernel, dim3(grid), dim3(static_cast<unsigned>(cta_threads(a))), smem, s, pdl, a);
}

namespace {

template <bool kPaired>
__global__ void __launch_bounds__(plan::PGEMV_THREADS, plan::PGEMV_MMA_CTAS_PER_SM)
    pgemv_slots_kernel(PgemvSlotArgs a) {
  emu::DeviceCtx c;
  pgemv_slots_body<kPaired>(c, a);
}

// Checks a slots GEMV and fills its arguments (paired: the palette's decode); nullptr or the error.
const char* slots_gemv_plan(const uint16_t* x, int64_t ldx, const int64_t* ids, int64_t slots, int64_t E,
                            const uint8_t* sm, const uint8_t* idx, int64_t N, int64_t K, const Palette& pal,
                            const uint32_t* vpos, int64_t V, const uint8_t* vexp,
                            const uint32_t* vrow, int parts, uint16_t* y,
                            int64_t ldy, int32_t* err, PgemvSlotArgs* a, bool* paired) {
  if (slots < 0 || slots > 65535) return "palette_gemv_slots: 0..65535 slots";
  if (E < 1) return "palette_gemv_slots: the stack holds no matrix";
  if (V < 0 || V > N * plan::blocks_per_row(K)) return "palette_gemv_slots: bad verbatim list length";
  if (slots > 0 && (ids == nullptr || err == nullptr)) return "palette_gemv_slots: null ids or error counter";
  if (const char* e = check_pgemv(1, N, K, ldx, ldy, pal, V, parts, x, sm, idx, vexp, plan::PGEMV_VARIANT_MMA, 0))
    return e;
  a->base = make_args(x, ldx, 1, sm, idx, N, K, vpos, V, vexp, vrow, parts, y, ldy, 0);
  *paired = pal_tables(pal, a->base.pt);
  a->ids = ids;
  a->E = E;
  a->sm_stride = N * K;
  a->idx_stride = N * (K / 2);
  a->V = V;
  a->err = err;
  return nullptr;
}

// Runs f(probe) with a known probe as a compile-time constant; false for an unknown one.
template <class F>
bool with_probe(int probe, F&& f) {
  if (probe == plan::PGEMV_PROBE_NO_DECODE) f(std::integral_constant<int, plan::PGEMV_PROBE_NO_DECODE>{});
  else if (probe == plan::PGEMV_PROBE_NO_MMA) f(std::integral_constant<int, plan::PGEMV_PROBE_NO_MMA>{});
  else if (probe == plan::PGEMV_PROBE_STREAM) f(std::integral_constant<int, plan::PGEMV_PROBE_STREAM>{});
  else return false;
  return true;
}

// Checks a GEMV probe and fills its arguments; nullptr or the error.
const char* probe_plan(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                       int64_t K, const Palette& pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                       const uint32_t* vrow, int parts,
                       uint16_t* y, int64_t ldy, int probe, int tiled, PgemvArgs* a) {
  if (!with_probe(probe, [](auto) {})) return "unknown GEMV probe";
  if (M > 8) return "the GEMV probes run batches of 1..8 rows";
  if (const char* e = check_pgemv(M, N, K, ldx, ldy, pal, nv, parts, x, sm, idx, vexp, plan::PGEMV_VARIANT_MMA, tiled))
    return e;
  *a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, parts, y, ldy, tiled);
  if (!pal_tables(pal, a->pt)) return "the GEMV probes need a paired palette (ops.paired_palette)";
  return nullptr;
}

}  // namespace
}  // namespace detail

using namespace detail;

const char* palette_gemv_probe(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow,
                               int parts, uint16_t* y, int64_t ldy, int probe, int tiled, void* stream) {
  PgemvArgs a{};
  if (const char* e = probe_plan(x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, vrow, parts, y, ldy, probe, tiled, &a))
    return e;
  const auto grid = static_cast<unsigned>(plan::pgemv_variant_grid(N, parts, plan::PGEMV_VARIANT_MMA));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The stream probe needs fewer registers than the full kernel, so more of its CTAs would fit
  // an SM where the grid has more than one wave of them; shared memory that leaves room for
  // only the full kernel's CTAs per SM (PGEMV_MMA_CTAS_PER_SM, or more of one tile's parts:
  // plan::pgemv_mma_sm_warps; 228 KiB per SM on sm_90, 1 KiB reserved per CTA) keeps it at
  // the full kernel's occupancy (on sm_80's 164 KiB, at power-of-two parts).
  constexpr int kMaxSmem = 228 * 1024 / (plan::PGEMV_MMA_CTAS_PER_SM + 1) + 1024;
  static_assert(kMaxSmem >= plan::PGEMV_MMA_SMEM_BYTES &&
                    plan::PGEMV_MMA_CTAS_PER_SM * (kMaxSmem + 1024) <= 164 * 1024,
                "the probes' shared memory holds the parts' sums and fits the full kernel's CTAs per SM");
  static_assert(228 * 1024 / (plan::PGEMV_MMA_WARPS_PER_SM / 3 + 1) + 1024 >= plan::PGEMV_MMA_SMEM_BYTES,
                "the probes' shared memory holds the parts' sums at every parts count (CTAs of >= 3 warps)");
  const int sm_ctas = plan::pgemv_mma_sm_warps(parts) / plan::pgemv_mma_cta_warps(parts);
  const int smem = 228 * 1024 / (sm_ctas + 1) + 1024;
  with_probe(probe, [&](auto p) {
    constexpr auto kernel = &pgemv_mma_probe_kernel<decltype(p)::value>;
    opt_in_smem<kernel>(kMaxSmem);
    kernel<<<grid, cta_threads(a), smem, s>>>(a);
  });
  return launch_status();
}

const char* palette_gemv_slots(const uint16_t* x, int64_t ldx, const int64_t* ids, int64_t slots, int64_t E,
                               const uint8_t* sm, const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                               const uint32_t* vpos, int64_t V, const uint8_t* vexp,
                               const uint32_t* vrow, int parts, uint16_t* y,
                               int64_t ldy, int32_t* err, void* stream) {
  PgemvSlotArgs a{};
  bool paired = false;
  if (const char* e = slots_gemv_plan(x, ldx, ids, slots, E, sm, idx, N, K, pal, vpos, V, vexp, vrow, parts, y,
                                      ldy, err, &a, &paired))
    return e;
  if (slots == 0) return nullptr;
  const dim3 grid(static_cast<unsigned>(plan::pgemv_mma_grid(N, parts)), static_cast<unsigned>(slots));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = cta_threads(a.base);
  if (paired)
    pgemv_slots_kernel<true><<<grid, threads, plan::PGEMV_MMA_SMEM_BYTES, s>>>(a);
  else
    pgemv_slots_kernel<false><<<grid, threads, plan::PGEMV_MMA_SMEM_BYTES, s>>>(a);
  return launch_status();
}

const char* palette_gemv(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int parts,
                         uint16_t* y, int64_t ldy, int variant, int tiled, void* stream) {
  if (!resolve_pgemv_variant(&variant)) return "unknown palette GEMV variant";
  if (const char* e = check_pgemv(M, N, K, ldx, ldy, pal, nv, parts, x, sm, idx, vexp, variant, tiled)) return e;
  if (variant == plan::PGEMV_VARIANT_MMA_BULK && !device_sm90())
    return "the bulk-copy tensor-core palette_gemv needs an sm_90 GPU (cp.async.bulk)";
  PgemvArgs a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, parts, y, ldy, tiled);
  bool paired = false;
  if (const char* e = gemv_tables(pal, variant, false, &a, &paired)) return e;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  with_variant(M, paired, variant, [&](auto mb, auto p, auto v) {
    launch_pgemv<decltype(mb)::value, decltype(p)::value, decltype(v)::value>(
        a, plan::pgemv_variant_grid(N, parts, decltype(v)::value), s);
  });
  return launch_status();
}

const char* palette_gemv_queue(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow, int units,
                               int64_t ctas, float* ws, int32_t* queue, uint16_t* y, int64_t ldy, int tiled,
                               void* stream) {
  PgemvArgs a{};
  if (const char* e = queue_plan(x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, vrow, units, ctas, ws, queue, y,
                                 ldy, tiled, &a))
    return e;
  const bool paired = pal_tables(pal, a.pt);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  with_variant(M, paired, plan::PGEMV_VARIANT_MMA_QUEUE, [&](auto mb, auto p, auto v) {
    launch_pgemv<decltype(mb)::value, decltype(p)::value, decltype(v)::value>(a, ctas, s);
  });
  return launch_status();
}

namespace emulate {

const char* palette_gemv_probe(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow,
                               int parts, uint16_t* y, int64_t ldy, int probe, int tiled) {
  PgemvArgs a{};
  if (const char* e = probe_plan(x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, vrow, parts, y, ldy, probe, tiled, &a))
    return e;
  const int64_t grid = plan::pgemv_variant_grid(N, parts, plan::PGEMV_VARIANT_MMA);
  const char* err = nullptr;
  with_probe(probe, [&](auto p) {
    err = emu::launch(grid, 1, cta_threads(a), plan::PGEMV_MMA_SMEM_BYTES, [&](emu::ThreadCtx& c) {
      pgemv_mma_body<1, true, false, false, false, decltype(p)::value>(c, a);
    });
  });
  return err;
}

const char* palette_gemv(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int parts,
                         uint16_t* y, int64_t ldy, int force_general, int variant, int tiled) {
  if (!resolve_pgemv_variant(&variant)) return "unknown palette GEMV variant";
  if (const char* e = check_pgemv(M, N, K, ldx, ldy, pal, nv, parts, x, sm, idx, vexp, variant, tiled)) return e;
  PgemvArgs a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, parts, y, ldy, tiled);
  bool paired = false;
  if (const char* e = gemv_tables(pal, variant, force_general != 0, &a, &paired)) return e;
  const char* err = nullptr;
  with_variant(M, paired, variant, [&](auto mb, auto p, auto v) {
    constexpr int V = decltype(v)::value;
    err = emu::launch(plan::pgemv_variant_grid(N, parts, V), 1, cta_threads(a), PgemvVariant<V>::kSmem,
                      [&](emu::ThreadCtx& c) { pgemv_variant_body<decltype(mb)::value, decltype(p)::value, V>(c, a); });
  });
  return err;
}

const char* palette_gemv_queue(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow, int units,
                               int64_t ctas, float* ws, int32_t* queue, uint16_t* y, int64_t ldy, int force_general,
                               int tiled) {
  PgemvArgs a{};
  if (const char* e = queue_plan(x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, vrow, units, ctas, ws, queue, y,
                                 ldy, tiled, &a))
    return e;
  const bool paired = pal_tables(pal, a.pt) && !force_general;
  const char* err = nullptr;
  with_variant(M, paired, plan::PGEMV_VARIANT_MMA_QUEUE, [&](auto mb, auto p, auto v) {
    constexpr int V = decltype(v)::value;
    err = emu::launch(ctas, 1, plan::PGEMV_THREADS, PgemvVariant<V>::kSmem,
                      [&](emu::ThreadCtx& c) { pgemv_variant_body<decltype(mb)::value, decltype(p)::value, V>(c, a); });
  });
  return err;
}

const char* palette_gemv_slots(const uint16_t* x, int64_t ldx, const int64_t* ids, int64_t slots, int64_t E,
                               const uint8_t* sm, const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                               const uint32_t* vpos, int64_t V, const uint8_t* vexp,
                               const uint32_t* vrow, int parts, uint16_t* y,
                               int64_t ldy, int32_t* err, int force_general) {
  PgemvSlotArgs a{};
  bool paired = false;
  if (const char* e = slots_gemv_plan(x, ldx, ids, slots, E, sm, idx, N, K, pal, vpos, V, vexp, vrow, parts, y,
                                      ldy, err, &a, &paired))
    return e;
  if (slots == 0) return nullptr;
  const int64_t gx = plan::pgemv_mma_grid(N, parts);
  if (paired && !force_general)
    return emu::launch(gx, slots, cta_threads(a.base), plan::PGEMV_MMA_SMEM_BYTES,
                       [&](emu::ThreadCtx& c) { pgemv_slots_body<true>(c, a); });
  return emu::launch(gx, slots, cta_threads(a.base), plan::PGEMV_MMA_SMEM_BYTES,
                     [&](emu::ThreadCtx& c) { pgemv_slots_body<false>(c, a); });
}

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
