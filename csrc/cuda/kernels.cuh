// Host API of the unweight CUDA kernels.
//
// Structure.  Every kernel is a thin __global__ shell around a __host__ __device__ "body"
// that does one thread's (or one warp lane's) unit of work, addressed through the launch
// geometry of kernel_plan.h.  The bodies decode with the shared primitives of
// ../decode_primitives.h (build_lut, BitReader / decode_run_bounded, ctx_of, lut_*,
// bf16_from_parts, pal_nibble), i.e. with the very code the CPU codec runs.  One translation
// unit per kernel family, its argument block and bodies in a header beside it:
//   huffman_decode.cu/.cuh    Huffman -> BF16 or exponent bytes, decode-table build, Huffman
//                             row gather (its own host API and emulation)
//   palette_decode.cu/.cuh    palette -> BF16, verbatim-block patch
//   transcode.cu/.cuh         exponent histogram, palette encode passes, row count/scan/compact/gather
//   palette_matmul.cu/.cuh    fused palette GEMM on tensor cores (its own host API and
//                             emulation: the body is written once over emu/ctx.cuh)
//   launch.cu, launch_util.h  the other functions below: argument checks, grid sizing
//   emulate.cu                the other `emulate::` functions below
//   emu/                      the warp emulator (thread context, host fibers, mma.sync)
//   device_util.cuh           cache-hinted loads (and the cache policy), bit casts, palette lookup
// The emulation runs the same bodies on the host over the same geometry -- the cooperative
// ones (shared memory, warp collectives, mma) through the warp emulator of emu/, the
// per-thread palette decode serially (through the emulator too while its access profile is
// on) -- so CPU-only CI checks the kernels' index math, decode logic and shared-memory
// ordering bit for bit (tests/cuda/), and their bank conflicts and sectors per request; only
// the cache hints of the loads and the occupancy queries are GPU-only.
//
// Deliberately free of CUDA and libtorch types so that bindings_cuda.cpp compiles with the
// plain host compiler and no CUDA include path: every device buffer is a raw pointer (the
// caller owns the memory, typically a torch tensor's data_ptr()), every stream a `void*`
// holding a cudaStream_t (0 = legacy default stream).  Every launcher is asynchronous and
// returns nullptr on success or a static, human-readable error string (argument problems or
// cudaGetErrorString of the launch error); data errors found on the device (corrupt
// streams, bad palette indices) are counted into the caller's int32 `err` device counter,
// which the caller reads after synchronizing.
//
// Layout conventions (all row-major, strides in elements):
//   sm   uint8  [rows, cols]            sign<<7 | mantissa
//   idx  uint8  [rows, (cols+1)/2]      palette nibbles, even column in the low nibble
//   vpos uint32 [nv]                    ascending ids row*ceil(cols/PAL_BLOCK)+block
//   vexp uint8  [nv, PAL_BLOCK]              exponents of the verbatim blocks (0-padded)
//   lut  uint16 [4, 4096]               Huffman decode tables, built by uw_huffman_build_lut
#pragma once
#include <cstdint>

