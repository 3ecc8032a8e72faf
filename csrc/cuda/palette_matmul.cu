// Fused palette GEMM on tensor cores: the kernel instantiations, the host API
// (palette_gemm: argument checks, palette tables, grid) and its host emulation through the
// warp emulator.  The body is pmma_body in palette_matmul.cuh; the design and its arithmetic
// are in docs/design/gpu-kernels.md.
//
// Instantiations: NT (n-tiles of 8 batch rows) in {1, 2, 4, 8} times the paired / general
// palette decode times the copy layout: one-tile stages, two-tile stages (stage_tiles = 2) or
// one-tile stages with x shared in shared memory (x_shared); all three give the same bits.
// And the wgmma variant (x_shared = PMMA_XS_WGMMA, sm_90a only: elsewhere its body traps and
// the launcher refuses it), NT in {1, 2, 4, 8, 16}, behind a small launch that writes x as its
// stage images into the workspace (pmma_wg_x_kernel).  __launch_bounds__(128, 4): four CTAs (16
// warps) per SM is what the split heuristic plans for, and it caps registers at 128 per thread.
// NT = 8 holds 32 fp32 accumulators more and spills under that cap, so it runs three CTAs per
// SM (168 registers): from batch 33 on the kernel is no longer bound by the weight stream
// alone; NT = 16 (wgmma, 64 accumulators) has the same cap, which its three-stage ring
// (plan::pmma_stages) lets three CTAs share an SM at.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "emu/warp_emu.h"
#include "launch_util.h"
#include "palette_matmul.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

template <int NT, bool kPaired, int kSub, int kXs>
__global__ void __launch_bounds__(plan::PMMA_THREADS, NT >= 8 ? 3 : plan::PMMA_CTAS_PER_SM) pmma_kernel(PmmaArgs a) {
  emu::DeviceCtx c;
  pmma_body<NT, kPaired, kSub, kXs>(c, a);
}

template <int NT>
__global__ void __launch_bounds__(plan::PMMA_WG_X_THREADS) pmma_wg_x_kernel(const uint16_t* x, int64_t ldx, int M,
                                                                             int64_t K, uint16_t* xw) {
  emu::DeviceCtx c;
  pmma_wg_x_body<NT>(c, x, ldx, M, K, xw);
}

const char* check_pmma(int M, int64_t N, int64_t K, int64_t ldx, int64_t ldy, const Palette& pal, int64_t nv,
                       int splits, const void* x, const void* sm, const void* idx, const void* vexp,
                       const float* ws, const int32_t* counters, int stage_tiles, int x_shared, int tiled) {
  const bool wg = x_shared == plan::PMMA_XS_WGMMA;
  if (plan::pmma_ntiles(M, wg) == 0) return "palette_gemm supports 1 <= M <= 256";
  if (stage_tiles != 1 && stage_tiles != plan::PMMA_SUB_WIDE) return "palette_gemm: stage_tiles must be 1 or 2";
  if (x_shared < 0 || x_shared > plan::PMMA_XS_WGMMA) return "palette_gemm: x_shared must be 0, 1 or 2 (wgmma)";
  if (x_shared && stage_tiles != 1) return "palette_gemm: shared x goes with stage_tiles = 1";
  if (N <= 0 || K <= 0) return "matrix dimensions must be positive";
  if (K % plan::PMMA_TILE_K != 0) return "palette_gemm needs K % 64 == 0 (decode + matmul instead)";
  if (const char* e = check_pal_product(N, K, ldx, ldy, pal.size, nv, tiled)) return e;
  if (ldx > INT32_MAX / plan::pmma_chunk_m(wg)) return "palette_gemm: x row stride too large";
  if (splits < 1 || splits > plan::PMMA_MAX_SPLITS || splits > K / plan::PMMA_TILE_K)
    return "palette_gemm: splits must be in 1 .. K / 64";
  if (!grid_ok(plan::pmma_grid_x(N, M, wg))) return "matrix too large for one launch";
  if (!aligned(x, 16) || !aligned(sm, 16) || !aligned(idx, 16) || (nv > 0 && !aligned(vexp, 16)))
    return "palette_gemm needs x, sm, idx and vexp 16-byte aligned";
  if (splits > 1 && (ws == nullptr || counters == nullptr))
    return "palette_gemm: a split launch needs the fp32 workspace [splits, M, N] and the zeroed counters";
  if (wg && (ws == nullptr || !aligned(ws, 16)))
    return "palette_gemm: the wgmma variant needs the 16-byte aligned fp32 workspace (plan_pmma_workspace_need)";
  return nullptr;
}

