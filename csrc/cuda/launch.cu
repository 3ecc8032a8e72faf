// Host API of the CUDA kernels (kernels.cuh): argument checks, grid sizing and the batch-size
// tables, then the launch through each family's launcher (huffman_decode.cu, palette_decode.cu,
// transcode.cu, palette_matmul.cu, huffman_matmul.cu).  Also the launch helpers and argument
// checks that the host emulation (emulate.cu) shares (launch_util.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>

#include "huffman_decode.cuh"
#include "huffman_matmul.cuh"
#include "launch_util.h"
#include "palette_decode.cuh"
#include "palette_matmul.cuh"
#include "transcode.cuh"

namespace unweight {
namespace cuda {
namespace detail {

const char* launch_status() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

bool grid_ok(int64_t g) { return g >= 1 && g <= 0x7FFFFFFF; }

bool aligned(const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

const char* check_huff(int64_t stream_bytes, int64_t rows, int64_t cols, int64_t R, int64_t C,
                       int64_t g0, int64_t g1, int64_t c0, int64_t c1, int64_t sm_stride,
                       const uint16_t* out16, const uint8_t* out8, int64_t out_stride) {
  if (rows <= 0 || cols <= 0 || R <= 0 || C <= 0) return "grid dimensions must be positive";
  if (!(0 <= g0 && g0 < g1 && g1 <= cdiv(rows, R) && 0 <= c0 && c0 < c1 && c1 <= cdiv(cols, C)))
    return "segment range out of bounds";
  if (R > (1 << 30) || C > (1 << 30)) return "segment too large";
  const int64_t w = std::min(cols, c1 * C) - c0 * C;
  if (sm_stride < w || out_stride < w) return "row stride smaller than the decoded width";
  if ((out16 == nullptr) == (out8 == nullptr)) return "exactly one of out16/out8 must be given";
  if (stream_bytes < STREAM_SLACK_BYTES) return "exponent stream shorter than its slack";
  return nullptr;
}

const char* check_pal(int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                      const Palette& pal, int64_t nv, int64_t out_stride) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  if (!(0 <= r0 && r0 < r1 && r1 <= rows && 0 <= k0 && k0 < k1 && k1 <= cols))
    return "decode rectangle out of bounds";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > rows * plan::blocks_per_row(cols)) return "bad verbatim block count";
  if (out_stride < k1 - k0) return "row stride smaller than the decoded width";
  if (rows * plan::blocks_per_row(cols) > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  return nullptr;
}

const char* check_gemm(int M, int64_t N, int64_t K, int64_t ldx, int64_t ldy, const Palette& pal,
                       int64_t nv, const float* corr) {
  if (M < 1 || M > plan::GEMM_MAX_M) return "palette_gemm supports 1 <= M <= 16";
  if (N <= 0 || K <= 0) return "matrix dimensions must be positive";
  if (K % 8 != 0) return "palette_gemm needs K % 8 == 0 (decode + matmul instead)";
  if (ldx < K || ldx % 8 != 0) return "x row stride must be >= K and a multiple of 8";
  if (ldy < N) return "y row stride must be >= N";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > N * plan::blocks_per_row(K)) return "bad verbatim block count";
  if (nv > 0 && corr == nullptr) return "corr scratch [nv, M] is required when nv > 0";
  return nullptr;
}

const char* check_hgemm(int M, int64_t N, int64_t K, int64_t R, int64_t C, int64_t ldx, int64_t ldy,
                        int64_t stream_bytes, const float* part) {
  if (M < 1 || M > plan::HGEMM_MAX_M) return "huffman_gemm supports 1 <= M <= 16";
  if (N <= 0 || K <= 0 || R <= 0 || C <= 0) return "matrix and grid dimensions must be positive";
  if (R > (1 << 30) || C > (1 << 30)) return "segment too large";
  if (cdiv(K, C) > plan::HGEMM_MAX_CHUNKS) return "huffman_gemm: too many column chunks for one launch";
  if (!grid_ok(plan::hgemm_grid_x(cdiv(N, R))) || !grid_ok(plan::hgemm_reduce_grid(M, N)))
    return "matrix too large for one launch";
  if (ldx < K) return "x row stride must be >= K";
  if (ldy < N) return "y row stride must be >= N";
  if (stream_bytes < STREAM_SLACK_BYTES) return "exponent stream shorter than its slack";
  if (part == nullptr) return "huffman_gemm needs the fp32 workspace [n_chunks, M, N]";
  return nullptr;
}

// The 16-byte sign+mantissa path needs every (row, chunk) start 16-byte aligned.
bool hgemm_vec(const uint8_t* sm, int64_t K, int64_t C) { return K % 16 == 0 && C % 16 == 0 && aligned(sm, 16); }

}  // namespace detail

using namespace detail;

namespace {

// Batch size M -> the palette_matmul.cu instantiation for it.
template <int... Ms>
struct GemmTable {
  static void launch(int M, const GemmArgs& a, cudaStream_t s) {
    (void)std::initializer_list<int>{(M == Ms ? (launch_palette_gemm<Ms>(a, s), 0) : 0)...};
  }
};

template <int MT>
const char* launch_hgemm_m(const HGemmArgs& a, bool vec, const uint16_t* lut, int32_t* err, cudaStream_t s) {
  return vec ? launch_huffman_gemm<MT, true>(a, lut, err, s) : launch_huffman_gemm<MT, false>(a, lut, err, s);
}

#define UW_STR2(...) #__VA_ARGS__
#define UW_STR(...) UW_STR2(__VA_ARGS__)

}  // namespace

// =======================================================================================
// Host API.
// =======================================================================================
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: report 0, leave no sticky error
    return 0;
  }
  return n;
}