namespace unweight {
namespace cuda {

// Number of visible CUDA devices; 0 when no driver or device is present (never an error).
int device_count();
// Comma-separated SM targets this module carries device code for, e.g. "800,900".
const char* compiled_archs();

// The 16-entry palette (unused entries 0), packed little-endian into four words so that a
// kernel keeps it in registers and looks entries up with byte permutes (no memory access).
struct Palette {
  uint32_t w[4];
  int size;
};

// ----------------------------------------------------------------------- Huffman tier
// Builds the 4 decode tables from the header's code lengths table[4][exp_hi-exp_lo+1]
// (device memory).  Invalid lengths add 1 to *err per bad context.
const char* huffman_build_lut(const uint8_t* table, int exp_lo, int exp_hi, uint16_t* lut,
                              int32_t* err, void* stream);

// Decodes segments [g0,g1) x [c0,c1) of a rows x cols matrix with grid R x C.
// `sm` and `out` point at row g0*R, column c0*C (as the CPU codec); strides in elements.
// Writes BF16 words (out16 != nullptr) or exponent bytes (out8 != nullptr, exactly one set).
// chk: the checkpoint index uint16 [n_seg, P] of interval S (FORMAT.md "Checkpoint index"),
// each segment then decoded as independent chains of S weights; null with S = P = 0 (one
// chain per segment).  Each chain that meets an invalid code, or does not end where the index
// or its segment's byte length says, or whose offsets are out of range, adds 1 to *err.
// variant: plan::HUFF_VARIANT_* (0: the runtime's default); every variant writes the same
// bits and counts the same errors, and shapes the vector variants cannot take run SCALAR.
const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint16_t* lut,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out16, uint8_t* out8, int64_t out_stride,
                           const uint16_t* chk, int64_t S, int64_t P, int32_t* err, int variant,
                           void* stream_handle);

// out[i, :] = row ids[i] of the Huffman matrix (full planes sm [rows, cols], stream, off,
// chk / S / P as above; ids int64 [n_ids] on the device), BF16 [n_ids, cols] with row stride
// out_stride.  Decodes only the chains that hold those rows (without an index, each row's
// segments up to the row).  No host sync: an id outside [0, rows) gives a zero row and adds
// 1 to *err, as do corrupt chains.
const char* huffman_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* stream, int64_t stream_bytes,
                                const uint32_t* off, int64_t rows, int64_t cols, int64_t R, int64_t C,
                                const uint16_t* lut, const uint8_t* sm, const uint16_t* chk, int64_t S, int64_t P,
                                uint16_t* out, int64_t out_stride, int32_t* err, void* stream_handle);

// ----------------------------------------------------------------------- palette tier
// Decodes rows [r0,r1) x columns [k0,k1) of the full planes sm/idx (pointers at row 0,
// column 0) into out (pointer at the rectangle's origin, row stride out_stride), then
// patches the verbatim blocks that intersect the rectangle.  Nibbles >= palette size and
// unsorted/out-of-range verbatim ids add to *err.  variant: plan::PAL_VARIANT_* (0: the
// runtime's default); both write the same bits, and a rectangle the wide variant's alignment
// rules out runs VEC8.  tiled: the planes are tile-major (kernel_plan.h pal_offset; rows % 16
// == 0, cols % 64 == 0), else in file order.
const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, int variant, int tiled, void* stream);

// Slot s of out (BF16 [slots, rows, cols]) = matrix ids[s] (int64 on the device, read there:
// no host sync) of a stack of n palette matrices: sm [n, rows, cols], idx [n, rows,
// ceil(cols / 2)], one palette, and each matrix's verbatim list of nv_per entries (vpos
// [n, nv_per] block ids within the matrix, ascending; vexp [n, nv_per, PAL_BLOCK]).  An id
// outside [0, n) leaves its slot unwritten and adds 1 to *err, as do nibbles >= the palette
// size and a list that is not ascending.  variant: as palette_decode's.  slots <= 65535.
const char* palette_decode_slots(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                                 int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv_per,
                                 const uint8_t* vexp, uint16_t* out, int32_t* err, int variant, void* stream);

// out[i, :] = row ids[i] of the palette matrix (full planes; ids int64 [n_ids] on the
// device), BF16 [n_ids, cols] with row stride out_stride, verbatim blocks found by binary
// search in vpos.  No host sync: an id outside [0, rows) gives a zero row and adds 1 to *err,
// as do nibbles >= the palette size.
const char* palette_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* sm, const uint8_t* idx,
                                int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv,
                                const uint8_t* vexp, const uint32_t* vrow, uint16_t* out, int64_t out_stride,
                                int32_t* err, void* stream);

// ----------------------------------------------------------------------- L2 prefetch
// Brings the n (<= PREFETCH_MAX_RANGES) device byte ranges [p[i], p[i] + bytes[i]) into L2
// (prefetch.cuh); a hint that reads and writes nothing.
const char* prefetch_l2(const uint8_t* const* p, const int64_t* bytes, int n, void* stream);

// ----------------------------------------------------------------------- CRC-32
// out[r] = zlib's crc32 of the r-th of `ranges` consecutive device byte ranges of `bytes` bytes
// from p (any alignment; crc32.cuh).  out: uint32 [ranges] on the device, written whole (the
// launcher zeroes it first); table: the uint32 [16][256] stride tables on the device, as
// crc32_stride_table fills them.
const char* crc32_ranges(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out,
                         void* stream);
// The stride tables, uint32 [16][256] (host memory).
void crc32_stride_table(uint32_t* u);