// Runs f(NT, paired, kSub, kXs) with all four as compile-time constants (the four copy
// layouts: one-tile, wide, one-tile with shared x, wgmma).
template <class F>
void with_variant(int M, bool paired, int stage_tiles, int x_shared, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Wide = std::integral_constant<int, plan::PMMA_SUB_WIDE>;
  using Xs0 = std::integral_constant<int, 0>;
  using Xs1 = std::integral_constant<int, 1>;
  using XsWg = std::integral_constant<int, plan::PMMA_XS_WGMMA>;
  auto layout = [&](auto nt, auto p) {
    if (x_shared == plan::PMMA_XS_WGMMA) f(nt, p, One{}, XsWg{});
    else if constexpr (decltype(nt)::value <= 8) {
      if (stage_tiles != 1) f(nt, p, Wide{}, Xs0{});
      else if (x_shared) f(nt, p, One{}, Xs1{});
      else f(nt, p, One{}, Xs0{});
    }
  };
  auto go = [&](auto nt) {
    if (paired) layout(nt, std::true_type{}); else layout(nt, std::false_type{});
  };
  switch (plan::pmma_ntiles(M, x_shared == plan::PMMA_XS_WGMMA)) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    case 8: go(std::integral_constant<int, 8>{}); break;
    default: go(std::integral_constant<int, 16>{}); break;
  }
}

// Whether the current device runs the wgmma variant: an sm_90 GPU and a build whose code for it
// is the sm_90a one.  A build without that target runs on sm_90 only by JIT-compiling its
// older PTX (the function's PTX version below 90), whose body traps; a version of 0 (none
// recorded) is taken as the sm_90a code.  Attribute queries only (no launch, no sync: a CUDA
// graph capture may be under way).  Asked once per device.
bool device_wgmma() {
  constexpr int kDevices = 64;
  static signed char known[kDevices] = {};  // 0 unknown, 1 yes, -1 no
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < kDevices && known[dev] != 0) return known[dev] > 0;
  cudaFuncAttributes attr{};
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                  major == 9 && minor == 0 &&
                  cudaFuncGetAttributes(&attr, pmma_kernel<1, true, 1, plan::PMMA_XS_WGMMA>) == cudaSuccess &&
                  !(attr.ptxVersion > 0 && attr.ptxVersion < 90);
  if (dev >= 0 && dev < kDevices) known[dev] = ok ? 1 : -1;
  return ok;
}

PmmaArgs make_args(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                   int64_t K, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                   const uint32_t* vrow, int splits, float* ws,
                   int32_t* counters, uint16_t* y, int64_t ldy, int tiled, int x_shared) {
  PmmaArgs a{};
  a.x = x; a.ldx = ldx; a.M = M;
  a.sm = sm; a.idx = idx; a.N = N; a.K = K;
  a.set_order(tiled != 0);
  a.vpos = vpos; a.nv = nv; a.vexp = vexp; a.vrow = vrow;
  a.split_tiles = plan::pmma_split_tiles(K, splits);
  a.chunks = plan::pmma_chunks(M, x_shared == plan::PMMA_XS_WGMMA);
  a.wg_tile_wait = x_shared == plan::PMMA_XS_WGMMA && wgmma_tile_wait() ? 1 : 0;
  a.ws = ws; a.counters = counters;
  a.y = y; a.ldy = ldy;
  return a;
}

// The wgmma variant reads x as stage images from the workspace (pmma_wg_x_body): where they go,
// and the reorder's grid (a thread per row of a tile).  a.x / a.ldx then name them.
uint16_t* wg_x(float* ws, int M, int64_t N, int splits) {
  return reinterpret_cast<uint16_t*>(ws + plan::pmma_wg_x_at(M, N, splits));
}
int64_t wg_x_grid(int M, int64_t K) {
  return cdiv(plan::pmma_wg_x_rows(M) * (K / plan::PMMA_TILE_K), plan::PMMA_WG_X_THREADS);
}

}  // namespace

template <int NT, bool kPaired, int kSub, int kXs>
void launch_pmma(const PmmaArgs& a, int64_t splits, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(plan::pmma_grid_x(a.N, a.M, kXs == plan::PMMA_XS_WGMMA)),
                  static_cast<unsigned>(splits));
  const int smem = plan::pmma_smem_bytes(kSub, NT, kXs);
  opt_in_smem<pmma_kernel<NT, kPaired, kSub, kXs>>(smem);
  // The wgmma variant waits for the launches ahead (its x reorder) only before it copies x or
  // touches the workspace, counters and y (pmma_body), so with programmatic launch on it may set
  // up its weight pipeline and verbatim cursors while the reorder runs.
  const bool pdl = kXs == plan::PMMA_XS_WGMMA && programmatic_launch();
  launch_maybe_pdl(pmma_kernel<NT, kPaired, kSub, kXs>, grid, dim3(plan::PMMA_THREADS), smem, s, pdl, a);
}

}  // namespace detail