const char* compiled_archs() {
#if defined(__CUDA_ARCH_LIST__)
  return UW_STR(__CUDA_ARCH_LIST__);
#else
  return "";
#endif
}

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, void* stream) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride)) return e;
  const int64_t grid = plan::pal_grid(r1 - r0, k1 - k0);
  if (!grid_ok(grid) || (nv > 0 && !grid_ok(plan::warp_grid(nv)))) return "matrix too large for one launch";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride};
  const int64_t total = (r1 - r0) * plan::pal_threads_per_row(k1 - k0);
  const bool vec = cols % 8 == 0 && k0 % 8 == 0 && out_stride % 8 == 0 && aligned(out, 16) &&
                   aligned(sm, 8) && aligned(idx, 4);
  launch_palette_decode(a, vec, grid, total, err, s);
  if (const char* e = launch_status()) return e;
  if (nv > 0) {
    const PatchArgs p{sm, rows, cols, r0, r1, k0, k1, vpos, nv, vexp, out, out_stride};
    launch_verbatim_patch(p, err, s);
  }
  return launch_status();
}

const char* exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, void* stream) {
  if (n <= 0) return nullptr;
  if (!aligned(exps, 16)) return "exponent plane must be 16-byte aligned";
  launch_exp_histogram(exps, n, hist, static_cast<cudaStream_t>(stream));
  return launch_status();
}

const char* palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                                 uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                                 uint32_t* row_offsets, void* stream) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  const int64_t bpr = plan::blocks_per_row(cols);
  if (rows * bpr > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  if (!grid_ok(plan::enc_grid(rows, cols)) || !grid_ok(plan::warp_grid(rows))) return "matrix too large";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  launch_palette_encode_pass1(EncArgs{exps, rows, cols, idx, flags}, pal, row_counts, row_offsets, s);
  return launch_status();
}

const char* palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols,
                                 const uint8_t* flags, const uint32_t* row_offsets, int64_t nv,
                                 uint32_t* vpos, uint8_t* vexp, void* stream) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  const int64_t bpr = plan::blocks_per_row(cols);
  if (nv < 0 || nv > rows * bpr) return "bad verbatim block count";
  if (nv == 0) return nullptr;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  launch_palette_encode_pass2(exps, rows, cols, flags, row_offsets, nv, vpos, vexp, s);
  return launch_status();
}

const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                         const uint32_t* vpos, int64_t nv, const uint8_t* vexp, float* corr,
                         uint16_t* y, int64_t ldy, void* stream) {
  if (const char* e = check_gemm(M, N, K, ldx, ldy, pal, nv, corr)) return e;
  if (!aligned(x, 16) || !aligned(sm, 8) || !aligned(idx, 4))
    return "palette_gemm needs x 16-byte, sm 8-byte and idx 4-byte aligned";
  if (!grid_ok(plan::gemm_grid(N)) || (nv > 0 && !grid_ok(plan::warp_grid(nv)))) return "matrix too large";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GemmArgs a{x, ldx, M, sm, idx, N, K, pal, vpos, nv, vexp, corr, y, ldy};
  // The correction must be complete before any row adds it: same stream, launched first.
  if (nv > 0)
    launch_gemm_correction(a, s);
  GemmTable<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>::launch(M, a, s);
  return launch_status();
}

const char* huffman_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm,
                         const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                         int64_t N, int64_t K, int64_t R, int64_t C, const uint16_t* lut,
                         float* part, uint16_t* y, int64_t ldy, int32_t* err, void* stream_handle) {
  if (const char* e = check_hgemm(M, N, K, R, C, ldx, ldy, stream_bytes, part)) return e;
  if (!aligned(lut, 16)) return "lut must be 16-byte aligned";
  const HGemmArgs a{x, ldx, M, sm, stream, stream_bytes, off, N, K, R, C, part, y, ldy};
  const bool vec = hgemm_vec(sm, K, C);
  const cudaStream_t s = static_cast<cudaStream_t>(stream_handle);
  switch (plan::hgemm_mtile(M)) {
    case 1: return launch_hgemm_m<1>(a, vec, lut, err, s);
    case 2: return launch_hgemm_m<2>(a, vec, lut, err, s);
    case 4: return launch_hgemm_m<4>(a, vec, lut, err, s);
    case 8: return launch_hgemm_m<8>(a, vec, lut, err, s);
    default: return launch_hgemm_m<16>(a, vec, lut, err, s);
  }
}

}  // namespace cuda
}  // namespace unweight