// ----------------------------------------------------------------------- transcode
// hist[256] (uint64, device, zeroed by the caller) += counts of the n exponent bytes.
const char* exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, void* stream);

// Pass 1 of palette encode from an exponent plane exps [rows, cols]: writes idx, one flag
// byte per (row, block) (1 = verbatim), and row_offsets[rows+1] = exclusive scan of the
// per-row verbatim counts (row_offsets[rows] = total).  row_counts[rows] is scratch.
const char* palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                                 uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                                 uint32_t* row_offsets, void* stream);
// Pass 2: writes the ascending verbatim ids vpos[nv] and their exponents vexp[nv, PAL_BLOCK];
// nv must equal row_offsets[rows] from pass 1 (the caller reads it back to size vexp).
const char* palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols,
                                 const uint8_t* flags, const uint32_t* row_offsets, int64_t nv,
                                 uint32_t* vpos, uint8_t* vexp, void* stream);

// ----------------------------------------------------------------------- fused GEMM
// y[m, r] = sum_k x[m, k] * W[r, k] for m < M (1..256), r < N, on the tensor cores: W the
// palette-coded [N, K] matrix (K % 64 == 0) in its planes (tiled: tile-major, N % 16 == 0;
// else file order), x bf16 [M, K] row stride
// ldx (% 8 == 0), y bf16 [M, N] row stride ldy; fp32 accumulation, one rounding.  x, sm, idx
// (and vexp when nv > 0) 16-byte aligned.  splits: the K split (plan::pmma_splits); when > 1,
// ws is fp32 scratch [splits, M, N] and counters int32 [plan::pmma_counters(N)], all zero
// before the launch and left zero after it (launches sharing them must be stream-ordered).
// stage_tiles: 64-column tiles per stage of the copy ring, 1 or plan::PMMA_SUB_WIDE (whole
// 128-byte lines per copy); x_shared (with stage_tiles 1): x copied once per CTA into shared
// memory rather than loaded by every warp.  All these layouts give the same bits.
// x_shared = plan::PMMA_XS_WGMMA (sm_90 with an sm_90a build; refused elsewhere): x copied in
// wgmma's layout and multiplied by wgmma, up to plan::PMMA_WG_CHUNK_M batch rows per CTA (splits
// and grid from the plan's wg forms); the tensor cores' sums per k16 step in the same order.
// It first writes x as its stage images into ws (plan::pmma_wg_x_at), so ws (16-byte aligned,
// plan::pmma_workspace_need floats) is needed at any split.
const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int splits,
                         float* ws, int32_t* counters, uint16_t* y, int64_t ldy, int stage_tiles, int x_shared,
                         int tiled, void* stream);

// Programmatic dependent launch of the tensor-core GEMV kernels (palette_gemv and
// palette_gemv_queue with an MMA variant, on sm_90+ devices) and of the wgmma palette_gemm (its
// x reorder, and the GEMM under it): on, a launch may start while the one ahead of it on the
// stream ends, streaming its planes (which no launch writes) and waiting (griddepcontrol.wait)
// before it touches x, y or the scratch; the results are the same.
// Process-wide, off by default.
void set_programmatic_launch(bool on);
bool programmatic_launch_on();
// The wgmma palette_gemm's schedule, a timing probe (both give the same bits): off (the
// default), a tile's wgmmas run under the next tile's decode and x is refilled S - 2 stages
// ahead; on, each tile waits for its own wgmmas and x is refilled S - 1 stages ahead.  Applies
// to the emulation too.  Process-wide.
void set_wgmma_tile_wait(bool on);
bool wgmma_tile_wait_on();
// The tensor-core GEMVs (palette_gemv's MMA variants, palette_gemv_queue, the probes that read
// x, palette_gemv_slots): on (the default), each asks x's lines of a step into L1 two steps
// before the step's mma read them (prefetch.global.L1, no register held); off, x is loaded
// only where it is used.  The same bits either way; the benchmark times both.  Applies to the
// emulation too.  Process-wide.
void set_gemv_x_prefetch(bool on);
bool gemv_x_prefetch_on();