using namespace detail;

const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int splits,
                         float* ws, int32_t* counters, uint16_t* y, int64_t ldy, int stage_tiles, int x_shared,
                         int tiled, void* stream) {
  if (const char* e = check_pmma(M, N, K, ldx, ldy, pal, nv, splits, x, sm, idx, vexp, ws, counters, stage_tiles,
                                 x_shared, tiled))
    return e;
  if (x_shared == plan::PMMA_XS_WGMMA && !device_wgmma())
    return "the wgmma palette_gemm needs an sm_90 GPU and a build for sm_90a";
  PmmaArgs a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, splits, ws, counters, y, ldy, tiled, x_shared);
  const bool paired = pal_tables(pal, a.pt);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (x_shared == plan::PMMA_XS_WGMMA) {
    uint16_t* xw = wg_x(ws, M, N, splits);
    if (!grid_ok(wg_x_grid(M, K))) return "matrix too large for one launch";
    with_variant(M, paired, stage_tiles, x_shared, [&](auto nt, auto, auto, auto) {
      launch_maybe_pdl(pmma_wg_x_kernel<decltype(nt)::value>, dim3(static_cast<unsigned>(wg_x_grid(M, K))),
                       dim3(plan::PMMA_WG_X_THREADS), 0, s, programmatic_launch(), x, ldx, M, K, xw);
    });
    a.x = xw;
    a.ldx = K;
  }
  with_variant(M, paired, stage_tiles, x_shared, [&](auto nt, auto p, auto sub, auto xs) {
    launch_pmma<decltype(nt)::value, decltype(p)::value, decltype(sub)::value, decltype(xs)::value>(a, splits, s);
  });
  return launch_status();
}

namespace emulate {

const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int splits,
                         float* ws, int32_t* counters, uint16_t* y, int64_t ldy, int force_general,
                         int stage_tiles, int x_shared, int tiled) {
  if (const char* e = check_pmma(M, N, K, ldx, ldy, pal, nv, splits, x, sm, idx, vexp, ws, counters, stage_tiles,
                                 x_shared, tiled))
    return e;
  PmmaArgs a = make_args(x, ldx, M, sm, idx, N, K, vpos, nv, vexp, vrow, splits, ws, counters, y, ldy, tiled, x_shared);
  const bool paired = pal_tables(pal, a.pt) && !force_general;
  const char* err = nullptr;
  if (x_shared == plan::PMMA_XS_WGMMA) {
    uint16_t* xw = wg_x(ws, M, N, splits);
    with_variant(M, paired, stage_tiles, x_shared, [&](auto nt, auto, auto, auto) {
      err = emu::launch(wg_x_grid(M, K), 1, plan::PMMA_WG_X_THREADS, 0,
                        [&](emu::ThreadCtx& c) { pmma_wg_x_body<decltype(nt)::value>(c, x, ldx, M, K, xw); });
    });
    if (err) return err;
    a.x = xw;
    a.ldx = K;
  }
  with_variant(M, paired, stage_tiles, x_shared, [&](auto nt, auto p, auto sub, auto xs) {
    err = emu::launch(plan::pmma_grid_x(N, M, x_shared == plan::PMMA_XS_WGMMA), splits, plan::PMMA_THREADS,
                      plan::pmma_smem_bytes(sub, decltype(nt)::value, decltype(xs)::value), [&](emu::ThreadCtx& c) {
                        pmma_body<decltype(nt)::value, decltype(p)::value, decltype(sub)::value,
                                  decltype(xs)::value>(c, a);
                      });
  });
  return err;
}

const char* warp_lower_bounds(const uint32_t* v, int64_t n, const uint64_t* ka, const uint64_t* kb, int64_t count,
                              int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const char* e = emu::launch(1, 1, emu::kWarpSize, 0, [&](emu::ThreadCtx& c) {
      int64_t ra = 0, rb = 0;
      warp_lower_bound2(c, v, n, ka[i], kb[i], &ra, &rb);
      const int64_t one = warp_lower_bound(c, v, n, ka[i]);
      if (c.lane() == 0) {
        out[4 * i] = ra;
        out[4 * i + 1] = rb;
        out[4 * i + 2] = one;
      }
      if (c.lane() == 31) out[4 * i + 3] = ra;  // every lane holds the result
    });
    if (e) return e;
  }
  return nullptr;
}

}  // namespace emulate
}  // namespace cuda
}  // namespace unweight
