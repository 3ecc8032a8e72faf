// Host API of the CUDA kernels (kernels.cuh): argument checks and grid sizing, then the launch
// through each family's launcher (palette_decode.cu, transcode.cu; the fused
// GEMM has its host API in palette_matmul.cu).  Also the launch helpers and argument checks
// that the host emulation (emulate.cu, palette_matmul.cu) shares (launch_util.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "crc32.cuh"
#include "huffman_decode.cuh"
#include "launch_util.h"
#include "palette_decode.cuh"
#include "prefetch.cuh"
#include "transcode.cuh"

namespace unweight {
namespace cuda {
namespace detail {

const char* launch_status() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

bool grid_ok(int64_t g) { return g >= 1 && g <= 0x7FFFFFFF; }

// The process-wide launch switches (kernels.cuh sets them; the launchers read them when they
// fill a launch's arguments), each with its default.
enum LaunchSwitch { kProgrammaticLaunch, kWgmmaTileWait, kGemvXPrefetch };
template <LaunchSwitch kSwitch, bool kDefault>
std::atomic<bool>& launch_switch() {
  static std::atomic<bool> on{kDefault};
  return on;
}
std::atomic<bool>& programmatic_flag() { return launch_switch<kProgrammaticLaunch, false>(); }
std::atomic<bool>& wgmma_tile_wait_flag() { return launch_switch<kWgmmaTileWait, false>(); }
std::atomic<bool>& gemv_x_prefetch_flag() { return launch_switch<kGemvXPrefetch, true>(); }
bool programmatic_launch() { return programmatic_flag().load(std::memory_order_relaxed); }
bool wgmma_tile_wait() { return wgmma_tile_wait_flag().load(std::memory_order_relaxed); }
bool gemv_x_prefetch() { return gemv_x_prefetch_flag().load(std::memory_order_relaxed); }

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

const char* check_plane_order(int64_t rows, int64_t cols, int tiled) {
  if (tiled != 0 && tiled != 1) return "tiled must be 0 or 1";
  if (tiled && !plan::pal_tiled_ok(rows, cols)) return "tile-major planes need rows % 16 == 0 and cols % 64 == 0";
  return nullptr;
}

const char* check_pal(int64_t rows, int64_t cols, int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                      const Palette& pal, int64_t nv, int64_t out_stride, int tiled) {
  if (rows <= 0 || cols <= 0) return "matrix dimensions must be positive";
  if (const char* e = check_plane_order(rows, cols, tiled)) return e;
  if (!(0 <= r0 && r0 < r1 && r1 <= rows && 0 <= k0 && k0 < k1 && k1 <= cols))
    return "decode rectangle out of bounds";
  if (pal.size < 1 || pal.size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > rows * plan::blocks_per_row(cols)) return "bad verbatim block count";
  if (out_stride < k1 - k0) return "row stride smaller than the decoded width";
  if (rows * plan::blocks_per_row(cols) > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  return nullptr;
}

}  // namespace detail

using namespace detail;

void set_programmatic_launch(bool on) { programmatic_flag().store(on, std::memory_order_relaxed); }
bool programmatic_launch_on() { return programmatic_launch(); }
void set_wgmma_tile_wait(bool on) { wgmma_tile_wait_flag().store(on, std::memory_order_relaxed); }
bool wgmma_tile_wait_on() { return wgmma_tile_wait(); }
void set_gemv_x_prefetch(bool on) { gemv_x_prefetch_flag().store(on, std::memory_order_relaxed); }
bool gemv_x_prefetch_on() { return gemv_x_prefetch(); }

namespace {

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

const char* detail::pal_path(int* variant, bool* vec, int64_t cols, int64_t k0, int64_t k1, int64_t out_stride,
                             const void* out,
                             const void* sm, const void* idx) {
  if (*variant == plan::PAL_VARIANT_DEFAULT) *variant = plan::PAL_DEFAULT_VARIANT;
  if (*variant != plan::PAL_VARIANT_VEC8 && *variant != plan::PAL_VARIANT_WIDE) return "unknown palette decode variant";
  *vec = cols % 8 == 0 && k0 % 8 == 0 && out_stride % 8 == 0 && aligned(out, 16) && aligned(sm, 8) && aligned(idx, 4);
  // The wide variant's chunks are VEC8's: it needs VEC8's alignment, and whole chunks only, so
  // that it carries no scalar tail path.
  if (*variant == plan::PAL_VARIANT_WIDE && !(*vec && (k1 - k0) % plan::PAL_VEC == 0)) *variant = plan::PAL_VARIANT_VEC8;
  return nullptr;
}

void detail::pal_launch_size(int variant, int64_t n_rows, int64_t width, int64_t* total, int64_t* grid) {
  const bool wide = variant == plan::PAL_VARIANT_WIDE;
  *total = wide ? plan::pal_wide_threads(n_rows, width) : n_rows * plan::pal_threads_per_row(width);
  *grid = wide ? plan::pal_wide_grid(n_rows, width) : plan::pal_grid(n_rows, width);
}

const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, int variant, int tiled, void* stream) {
  if (const char* e = check_pal(rows, cols, r0, r1, k0, k1, pal, nv, out_stride, tiled)) return e;
  bool vec = false;
  if (const char* e = pal_path(&variant, &vec, cols, k0, k1, out_stride, out, sm, idx)) return e;
  int64_t total, grid;
  pal_launch_size(variant, r1 - r0, k1 - k0, &total, &grid);
  if (!grid_ok(grid) || (nv > 0 && !grid_ok(plan::warp_grid(nv)))) return "matrix too large for one launch";
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  PalArgs a{sm, idx, rows, cols, r0, r1, k0, k1, pal, out, out_stride, {}, tiled != 0};
  if (variant == plan::PAL_VARIANT_WIDE) {
    const bool paired = pal_tables(pal, a.pt);
    launch_palette_decode_wide(a, paired, grid, total, err, s);
  } else {
    launch_palette_decode(a, vec, grid, total, err, s);
  }
  if (const char* e = launch_status()) return e;
  if (nv > 0) {
    const PatchArgs p{sm, rows, cols, r0, r1, k0, k1, vpos, nv, vexp, out, out_stride, tiled != 0};
    launch_verbatim_patch(p, err, s);
  }
  return launch_status();
}

const char* detail::slots_plan(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                               int64_t rows, int64_t cols, const Palette& pal, const uint32_t* vpos, int64_t nv_per,
                               const uint8_t* vexp, uint16_t* out, int variant, SlotPlan* pl) {
  if (n < 1) return "the stack must hold at least one matrix";
  if (slots < 0 || slots > 65535) return "slot count out of range (0..65535: the grid's y size)";
  if (const char* e = check_pal(rows, cols, 0, rows, 0, cols, pal, nv_per, cols, 0)) return e;
  bool vec = false;
  // Each matrix and output slot starts a whole number of vector units past the first (cols % 8
  // == 0 whenever vec holds), so the first ones' alignment stands for every slot's.
  if (const char* e = pal_path(&variant, &vec, cols, 0, cols, cols, out, sm, idx)) return e;
  pal_launch_size(variant, rows, cols, &pl->total, &pl->grid);
  if (!grid_ok(pl->grid) || (nv_per > 0 && !grid_ok(plan::warp_grid(nv_per)))) return "matrix too large for one launch";
  pl->a = PalArgs{sm, idx, rows, cols, 0, rows, 0, cols, pal, out, cols, {}, false};
  pl->p = PatchArgs{sm, rows, cols, 0, rows, 0, cols, nullptr, 0, nullptr, out, cols, false};
  pl->sa = SlotArgs{ids, n, sm, idx, out, rows * cols, rows * ((cols + 1) / 2), rows * cols, vpos, vexp, nv_per};
  pl->kind = variant == plan::PAL_VARIANT_WIDE ? (pal_tables(pal, pl->a.pt) ? 3 : 2) : vec ? 1 : 0;
  return nullptr;
}

const char* palette_decode_slots(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                                 int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv_per,
                                 const uint8_t* vexp, uint16_t* out, int32_t* err, int variant, void* stream) {
  SlotPlan pl;
  if (const char* e = slots_plan(ids, slots, n, sm, idx, rows, cols, pal, vpos, nv_per, vexp, out, variant, &pl))
    return e;
  if (slots == 0) return nullptr;
  launch_palette_decode_slots(pl, slots, err, static_cast<cudaStream_t>(stream));
  return launch_status();
}

namespace detail {
// The prefetch's arguments from n ranges, or the error.  *lines: the most lines of one range.
const char* prefetch_plan(const uint8_t* const* p, const int64_t* bytes, int n, PrefetchArgs* a, int64_t* lines) {
  if (n < 0 || n > plan::PREFETCH_MAX_RANGES) return "prefetch_l2: 0..4 byte ranges";
  *a = PrefetchArgs{};
  *lines = 0;
  for (int i = 0; i < n; ++i) {
    if (bytes[i] < 0) return "prefetch_l2: negative range size";
    if (bytes[i] > 0 && p[i] == nullptr) return "prefetch_l2: null range";
    if (bytes[i] == 0) continue;
    a->p[a->n] = p[i];
    a->bytes[a->n++] = bytes[i];
    *lines = std::max(*lines, plan::cdiv(bytes[i], plan::PREFETCH_LINE));
  }
  return nullptr;
}

// The CRC launch's arguments, or the error.
const char* crc32_plan(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out,
                       Crc32Args* a) {
  if (bytes < 0 || ranges < 0) return "crc32: negative range size or count";
  if (bytes >= (int64_t{1} << 47)) return "crc32: ranges of 2^47 bytes or more";
  if (ranges > 0 && bytes > 0 && (p == nullptr || table == nullptr)) return "crc32: null buffer";
  if (ranges > 0 && out == nullptr) return "crc32: null output";
  if (ranges > 0 && !aligned(table, 16)) return "crc32: the tables must be 16-byte aligned";
  const int64_t pieces = plan::crc_pieces(bytes);
  if (pieces > 0 && ranges > INT64_MAX / pieces) return "crc32: too many pieces";
  *a = Crc32Args{};
  a->p = p;
  a->bytes = bytes;
  a->ranges = ranges;
  a->pieces = pieces;
  a->table = table;
  a->out = out;
  for (int k = 0; k < plan::CRC_POW_TERMS; ++k) a->pow[k] = crc32_pow8(k);
  for (int k = 0; k < plan::CRC_INV_TERMS; ++k) a->inv[k] = crc32_pow8(k, true);
  // zlib's crc32 of a message is its raw state xor the state of the start value 0xFFFFFFFF moved
  // over the message, xor 0xFFFFFFFF: the crc32 of `bytes` zero bytes.
  a->zeros_crc = crc32_shift(0xFFFFFFFFu, bytes, a->pow, a->inv) ^ 0xFFFFFFFFu;
  return nullptr;
}
}  // namespace detail

const char* prefetch_l2(const uint8_t* const* p, const int64_t* bytes, int n, void* stream) {
  PrefetchArgs a;
  int64_t lines = 0;
  if (const char* e = prefetch_plan(p, bytes, n, &a, &lines)) return e;
  if (a.n == 0) return nullptr;
  launch_prefetch_l2(a, plan::prefetch_grid(lines), static_cast<cudaStream_t>(stream));
  return launch_status();
}

const char* crc32_ranges(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out,
                         void* stream) {
  Crc32Args a;
  if (const char* e = crc32_plan(p, bytes, ranges, table, out, &a)) return e;
  if (ranges == 0) return nullptr;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (cudaMemsetAsync(out, 0, static_cast<size_t>(ranges) * 4, s) != cudaSuccess) return launch_status();
  if (a.pieces == 0) return nullptr;  // empty ranges: crc32 0
  launch_crc32(a, plan::crc_grid(ranges * a.pieces), s);
  return launch_status();
}

void crc32_stride_table(uint32_t* u) { detail::crc32_stride_table(u); }

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

}  // namespace cuda
}  // namespace unweight