// y[m, r] = sum_k x[m, k] * W[r, k] for m < M, r < N: the palette GEMV (palette_gemv.cu),
// same operands, plane orders and alignment as palette_gemm; variant: plan::PGEMV_VARIANT_* (0 the default;
// DEEP and STAGED give its bits; MMA runs on the tensor cores, its own sums); M: 1..4, or
// 1..32 for MMA (plan::pgemv_max_m); parts: warps per row, or per 16-row tile for MMA
// (plan::pgemv_variant_parts: 1, 2, 4 or 8; 1..8 for the variants plan::pgemv_any_parts
// names), which sets the order of the fp32 sums.  Needs no workspace.
const char* palette_gemv(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int parts,
                         uint16_t* y, int64_t ldy, int variant, int tiled, void* stream);

// A timing probe of palette_gemv's register-direct tensor-core variant (plan::PGEMV_VARIANT_MMA)
// at M 1..8 on a paired palette: the same launch with one stage left out (probe:
// plan::PGEMV_PROBE_NO_DECODE, PGEMV_PROBE_NO_MMA or PGEMV_PROBE_STREAM).  y is written, but is not the product:
// for the benchmarks' breakdown of the kernel's time only.
const char* palette_gemv_probe(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow,
                               int parts, uint16_t* y, int64_t ldy, int probe, int tiled, void* stream);

// The same product through the queued tensor-core GEMV (palette_gemv.cuh pgemv_mma_queue_body):
// M 1..32; units: units per 16-row tile (plan::pgemv_mma_queue_units; 1 .. the tile's steps,
// which sets the order of the fp32 sums: at 1, 2, 4 or 8 the MMA variant's at that parts);
// ctas: the persistent grid (plan::pgemv_mma_queue_grid); ws: fp32 [plan::pgemv_mma_queue_workspace]
// (unused at units 1); queue: int32 [plan::pgemv_mma_queue_counters], all zero, which a launch
// leaves zero.
const char* palette_gemv_queue(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow, int units,
                               int64_t ctas, float* ws, int32_t* queue, uint16_t* y, int64_t ldy, int tiled,
                               void* stream);

// y[s] = x[s] @ W[ids[s]]^T for s < slots (bf16 x [slots, ldx], y [slots, ldy]): the tensor-core
// GEMV at batch 1 over the slots of a palette stack (palette_gemv.cuh pgemv_slots_body), ids
// int64 read on the device; the stack as palette_decode_slots takes it (sm [E, N, K], idx [E, N,
// K / 2], vpos [E, V], vexp [E, V, 32]; file order).  parts as palette_gemv's for its MMA
// variant.  An id outside [0, E) adds 1 to *err and leaves its row unwritten.  slots <= 65535.
const char* palette_gemv_slots(const uint16_t* x, int64_t ldx, const int64_t* ids, int64_t slots, int64_t E,
                               const uint8_t* sm, const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                               const uint32_t* vpos, int64_t V, const uint8_t* vexp,
                               const uint32_t* vrow, int parts, uint16_t* y,
                               int64_t ldy, int32_t* err, void* stream);

// ----------------------------------------------------------------------- host emulation
// The same bodies the kernels run, on the host over the same launch geometry (host
// pointers): the cooperative ones through the warp emulator, the per-thread palette decode
// serially (or through the emulator while its access profile is on).  Lets CPU-only CI test
// the kernels' index math and decode logic without a GPU.
// Same signatures and semantics as above; err is a host int.
namespace emulate {
// The global LUT is built here from the code lengths table[4][exp_hi-exp_lo+1] by the body
// of the device's LUT kernel, and the decode kernels' CTA bodies (their shared-memory LUT
// fill included) run through the warp emulator.  max_ctas caps the grid as the device's
// occupancy does (0: no cap); variant as on the device; *path (when not null) receives the
// variant that ran, SCALAR where the vector conditions fail.
const char* huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           int64_t rows, int64_t cols, int64_t R, int64_t C, const uint8_t* table,
                           int exp_lo, int exp_hi, int64_t g0, int64_t g1, int64_t c0, int64_t c1,
                           const uint8_t* sm, int64_t sm_stride, uint16_t* out16, uint8_t* out8,
                           int64_t out_stride, const uint16_t* chk, int64_t S, int64_t P, int32_t* err,
                           int64_t max_ctas, int variant, int* path);
const char* huffman_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* stream, int64_t stream_bytes,
                                const uint32_t* off, int64_t rows, int64_t cols, int64_t R, int64_t C,
                                const uint8_t* table, int exp_lo, int exp_hi, const uint8_t* sm, const uint16_t* chk,
                                int64_t S, int64_t P, uint16_t* out, int64_t out_stride, int32_t* err,
                                int64_t max_ctas);
const char* palette_gather_rows(const int64_t* ids, int64_t n_ids, const uint8_t* sm, const uint8_t* idx,
                                int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv,
                                const uint8_t* vexp, const uint32_t* vrow, uint16_t* out, int64_t out_stride,
                                int32_t* err);
const char* palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows, int64_t cols,
                           int64_t r0, int64_t r1, int64_t k0, int64_t k1, Palette pal,
                           const uint32_t* vpos, int64_t nv, const uint8_t* vexp, uint16_t* out,
                           int64_t out_stride, int32_t* err, int variant, int tiled, int* path);
// As palette_decode_slots, over the kernels' launch geometry (ids on the host); *kind: the
// slot body that ran (0 / 1 VEC8 without / with vector access, 2 / 3 wide general / paired).
const char* palette_decode_slots(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                                 int64_t rows, int64_t cols, Palette pal, const uint32_t* vpos, int64_t nv_per,
                                 const uint8_t* vexp, uint16_t* out, int32_t* err, int variant, int* kind);
// The L2 prefetch body through the warp emulator over its launch geometry (each line checked
// against the caller's GlobalBounds scope, when one is open).
const char* prefetch_l2(const uint8_t* const* p, const int64_t* bytes, int n);
// The transcode kernels' bodies through the warp emulator, over their launch geometry.
const char* exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist);
const char* palette_encode_pass1(const uint8_t* exps, int64_t rows, int64_t cols, Palette pal,
                                 uint8_t* idx, uint8_t* flags, uint32_t* row_counts,
                                 uint32_t* row_offsets);
const char* palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                                 const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp);
// As palette_gemm, through the warp emulator; force_general runs the general palette decode
// even where the paired one applies (both are tested).
const char* palette_gemm(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int splits,
                         float* ws, int32_t* counters, uint16_t* y, int64_t ldy, int force_general, int stage_tiles,
                         int x_shared, int tiled);
// As palette_gemv, through the warp emulator (force_general as for palette_gemm).
const char* palette_gemv(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                         int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                         const uint32_t* vrow, int parts,
                         uint16_t* y, int64_t ldy, int force_general, int variant, int tiled);
// As palette_gemv_probe, through the warp emulator.
const char* palette_gemv_probe(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow,
                               int parts, uint16_t* y, int64_t ldy, int probe, int tiled);
// As palette_gemv_queue, through the warp emulator.
const char* palette_gemv_queue(const uint16_t* x, int64_t ldx, int M, const uint8_t* sm, const uint8_t* idx, int64_t N,
                               int64_t K, Palette pal, const uint32_t* vpos, int64_t nv, const uint8_t* vexp,
                               const uint32_t* vrow, int units,
                               int64_t ctas, float* ws, int32_t* queue, uint16_t* y, int64_t ldy, int force_general,
                               int tiled);
// As palette_gemv_slots, through the warp emulator (ids and err on the host).
const char* palette_gemv_slots(const uint16_t* x, int64_t ldx, const int64_t* ids, int64_t slots, int64_t E,
                               const uint8_t* sm, const uint8_t* idx, int64_t N, int64_t K, Palette pal,
                               const uint32_t* vpos, int64_t V, const uint8_t* vexp,
                               const uint32_t* vrow, int parts, uint16_t* y,
                               int64_t ldy, int32_t* err, int force_general);
// The fused kernels' verbatim searches in sorted v[0, n), one emulated warp per key pair:
// out[count][4] = warp_lower_bound2's two results for (ka[i], kb[i]), warp_lower_bound's for
// ka[i], and lane 31's copy of the first.
const char* warp_lower_bounds(const uint32_t* v, int64_t n, const uint64_t* ka, const uint64_t* kb, int64_t count,
                              int64_t* out);
// The CRC-32 body through the warp emulator (host buffers; out zeroed here).
const char* crc32_ranges(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out);
}  // namespace emulate

}  // namespace cuda
}  // namespace unweight
