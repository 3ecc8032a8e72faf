// Launch geometry of the unweight CUDA kernels: which grid/block each launch uses and which
// unit of work (segment, 8-weight chunk, verbatim block, row) each thread or warp owns.
//
// Plain C++17 with no CUDA headers so that three parties can share it:
//   * the kernels, their launchers and emulation (csrc/cuda/*.cu, device code via UW_PLAN_HD),
//   * bindings_cuda.cpp (exposes plan_* so tests can compare it with the Python mirror),
//   * unweight/runtime/kernel_plan.py mirrors every function here line for line; the CPU
//     tests in tests/cuda/test_kernel_logic.py check on odd shapes that the Python mirror
//     covers every element exactly once and that it agrees with this file.
// Change a constant here and in kernel_plan.py together.
#pragma once
#include <cstdint>

#include "../unweight_constants.h"

#if defined(__CUDACC__)
#define UW_PLAN_HD __host__ __device__ __forceinline__
#else
#define UW_PLAN_HD inline
#endif

namespace unweight {
namespace plan {

// Huffman -> BF16/exponents and the Huffman row gather: one thread per chain (a segment's
// weights from one checkpoint of the index to the next, FORMAT.md "Checkpoint index"; the
// whole segment without an index), grid-stride, the grid capped at the CTAs the device holds
// at once so each CTA fills its 32 KiB shared LUT once.  128 threads per CTA: 6 CTAs (the
// most an SM's 228 KiB of shared memory holds, with 1 KiB reserved per CTA) are 768 lanes,
// far more chains in flight than the ~90-160 per SM the decode's latency needs (FORMAT.md
// "Choosing S"), and a 4096 x 4096 matrix (16,384 chains at S = 1024) still fills 128 CTAs,
// about one per SM of an H100.
constexpr int HUFF_THREADS = 128;
// Huffman decode variants (the `variant` argument of huffman_decode; scripts/bench_decode.py
// times each on the device):
//   CHAIN   one chain per thread, each load issued right before its use;
//   AHEAD   one chain per thread, stream blocks and sign+mantissa bytes loaded a block / a
//           32-weight step before use, shift-ready LUT entries (huffman_decode.cuh);
//   AHEAD2  AHEAD with two chains per thread decoded in lockstep;
//   SCALAR  the byte-wise reader every shape takes when the vector conditions fail;
//   RING    AHEAD with its stream blocks copied (cp.async) into a per-lane ring of
//           HUFF_RING_SLOTS in shared memory at each step's start, so that the lanes of a
//           warp, which refill at different rounds, never wait on each other's global loads;
//   RING_WIDE  RING in CTAs of HUFF_RING_WIDE_THREADS sharing one LUT: more chains in flight
//           per SM (below);
//   RING_MAX   RING in CTAs of HUFF_RING_MAX_THREADS, two per SM: the most chains in flight
//           an SM's registers and shared memory hold (below);
//   PAIR    RING's chains and ring with two symbols per shared-memory lookup, from a table
//           indexed by the two weights' contexts and the next HUFF_PAIR_BITS stream bits that
//           each CTA builds from the single-symbol LUT (below).
// DEFAULT (0) is what the extension runs when no variant is named: RING, the fastest variant on
// every shape timed (bench_decode.py on an H200, Llama-3.1-8B's four layer shapes and its
// lm_head, GB/s of BF16 written: 682-844 at S=256 where AHEAD gives 503-602 and AHEAD2 410-632;
// 570-834 at S=1024 where AHEAD gives 259-568), bitwise equal to the others.  The runtime names
// another variant for a weight where its tuning table measured one faster for that GPU, shape
// and S (runtime/tuning_table.py, "decoders").
constexpr int HUFF_VARIANT_DEFAULT = 0;
constexpr int HUFF_VARIANT_CHAIN = 1;
constexpr int HUFF_VARIANT_AHEAD = 2;
constexpr int HUFF_VARIANT_AHEAD2 = 3;
constexpr int HUFF_VARIANT_SCALAR = 4;
constexpr int HUFF_VARIANT_RING = 5;
constexpr int HUFF_VARIANT_RING_WIDE = 6;
constexpr int HUFF_VARIANT_RING_MAX = 7;
constexpr int HUFF_VARIANT_PAIR = 8;
constexpr int HUFF_VARIANT_LAST = HUFF_VARIANT_PAIR;
constexpr int HUFF_DEFAULT_VARIANT = HUFF_VARIANT_RING;
// RING's per-lane slots of 16 stream bytes (HUFF_THREADS x 8 x 16 = 16 KiB per CTA, beside
// the 32 KiB LUT: the 48 KiB of static shared memory a CTA may have).  A step reads at most
// 3 blocks past its first, and a step's copies are waited for a step later, so 8 slots
// hold the 3 in use and the 3 in flight.
constexpr int HUFF_RING_SLOTS = 8;
// RING_WIDE's CTA: RING's CTA is held to 4 per SM (16 warps) by its 48 KiB of shared memory,
// two thirds of it the 32 KiB LUT every CTA copies.  Eight warps sharing one LUT take 64 KiB
// (dynamic shared memory), three CTAs per SM: 24 warps, 50% more chains in flight, at the 80
// registers that three such CTAs allow (RING's body fits them without spilling).
constexpr int HUFF_RING_WIDE_THREADS = 256;
// RING_MAX's CTA: sixteen warps sharing one LUT, 96 KiB of dynamic shared memory (the LUT and
// 512 rings), two CTAs per SM: 32 warps, twice RING's chains in flight where a matrix has the
// chains for it (135,168 on 132 SMs: the MLP matrices and the lm_head at S = 256), at 64
// registers.  RING's body then spills ~100 bytes in a chain's setup and end check and none in
// its step loop (ptxas and the SASS of the sm_90a build).
constexpr int HUFF_RING_MAX_THREADS = 512;
constexpr int HUFF_RING_MAX_CTAS_PER_SM = 2;
// PAIR's table: 16 context pairs x 2^9 entries x 4 bytes = 32 KiB beside the 32 KiB LUT (its
// rare slow path reads the LUT).  Nine bits hold two whole codes for ~98% of pairs of
// N(0, 0.02) weights (codes average ~2.6 bits); ten would double the table for ~0.5% more.
// Eight warps share both tables and have their rings beside them (96 KiB), two CTAs per SM:
// RING's 16 warps per SM, at up to 128 registers.
constexpr int HUFF_PAIR_BITS = 9;
constexpr int HUFF_PAIR_THREADS = 256;
constexpr int HUFF_PAIR_CTAS_PER_SM = 2;
// Chains one thread of a variant decodes at a time.
UW_PLAN_HD int huffman_ways(int variant) { return variant == HUFF_VARIANT_AHEAD2 ? 2 : 1; }
// Palette -> BF16: each thread decodes PAL_VEC consecutive weights of one row: 4 index bytes
// (one 32-bit load), 8 sign+mantissa bytes (one 64-bit load), one 16-byte store.  The wide
// variant (PAL_VARIANT_WIDE) gives each thread PAL_WIDE weights as PAL_WIDE_STEPS of those
// 8-weight chunks, a warp's lanes taking consecutive chunks at every step (pal_wide_chunk), so
// each of its load and store instructions covers whole sectors as VEC8's do; all four steps'
// loads are issued together (48 bytes in flight per thread) and decoded with the register
// tables of pal_regs.cuh.  DEFAULT (0) is what the extension runs unless named: WIDE,
// 1.33-1.43x VEC8's rate on every shape timed (bench_decode.py on an H200: 1720-2097 GB/s of
// BF16 written, VEC8 1285-1464, a device copy 1924-2075); a launch WIDE cannot take runs VEC8.
constexpr int PAL_VEC = 8;
constexpr int PAL_WIDE = 32;
constexpr int PAL_WIDE_STEPS = PAL_WIDE / PAL_VEC;
constexpr int PAL_VARIANT_DEFAULT = 0;
constexpr int PAL_VARIANT_VEC8 = 1;
constexpr int PAL_VARIANT_WIDE = 2;
constexpr int PAL_DEFAULT_VARIANT = PAL_VARIANT_WIDE;
constexpr int PAL_THREADS = 256;
// Warp-per-item kernels (verbatim patch, verbatim gather, row counts, compaction): 8 warps
// per CTA.
constexpr int WARP = 32;
constexpr int WARP_KERNEL_THREADS = 256;
constexpr int WARPS_PER_CTA = WARP_KERNEL_THREADS / WARP;
// Palette encode: one thread per (row, PAL_BLOCK-weight block).
constexpr int ENC_THREADS = 256;
// Exponent histogram: grid-stride loop over 16-byte vectors, capped grid (each CTA flushes a
// 256-bin shared histogram with 256 global atomics, so more CTAs than needed only add
// atomics).
constexpr int HIST_THREADS = 256;
constexpr int64_t HIST_MAX_CTAS = 1024;
// Single-CTA exclusive scan of per-row verbatim counts.
constexpr int SCAN_THREADS = 1024;
// L2 prefetch of whole weights (prefetch.cu): one 128-byte line per thread and turn, a few
// CTAs (it runs beside the compute-light kernels between two matmuls, which need few SMs),
// at most PREFETCH_MAX_RANGES byte ranges per launch.
constexpr int PREFETCH_THREADS = 256;
constexpr int64_t PREFETCH_MAX_CTAS = 32;
constexpr int PREFETCH_MAX_RANGES = 4;
constexpr int64_t PREFETCH_LINE = 128;
// Device CRC-32 of byte ranges (crc32.cu): a warp per piece of CRC_STEPS 512-byte strides
// (32 KiB), each lane one 16-byte word per stride, through CRC_TABLE_WORDS of shared tables;
// the grid strides over the pieces, at most CRC_MAX_CTAS CTAs (each copies the tables once).
constexpr int CRC_THREADS = 256;
constexpr int CRC_STEPS = 64;
constexpr int64_t CRC_STRIDE_BYTES = 512;  // a warp's 32 lanes x 16 bytes
constexpr int64_t CRC_PIECE_BYTES = CRC_STRIDE_BYTES * CRC_STEPS;
constexpr int CRC_TABLE_WORDS = 16 * 256;
constexpr int CRC_POW_TERMS = 48;  // x^(8 * 2^k), k < 48: a range below 2^48 bytes
constexpr int CRC_INV_TERMS = 9;   // x^(-8 * 2^k), k < 9: a shift back of < 512 bytes
constexpr int64_t CRC_MAX_CTAS = 1024;
// Fused palette GEMM on tensor cores (palette_matmul.cu, design in docs/design/gpu-kernels.md):
// y^T = W x^T as mma.sync m16n8k16 with W the A operand.  A CTA of PMMA_WARPS warps covers
// PMMA_ROWS rows of W and one K-split; each warp owns a PMMA_TILE_N-row tile and streams it
// PMMA_TILE_K columns at a time through a PMMA_STAGES-deep cp.async ring of its own.  The
// batch is the mma's n: 1, 2, 4 or 8 n-tiles of 8 per CTA; past PMMA_CHUNK_M rows (up to
// PMMA_MAX_M) the batch is cut into chunks of PMMA_CHUNK_M, one CTA each.  K is split so that a
// batch-1 launch still puts ~PMMA_CTAS_PER_SM CTAs on every SM; split partials go to an fp32
// workspace and the last CTA of a row block (an arrival counter) sums them in split order.
constexpr int PMMA_WARPS = 4;
constexpr int PMMA_THREADS = PMMA_WARPS * WARP;
constexpr int PMMA_TILE_N = 16;
// Verbatim entries of a row read at once when its cursor comes from the row index
// (palette_matmul.cuh pmma_row_cursor): a row holds a few, so one dependent load finds most.
constexpr int PMMA_VROW_WINDOW = 2;
constexpr int PMMA_ROWS = PMMA_WARPS * PMMA_TILE_N;
constexpr int PMMA_TILE_K = 64;
constexpr int PMMA_STAGES = 4;
// One stage: the tile's sign+mantissa bytes [16][64], then its index bytes [16][32].
constexpr int PMMA_SM_BYTES = PMMA_TILE_N * PMMA_TILE_K;
constexpr int PMMA_TILE_BYTES = PMMA_SM_BYTES + PMMA_SM_BYTES / 2;
// Dynamic shared memory: the warps' rings, then one int (the "last CTA" flag of the fix-up).
constexpr int PMMA_SMEM_BYTES = PMMA_WARPS * PMMA_STAGES * PMMA_TILE_BYTES + 16;
// Wide stages (PMMA_SUB_WIDE tiles of PMMA_TILE_K columns per stage; palette_matmul.cuh
// pmma_issue_wide): each copy reads whole 128-byte lines of the sign+mantissa rows.  The
// `stage_tiles` argument of palette_gemm picks 1 or PMMA_SUB_WIDE.
constexpr int PMMA_SUB_WIDE = 2;
// Shared x (the `x_shared` argument of palette_gemm, one-tile stages): the CTA copies its batch
// rows of each stage's 64 columns once, into a ring of PMMA_STAGES stages of 8 * NT rows of
// PMMA_X_ROW_BYTES after the warps' rings, instead of every warp loading them itself.
constexpr int PMMA_X_ROW_BYTES = 2 * PMMA_TILE_K;
UW_PLAN_HD int pmma_x_stage_bytes(int ntiles) { return 8 * ntiles * PMMA_X_ROW_BYTES; }
constexpr int PMMA_CHUNK_M = 64;
constexpr int PMMA_MAX_M = 256;
// The wgmma variant (sm_90a; palette_matmul.cuh "wgmma"): x_shared == PMMA_XS_WGMMA stages x in
// wgmma's shared-memory layout and multiplies with wgmma.mma_async, a CTA taking up to
// PMMA_WG_CHUNK_M batch rows (one n = 128 wgmma per 16 columns), so past 64 rows each weight is
// decoded once per 128 batch rows instead of once per 64.
constexpr int PMMA_XS_WGMMA = 2;
constexpr int PMMA_WG_CHUNK_M = 128;
// Its ring at 16 n-tiles: PMMA_WG_STAGES stages of 6 KB of weights and 16 KB of x (66 KB per
// CTA) let three CTAs share an SM, where four stages (90 KB) let two: the same 36 KB of
// weights in flight per SM (two tiles ahead of three CTAs, three of two) and half again as many
// warps to cover each one's wgmma wait.  Three CTAs of 128 threads fit its 168 registers.
constexpr int PMMA_WG_STAGES = 3;
// Ring stages of a launch (a compile-time constant of each kernel instantiation).
constexpr int pmma_stages(int x_shared, int ntiles) {
  return x_shared == PMMA_XS_WGMMA && ntiles > 8 ? PMMA_WG_STAGES : PMMA_STAGES;
}
// Dynamic shared memory of a launch: the warps' rings, the shared-x ring (x_shared, for a
// batch of `ntiles` n-tiles), the 16 bytes of the fix-up flag, then for wgmma the stages'
// 8-byte mbarriers (its x arrives by bulk copy).
UW_PLAN_HD int pmma_smem_bytes(int stage_tiles, int ntiles = 0, int x_shared = 0) {
  const int stages = pmma_stages(x_shared, ntiles);
  return PMMA_WARPS * stages * stage_tiles * PMMA_TILE_BYTES + (x_shared ? stages * pmma_x_stage_bytes(ntiles) : 0) +
         16 + (x_shared == PMMA_XS_WGMMA ? 8 * stages : 0);
}
constexpr int PMMA_CTAS_PER_SM = 4;
// The wgmma variant's splits plan for the CTAs an SM holds of its 8- and 16-n-tile kernels (the
// batches it is for: launch bounds and rings give three), so a 4096 x 4096 launch is one wave of
// 384 CTAs where planning for four made 512, a wave and a third.
constexpr int PMMA_WG_CTAS_PER_SM = 3;
constexpr int PMMA_MIN_SPLIT_TILES = 4;
constexpr int64_t PMMA_MAX_SPLITS = 65535;  // gridDim.y

// Palette GEMV on CUDA cores for batches of 1..PGEMV_MAX_M (palette_gemv.cu): a warp streams
// PGEMV_COLS columns of one weight row per step straight into registers (16 sign+mantissa
// bytes and 8 index bytes per lane, no shared-memory staging), PGEMV_UNROLL steps of loads in
// flight and the next PGEMV_UNROLL issued while those are used.  A CTA of PGEMV_WARPS warps
// holds PGEMV_WARPS / parts rows; the `parts` warps of a row split its K and add their sums in
// part order through shared memory.
constexpr int PGEMV_WARPS = 8;
constexpr int PGEMV_THREADS = PGEMV_WARPS * WARP;
constexpr int PGEMV_COLS = 512;
constexpr int PGEMV_UNROLL = 2;
constexpr int PGEMV_MAX_M = 4;
constexpr int PGEMV_MAX_PARTS = PGEMV_WARPS;
// CTAs an SM is planned to hold (the kernel's __launch_bounds__: up to 80 registers, what four
// batch rows of accumulators, two batches of loads in flight and the decode hold unspilled).
constexpr int PGEMV_CTAS_PER_SM = 3;
constexpr int PGEMV_WARPS_PER_SM = PGEMV_CTAS_PER_SM * PGEMV_WARPS;
// The deep variant (dispatch path palette_gemv_deep): PGEMV_DEEP_UNROLL steps per batch of
// loads, so a lane has up to 96 bytes in flight where the default has 48, at
// PGEMV_DEEP_CTAS_PER_SM CTAs per SM (up to 128 registers per thread).  On the H200 the default
// kept 38% of DRAM's peak busy at 34% occupancy (Nsight Compute, 32768 x 4096, batch 1): the
// bytes in flight per SM, not the instructions, look like its limit.  Steps and their sums run
// in the same order: the same bits as the default at the same `parts`.
constexpr int PGEMV_DEEP_UNROLL = 4;
constexpr int PGEMV_DEEP_CTAS_PER_SM = 2;
// The staged variant (dispatch path palette_gemv_staged): a step's bytes land in a per-warp
// ring of PGEMV_STAGED_DEPTH slots in shared memory through cp.async, so what is in flight
// costs no registers: DEPTH - 1 steps (3.75 KB) per warp, at PGEMV_STAGED_CTAS_PER_SM CTAs per
// SM (up to 64 registers per thread), about 3.5x the default's.  On the H200 both earlier
// variants streamed at ~2.3 TB/s (their slope per row across 4096..14336-row layers) where
// cuBLAS streamed at ~4.2; the same steps and sums in the same order: the same bits.
constexpr int PGEMV_STAGED_DEPTH = 6;
constexpr int PGEMV_STAGED_SLOT = PGEMV_COLS + PGEMV_COLS / 2;  // sign+mantissa, then index bytes
constexpr int PGEMV_STAGED_CTAS_PER_SM = 4;
constexpr int PGEMV_VARIANT_DEFAULT = 0;
constexpr int PGEMV_VARIANT_STD = 1;
constexpr int PGEMV_VARIANT_DEEP = 2;
constexpr int PGEMV_VARIANT_STAGED = 3;
// The tensor-core variant (dispatch path palette_gemv_mma): a warp owns PGEMV_MMA_ROWS rows
// (one mma A tile) and streams PGEMV_MMA_COLS columns of them per step straight into
// registers: lane (g, t) loads 16 sign+mantissa bytes and 8 index bytes at columns 16t and
// 64 + 16t of rows g and g + 8 (every warp load covers whole sectors), decodes them into A
// fragments (pal_regs.cuh) and feeds mma.sync m16n8k16, so a weight costs its decode and an
// eighth of an mma instead of its decode, two unpacks and one FMA per batch row: ~3
// instructions per weight (sm_90a) where the CUDA-core steps take ~8.8.  Batches of up to
// PGEMV_MMA_MAX_M rows (one, two or four n-tiles of 8).  Two steps of loads in flight per warp
// (6 KB), at PGEMV_MMA_CTAS_PER_SM CTAs per SM (up to 128 registers per thread) for one or
// two n-tiles and PGEMV_MMA4_CTAS_PER_SM for four (their 16 accumulators and x registers
// more need ~170).  The parts plan is the same at every batch size, so a row's sums are too.
// Not the CUDA-core variants' bits: tensor-core sums, as in the fused GEMM.
constexpr int PGEMV_VARIANT_MMA = 4;
constexpr int PGEMV_MMA_ROWS = 16;
constexpr int PGEMV_MMA_COLS = 128;
constexpr int PGEMV_MMA_MAX_M = 32;
constexpr int PGEMV_MMA_CTAS_PER_SM = 2;
constexpr int PGEMV_MMA4_CTAS_PER_SM = 1;
constexpr int PGEMV_MMA_WARPS_PER_SM = PGEMV_MMA_CTAS_PER_SM * PGEMV_WARPS;
// Steps a part keeps at least (the loads of two are in flight while one is used).
constexpr int PGEMV_MMA_MIN_STEPS = 4;
// The staged tensor-core variant (dispatch path palette_gemv_mma_staged): the same tiles,
// steps, parts and bits, with each step's 3 KB landing in a per-warp ring of
// PGEMV_MMA_STAGED_DEPTH slots in shared memory through cp.async: DEPTH - 1 steps (9 KB) in
// flight per warp without the 48 registers the register-direct stream spends on them, at
// PGEMV_MMA_STAGED_CTAS_PER_SM CTAs per SM (144 KB per SM in flight where the register-direct
// variant has 48-96).  Four n-tiles (batch 17-32) run at PGEMV_MMA4_RING_CTAS_PER_SM CTAs per SM
// (below).
constexpr int PGEMV_VARIANT_MMA_STAGED = 5;
constexpr int PGEMV_MMA_STAGED_DEPTH = 4;
constexpr int PGEMV_MMA_STAGED_SLOT = PGEMV_MMA_ROWS * (PGEMV_MMA_COLS + PGEMV_MMA_COLS / 2);
constexpr int PGEMV_MMA_STAGED_CTAS_PER_SM = 2;
// The ring variants (staged, bulk copies) at four n-tiles (batch 17-32): their loads in flight
// live in shared memory, not registers, so their 16 accumulators and x fit 128 registers
// (ptxas sm_90a: 128 each; 4 and 16 bytes of spill stores, made once at the setup and reloaded
// from L1 7 times per 4 steps) and they keep two CTAs per SM, 144 KB in flight where one CTA
// has 72 KB.  The register-direct variants' four n-tiles need 168 (PGEMV_MMA4_CTAS_PER_SM).
constexpr int PGEMV_MMA4_RING_CTAS_PER_SM = 2;
// The prefetching tensor-core variant (dispatch path palette_gemv_mma_prefetch): the
// register-direct variant (its loads, bits and CTAs per SM) with an L2 prefetch of the step
// PGEMV_MMA_PREFETCH_STEPS past its last load: 12 KB asked of DRAM per warp instead of 6, the
// prefetched 6 KB costing no register.  At 16 warps per SM the GPU then holds ~13 MB of
// prefetched lines at once, a quarter of an H100's L2.
constexpr int PGEMV_VARIANT_MMA_PREFETCH = 6;
constexpr int PGEMV_MMA_PREFETCH_STEPS = 2;
// The bulk-copy tensor-core variant (dispatch path palette_gemv_mma_bulk; sm_90+ and tile-major
// planes, where a warp's part is one run of bytes per plane): the same tiles, steps, parts and
// bits, each step fetched by the copy engine (two cp.async.bulk by one lane, counted on an
// mbarrier) into a per-warp ring of PGEMV_MMA_BULK_DEPTH slots: DEPTH - 1 steps (9 KB) in
// flight per warp, 144 KB per SM at PGEMV_MMA_BULK_CTAS_PER_SM CTAs, with the staged variant's
// memory but two instructions per step to ask for it instead of six copies per lane.  Shared
// memory: the rings, then one 8-byte mbarrier per slot.
constexpr int PGEMV_VARIANT_MMA_BULK = 7;
constexpr int PGEMV_MMA_BULK_DEPTH = 4;
constexpr int PGEMV_MMA_BULK_SLOT = PGEMV_MMA_ROWS * (PGEMV_MMA_COLS + PGEMV_MMA_COLS / 2);
constexpr int PGEMV_MMA_BULK_CTAS_PER_SM = 2;
// The queued tensor-core variant (dispatch path palette_gemv_mma_queue): the register-direct
// variant's steps, loads and sums in units of a tile's steps handed out from a queue to a
// persistent grid (what the SMs hold at once), so the warps that stream faster take more units
// and a tile count the SMs do not divide costs at most one unit per warp instead of a second
// wave.  Units per tile: enough for PGEMV_MMA_QUEUE_UNITS_PER_WARP units per resident warp, each
// at least PGEMV_MMA_QUEUE_MIN_STEPS steps (an even count where the tile's steps allow), at
// most PGEMV_MMA_QUEUE_MAX_UNITS.  Counters (int32): the queue's head, the warps done, then one
// arrival count per tile; zero before a launch and after it.
constexpr int PGEMV_VARIANT_MMA_QUEUE = 8;
constexpr int PGEMV_MMA_QUEUE_UNITS_PER_WARP = 3;
constexpr int PGEMV_MMA_QUEUE_MIN_STEPS = 2;
constexpr int PGEMV_MMA_QUEUE_MAX_UNITS = 64;
constexpr int PGEMV_QUEUE_HEAD = 0;
constexpr int PGEMV_QUEUE_DONE = 1;
constexpr int PGEMV_QUEUE_TILES = 2;
// The register-direct tensor-core variant on planes held in the split layout (dispatch path
// palette_gemv_mma_split; ops.split_palette_planes): each weight's sign+mantissa byte replaced
// by its BF16 low byte (exponent bit 0, then the mantissa) and its index nibble by a code
// q = c << 1 | sign, c the rank of the exponent's upper seven bits (e >> 1) among the
// palette's, so a paired byte lookup of q gives the BF16 high byte and two byte interleaves
// finish the pair: 6 operations per 4 weights where the stored layout's decode takes 8
// (pal_regs.cuh pal_decode4_split).  The palette's exponents must fall in at most
// PAL_SPLIT_HALVES values of e >> 1.  The same values in the same order as
// PGEMV_VARIANT_MMA: its bits.
constexpr int PGEMV_VARIANT_MMA_SPLIT = 9;
constexpr int PAL_SPLIT_HALVES = 8;
// Timing probes of the register-direct tensor-core GEMV at batch 1..8 (palette_gemv_probe; for
// the benchmarks, never a dispatch path: their y is not the product).  NO_DECODE hands the
// sign+mantissa words to the tensor cores as loaded (the index words folded in, so their loads
// stay), leaving the stream, the verbatim check, the x loads and the mma; NO_MMA decodes and
// patches as the kernel does but folds the A registers into the sums' bits instead of loading x
// and multiplying (the mma chain's and x's cost); STREAM keeps only the loads, folded into the
// sums' bits: the kernel's streaming floor at its occupancy and bytes in flight.  Their times
// beside the full kernel's (and the full kernel's on an empty verbatim list) say what the
// decode, the verbatim blocks, the mma and the stream each cost.
constexpr int PGEMV_PROBE_NONE = 0;
constexpr int PGEMV_PROBE_NO_DECODE = 1;
constexpr int PGEMV_PROBE_STREAM = 2;
constexpr int PGEMV_PROBE_NO_MMA = 3;
// Shared memory: the parts' sums, [PGEMV_WARPS][PGEMV_MAX_M] fp32; the staged variant adds
// its rings after them.
constexpr int PGEMV_SMEM_BYTES = PGEMV_WARPS * PGEMV_MAX_M * 4;
constexpr int PGEMV_STAGED_SMEM_BYTES = PGEMV_SMEM_BYTES + PGEMV_WARPS * PGEMV_STAGED_DEPTH * PGEMV_STAGED_SLOT;
// The tensor-core variant's parts' sums: [PGEMV_WARPS][PGEMV_MMA_ROWS][PGEMV_MMA_MAX_M] fp32.
constexpr int PGEMV_MMA_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_ROWS * PGEMV_MMA_MAX_M * 4;
// The staged tensor-core variant's rings (each warp's parts' sums go into its own ring).
constexpr int PGEMV_MMA_STAGED_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_STAGED_DEPTH * PGEMV_MMA_STAGED_SLOT;
// The bulk-copy variant's rings (the parts' sums go there too), then its mbarriers.
constexpr int PGEMV_MMA_BULK_SMEM_BYTES = PGEMV_WARPS * PGEMV_MMA_BULK_DEPTH * (PGEMV_MMA_BULK_SLOT + 8);

UW_PLAN_HD int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// --- huffman decode ---------------------------------------------------------------------
// Chains of one segment: P + 1 with a checkpoint index of P entries per segment (S > 0; a
// partial segment leaves its last ones without work), 1 without.
UW_PLAN_HD int64_t huffman_chains_per_segment(int64_t S, int64_t P) { return S > 0 ? P + 1 : 1; }
// CTAs for n work items (chains, gather units), at most max_ctas (they loop, grid stride).
UW_PLAN_HD int64_t huffman_grid(int64_t n_items, int64_t max_ctas, int threads = HUFF_THREADS) {
  const int64_t want = cdiv(n_items, threads);
  return want < max_ctas ? want : max_ctas;
}
// Chain t -> i, the selected segment (for huffman_unit), and j, its checkpoint.
UW_PLAN_HD void huffman_chain(int64_t t, int64_t chains_per_segment, int64_t* i, int64_t* j) {
  *i = t / chains_per_segment;
  *j = t % chains_per_segment;
}
// Global thread index i (< n_sel_g * n_sel_c) -> segment (group, chunk) of the selection
// [g0, g0+n_sel_g) x [c0, c0+n_sel_c).  Group-fastest, the same order as the CPU codec.
UW_PLAN_HD void huffman_unit(int64_t i, int64_t g0, int64_t c0, int64_t n_sel_g, int64_t* g,
                             int64_t* c) {
  *g = g0 + i % n_sel_g;
  *c = c0 + i / n_sel_g;
}

// --- huffman row gather -----------------------------------------------------------------
// Parts per (id, chunk): the chains a row of a chunk `width` weights wide can touch,
// ceil(width / S) + 1 (the row may start mid-chain), at most the segment's P + 1; 1 without
// an index (the part decodes the segment from its start up to the row).
UW_PLAN_HD int64_t hgather_units(int64_t S, int64_t P, int64_t width) {
  if (S <= 0) return 1;
  const int64_t u = cdiv(width, S) + 1;
  return u < P + 1 ? u : P + 1;
}
// Unit t -> id index, chunk c, part u.  Id-major, so the parts of one row are neighbours.
UW_PLAN_HD void hgather_unit(int64_t t, int64_t n_chunks, int64_t units, int64_t* id, int64_t* c, int64_t* u) {
  *id = t / (n_chunks * units);
  *c = (t / units) % n_chunks;
  *u = t % units;
}

// --- palette decode ---------------------------------------------------------------------
// VEC8: thread t decodes chunk t, the PAL_VEC-weight chunks of the rectangle's rows in order.
UW_PLAN_HD int64_t pal_threads_per_row(int64_t n_cols) { return cdiv(n_cols, PAL_VEC); }
UW_PLAN_HD int64_t pal_grid(int64_t n_rows, int64_t n_cols) {
  return cdiv(n_rows * pal_threads_per_row(n_cols), PAL_THREADS);
}
// Chunk t -> row r (relative), first column k (relative) and count n (1..PAL_VEC) of weights.
UW_PLAN_HD void pal_unit(int64_t t, int64_t n_cols, int64_t* r, int64_t* k, int* n) {
  const int64_t tpr = pal_threads_per_row(n_cols);
  *r = t / tpr;
  *k = (t % tpr) * PAL_VEC;
  const int64_t left = n_cols - *k;
  *n = static_cast<int>(left < PAL_VEC ? left : PAL_VEC);
}
// WIDE: a warp owns WARP * PAL_WIDE_STEPS consecutive chunks; at step s its lane l takes chunk
// s * WARP + l of them.  Threads are whole warps; chunks past the rectangle are skipped.
UW_PLAN_HD int64_t pal_wide_threads(int64_t n_rows, int64_t n_cols) {
  return cdiv(n_rows * pal_threads_per_row(n_cols), WARP * PAL_WIDE_STEPS) * WARP;
}
UW_PLAN_HD int64_t pal_wide_grid(int64_t n_rows, int64_t n_cols) {
  return cdiv(pal_wide_threads(n_rows, n_cols), PAL_THREADS);
}
UW_PLAN_HD int64_t pal_wide_chunk(int64_t t, int s) {
  return (t / WARP) * (WARP * PAL_WIDE_STEPS) + s * WARP + t % WARP;
}
// pal_unit of each step's chunk with one 64-bit division: a step advances WARP chunks, i.e.
// dr rows and dk chunks (tpr > WARP, every real layer, needs no second division).  A chunk
// past the rectangle gets r[s] >= its row count.
UW_PLAN_HD void pal_wide_units(int64_t t, int64_t n_cols, int64_t (&r)[PAL_WIDE_STEPS], int64_t (&k)[PAL_WIDE_STEPS],
                               int (&n)[PAL_WIDE_STEPS]) {
  const int64_t tpr = pal_threads_per_row(n_cols);
  const int64_t c = pal_wide_chunk(t, 0);
  int64_t row = c / tpr, kc = c - row * tpr;
  const int64_t dr = tpr > WARP ? 0 : WARP / static_cast<int>(tpr), dk = WARP - dr * tpr;
  for (int s = 0; s < PAL_WIDE_STEPS; ++s) {
    if (s > 0) {
      row += dr;
      kc += dk;
      if (kc >= tpr) {
        kc -= tpr;
        ++row;
      }
    }
    r[s] = row;
    k[s] = kc * PAL_VEC;
    const int64_t left = n_cols - k[s];
    n[s] = static_cast<int>(left < PAL_VEC ? left : PAL_VEC);
  }
}

// --- palette plane order in device memory ------------------------------------------------
// The palette kernels read the sign+mantissa plane sm [N, K] and the index plane idx
// [N, K / 2] in one of two orders.  File order (FORMAT.md): row-major.  Tile-major: the
// matrix cut into PAL_TILE_ROWS x PAL_TILE_COLS tiles (the fused kernels' 16-row A tile by
// a 64-column mma tile), tiles stored row of tiles by row of tiles, each tile's 16 rows of 64
// bytes (of 32 index bytes) contiguous: [N / 16][K / 64][16][64] and [N / 16][K / 64][16][32].
// A runtime may permute a weight's planes into it at load (N % 16 == 0, K % 64 == 0); the
// file format does not change.  In file order a warp's 16-row step reads 64- or 128-byte runs
// of 16 rows a row length apart, each run from a different DRAM page; tile-major, the same
// step is one contiguous run (1 KB of sign+mantissa and 512 bytes of index per tile), and a
// warp's consecutive steps are consecutive too, as Marlin's permuted weights are.  Both
// orders are one formula: byte (r, k) of sm sits at
//   (r / 16) * 16 K + (r % 16) * ld_row + (k / 64) * ld_tile + k % 64
// with (ld_row, ld_tile) = (K, 64) in file order (which makes it r K + k) and (64, 1024)
// tile-major; idx byte (r, k / 2) at half that offset (k even).  A kernel that advances by c
// columns (a multiple of 64) moves its pointers by c / 64 * ld_tile bytes of sm.
constexpr int PAL_TILE_ROWS = 16;
constexpr int PAL_TILE_COLS = 64;
UW_PLAN_HD bool pal_tiled_ok(int64_t N, int64_t K) {
  return N > 0 && K > 0 && N % PAL_TILE_ROWS == 0 && K % PAL_TILE_COLS == 0;
}
UW_PLAN_HD int64_t pal_ld_row(int64_t K, bool tiled) { return tiled ? PAL_TILE_COLS : K; }
UW_PLAN_HD int64_t pal_ld_tile(bool tiled) { return tiled ? PAL_TILE_ROWS * PAL_TILE_COLS : PAL_TILE_COLS; }
// (r, k >= 0: unsigned, so the divisions by the tile's sides are shifts and masks, not the
// signed forms' sign fix-ups, in every kernel's address setup)
UW_PLAN_HD int64_t pal_offset(int64_t r, int64_t k, int64_t K, int64_t ld_row, int64_t ld_tile) {
  const uint64_t ur = static_cast<uint64_t>(r), uk = static_cast<uint64_t>(k);
  return static_cast<int64_t>((ur / PAL_TILE_ROWS) * PAL_TILE_ROWS * static_cast<uint64_t>(K) +
                              (ur % PAL_TILE_ROWS) * static_cast<uint64_t>(ld_row) +
                              (uk / PAL_TILE_COLS) * static_cast<uint64_t>(ld_tile) + uk % PAL_TILE_COLS);
}
// Byte of sign+mantissa (r, k) and the index byte holding its nibble (bit 4 (k % 2)), in
// either order, for any width (a file-order index row is ceil(cols / 2) bytes).
UW_PLAN_HD int64_t pal_sm_index(int64_t r, int64_t k, int64_t cols, bool tiled) {
  return tiled ? pal_offset(r, k, cols, pal_ld_row(cols, true), pal_ld_tile(true)) : r * cols + k;
}
UW_PLAN_HD int64_t pal_idx_index(int64_t r, int64_t k, int64_t cols, bool tiled) {
  return tiled ? pal_sm_index(r, k, cols, true) / 2 : r * ((cols + 1) / 2) + k / 2;
}

// --- warp-per-item kernels --------------------------------------------------------------
// Palette row gather: pal_unit's threads per row, over n_ids rows.
UW_PLAN_HD int64_t pgather_grid(int64_t n_ids, int64_t n_cols) { return pal_grid(n_ids, n_cols); }
UW_PLAN_HD int64_t warp_grid(int64_t n_items) { return cdiv(n_items, WARPS_PER_CTA); }

// --- palette encode ---------------------------------------------------------------------
UW_PLAN_HD int64_t blocks_per_row(int64_t cols) { return cdiv(cols, PAL_BLOCK); }
UW_PLAN_HD int64_t enc_grid(int64_t rows, int64_t cols) {
  return cdiv(rows * blocks_per_row(cols), ENC_THREADS);
}

// --- L2 prefetch ------------------------------------------------------------------------
// CTAs for `lines` 128-byte lines: one line per thread and turn, capped.
UW_PLAN_HD int64_t prefetch_grid(int64_t lines) {
  const int64_t want = cdiv(lines, PREFETCH_THREADS);
  return want < 1 ? 1 : (want > PREFETCH_MAX_CTAS ? PREFETCH_MAX_CTAS : want);
}

// --- device CRC-32 -----------------------------------------------------------------------
// Pieces of one range of `bytes` bytes: its 16-byte words (at most cdiv(bytes + 15, 16), the
// range need not start on a word) in pieces of CRC_STEPS strides; and the CTAs for all of them.
UW_PLAN_HD int64_t crc_pieces(int64_t bytes) {
  return bytes <= 0 ? 0 : cdiv(cdiv(bytes + 15, 16), CRC_PIECE_BYTES / 16);
}
UW_PLAN_HD int64_t crc_grid(int64_t pieces) {
  const int64_t want = cdiv(pieces, CRC_THREADS / 32);
  return want < 1 ? 1 : (want > CRC_MAX_CTAS ? CRC_MAX_CTAS : want);
}

// --- histogram --------------------------------------------------------------------------
UW_PLAN_HD int64_t hist_grid(int64_t n_bytes) {
  const int64_t want = cdiv(cdiv(n_bytes, 16), HIST_THREADS);
  return want < 1 ? 1 : (want > HIST_MAX_CTAS ? HIST_MAX_CTAS : want);
}

// --- fused palette GEMM (tensor cores) -------------------------------------------------
// n-tiles of 8 batch rows per CTA for a batch of M (0 when M is out of range).
// wg: the wgmma variant (x_shared == PMMA_XS_WGMMA), whose CTAs take up to PMMA_WG_CHUNK_M rows
// (16 n-tiles: one wgmma of n = 128).
UW_PLAN_HD int pmma_ntiles(int M, bool wg = false) {
  if (M < 1 || M > PMMA_MAX_M) return 0;
  return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= (wg ? 64 : PMMA_MAX_M) ? 8 : 16;
}
// Batch rows per chunk (one CTA per row block and chunk).
UW_PLAN_HD int pmma_chunk_m(bool wg = false) { return wg ? PMMA_WG_CHUNK_M : PMMA_CHUNK_M; }
// Batch chunks of pmma_chunk_m rows.
UW_PLAN_HD int pmma_chunks(int M, bool wg = false) { return M < 1 ? 1 : static_cast<int>(cdiv(M, pmma_chunk_m(wg))); }
// Row blocks of PMMA_ROWS rows of W.
UW_PLAN_HD int64_t pmma_row_blocks(int64_t N) { return cdiv(N, PMMA_ROWS); }
// CTAs along x: row blocks x batch chunks, the chunks of a row block adjacent.
UW_PLAN_HD int64_t pmma_grid_x(int64_t N, int M, bool wg = false) { return pmma_row_blocks(N) * pmma_chunks(M, wg); }
// K splits for an [N, K] weight at batch M on a device with num_sms SMs: enough CTAs for
// PMMA_CTAS_PER_SM (wg: PMMA_WG_CTAS_PER_SM) per SM, each split at least PMMA_MIN_SPLIT_TILES tiles (a short split
// spends its time filling the pipeline), no empty split.  It depends on M only through the
// batch chunks (their CTAs fill the SMs too, and past 64 rows the partials would outweigh W),
// so results are the same bits at every batch size of 1..64 (and within each chunk count).
UW_PLAN_HD int64_t pmma_splits(int64_t N, int64_t K, int64_t num_sms, int M, bool wg = false) {
  const int64_t n_kt = K / PMMA_TILE_K, units = pmma_row_blocks(N) * pmma_chunks(M, wg);
  if (n_kt < 1 || units < 1) return 1;
  int64_t s = (num_sms * (wg ? PMMA_WG_CTAS_PER_SM : PMMA_CTAS_PER_SM) + units / 2) / units;
  const int64_t most = n_kt / PMMA_MIN_SPLIT_TILES;
  s = s < most ? s : most;
  s = s < PMMA_MAX_SPLITS ? s : PMMA_MAX_SPLITS;
  if (s < 1) return 1;
  return cdiv(n_kt, cdiv(n_kt, s));
}
// K tiles per split (the last split may hold fewer).
UW_PLAN_HD int64_t pmma_split_tiles(int64_t K, int64_t splits) { return cdiv(K / PMMA_TILE_K, splits); }
// fp32 partial sums [splits, M, N] (none without a split) and arrival counters: one per CTA
// column (row block x chunk), counted for the largest batch.
UW_PLAN_HD int64_t pmma_workspace_elems(int64_t M, int64_t N, int64_t splits) { return splits > 1 ? splits * M * N : 0; }
UW_PLAN_HD int64_t pmma_counters(int64_t N) { return pmma_grid_x(N, PMMA_MAX_M); }
// The wgmma variant's x as stage images (palette_matmul.cuh pmma_wg_x_body): bf16, K columns of
// pmma_wg_x_rows(M) rows (the batch chunks' rows, those past M zeros), in the workspace after the
// partial sums from a 16-byte boundary, fp32 element pmma_wg_x_at.
UW_PLAN_HD int64_t pmma_wg_x_rows(int M) {
  return static_cast<int64_t>(pmma_chunks(M, true)) * 8 * pmma_ntiles(M, true);
}
UW_PLAN_HD int64_t pmma_wg_x_at(int64_t M, int64_t N, int64_t splits) {
  return (pmma_workspace_elems(M, N, splits) + 3) / 4 * 4;
}
// fp32 workspace elements a launch needs: the partials, and for wgmma its x after them.
UW_PLAN_HD int64_t pmma_workspace_need(int64_t M, int64_t N, int64_t K, int64_t splits, bool wg = false) {
  return wg ? pmma_wg_x_at(M, N, splits) + pmma_wg_x_rows(static_cast<int>(M)) * K / 2
            : pmma_workspace_elems(M, N, splits);
}
// Threads per CTA of the wgmma variant's x reorder (one row of one 64-column tile each).
constexpr int PMMA_WG_X_THREADS = 256;
// The most workspace any batch 1..PMMA_MAX_M needs, either variant (the largest batch of each
// chunk count).
UW_PLAN_HD int64_t pmma_workspace_max(int64_t N, int64_t K, int64_t num_sms) {
  int64_t most = 0;
  for (int wg = 0; wg < 2; ++wg)
    for (int M = pmma_chunk_m(wg != 0); M <= PMMA_MAX_M; M += pmma_chunk_m(wg != 0)) {
      const int64_t e = pmma_workspace_need(M, N, K, pmma_splits(N, K, num_sms, M, wg != 0), wg != 0);
      most = e > most ? e : most;
    }
  return most;
}

// --- palette GEMV ----------------------------------------------------------------------
// Warps per row: the largest power of two (<= PGEMV_MAX_PARTS) that keeps N * parts within
// what the SMs hold at once and leaves each part at least two PGEMV_UNROLL batches of steps;
// 1 when the rows alone fill the device.  The same for every batch size, so are the bits.
// The rule of both GEMVs: `units` rows or tiles of `steps` steps each, at most `warps` warps
// resident, each part at least `min_steps` steps.
UW_PLAN_HD int pgemv_parts_of(int64_t units, int64_t steps, int64_t warps, int64_t min_steps) {
  int p = 1;
  while (2 * p <= PGEMV_MAX_PARTS && units * 2 * p <= warps && steps >= 2 * p * min_steps) p *= 2;
  return p;
}
UW_PLAN_HD int pgemv_parts(int64_t N, int64_t K, int64_t num_sms) {
  return pgemv_parts_of(N, cdiv(K, PGEMV_COLS), num_sms * PGEMV_WARPS_PER_SM, 2 * PGEMV_UNROLL);
}
UW_PLAN_HD int64_t pgemv_grid(int64_t N, int parts) { return cdiv(N * parts, PGEMV_WARPS); }
// Whether `parts` is 1, 2, 4 or 8: the counts whose warps split a CTA of PGEMV_WARPS into
// whole rows or tiles (every variant takes them; the tensor-core GEMV takes 3, 5, 6 and 7 too,
// one tile per CTA of `parts` warps: pgemv_mma_cta_warps).
UW_PLAN_HD constexpr bool pgemv_parts_pow2(int parts) {
  return parts >= 1 && parts <= PGEMV_MAX_PARTS && (parts & (parts - 1)) == 0;
}
// log2 of a power-of-two `parts`: the GEMV divides by such a count with shifts, where a
// division by a runtime value would cost each warp ~20-40 instructions of its setup.
UW_PLAN_HD int pgemv_log2_parts(int parts) { return (parts > 1) + (parts > 2) + (parts > 4); }
// [first, last) of a row's `steps` steps that part `part` covers at `per` steps a part (the
// last what is left; parts past the steps empty).
UW_PLAN_HD void pgemv_part_range(int64_t steps, int64_t per, int part, int64_t* first, int64_t* last) {
  *first = part * per < steps ? part * per : steps;
  *last = *first + per < steps ? *first + per : steps;
}
// Steps of part `part` of a power-of-two `parts` (the CUDA-core GEMV's): [first, last) of the
// row's cdiv(K, cols) steps, cdiv(steps, parts) each.
UW_PLAN_HD void pgemv_steps_of(int64_t K, int64_t cols, int parts, int part, int64_t* first, int64_t* last) {
  const int64_t steps = cdiv(K, cols);
  pgemv_part_range(steps, (steps + parts - 1) >> pgemv_log2_parts(parts), part, first, last);
}
UW_PLAN_HD void pgemv_steps(int64_t K, int parts, int part, int64_t* first, int64_t* last) {
  pgemv_steps_of(K, PGEMV_COLS, parts, part, first, last);
}

// The tensor-core variant: tiles of PGEMV_MMA_ROWS rows; warps per tile the largest power of
// two (<= PGEMV_MAX_PARTS) keeping tiles * parts within the warps the SMs hold at once and
// each part at least PGEMV_MMA_MIN_STEPS steps.  Llama-3-8B's shapes on 132 SMs: 4096 x 4096
// 8 parts (2,048 warps of 4 steps), 6144 x 4096 4, 14336 x 4096 2, 4096 x 14336 8,
// 128256 x 4096 1.  The same for every batch size, so are the bits.  The rule of the variants
// whose CTAs hold per-warp rings sized for PGEMV_WARPS warps (staged, bulk copies).
UW_PLAN_HD int pgemv_mma_parts(int64_t N, int64_t K, int64_t num_sms) {
  return pgemv_parts_of(cdiv(N, PGEMV_MMA_ROWS), cdiv(K, PGEMV_MMA_COLS), num_sms * PGEMV_MMA_WARPS_PER_SM,
                        PGEMV_MMA_MIN_STEPS);
}
// Warps of a tensor-core GEMV CTA at `parts` warps per tile: PGEMV_WARPS (PGEMV_WARPS / parts
// tiles) at a power of two, else `parts` (one tile).  And the warps an SM holds of such CTAs at
// the kernels' register cap (__launch_bounds__: PGEMV_MMA_CTAS_PER_SM CTAs of PGEMV_WARPS):
// 16 at 1, 2, 4 and 8 parts; 15 at 3 and 5 (five and three CTAs), 12 at 6, 14 at 7.
UW_PLAN_HD int pgemv_mma_cta_warps(int parts) { return pgemv_parts_pow2(parts) ? PGEMV_WARPS : parts; }
UW_PLAN_HD int pgemv_mma_sm_warps(int parts) {
  const int w = pgemv_mma_cta_warps(parts);
  return PGEMV_MMA_WARPS_PER_SM / w * w;
}
// Warps per tile of the register-direct tensor-core GEMV (and its split-plane and prefetching
// forms, the probes and the slots GEMV): the largest count in 1 .. PGEMV_MAX_PARTS whose warps
// the SMs hold in one wave (pgemv_mma_sm_warps) with each part at least PGEMV_MMA_MIN_STEPS
// steps.  Where a power of two leaves SMs idle it takes 3, 5, 6 or 7: 6144 x 4096 on 132 SMs
// takes 5 (1,920 warps of 6-7 steps in 384 CTAs, three on most SMs) where pgemv_mma_parts'
// 4 leaves 1,536 warps in 192 CTAs of eight, two CTAs on 60 SMs and one on the other 72.
// The H200 records fit the kernel's time to a fixed cost plus its bytes over a bandwidth
// that scales with that fill (docs/design/gpu-kernels.md, "Parts").  The other Llama-3-8B
// shapes keep their power of two.  The same for every batch size, so are the bits.
UW_PLAN_HD int pgemv_mma_parts_any(int64_t N, int64_t K, int64_t num_sms) {
  const int64_t tiles = cdiv(N, PGEMV_MMA_ROWS), steps = cdiv(K, PGEMV_MMA_COLS);
  int best = 1;
  for (int p = 2; p <= PGEMV_MAX_PARTS; ++p)
    if (tiles * p <= num_sms * pgemv_mma_sm_warps(p) && steps >= p * PGEMV_MMA_MIN_STEPS) best = p;
  return best;
}
UW_PLAN_HD int64_t pgemv_mma_grid(int64_t N, int parts) {
  return pgemv_parts_pow2(parts) ? cdiv(cdiv(N, PGEMV_MMA_ROWS) * parts, PGEMV_WARPS) : cdiv(N, PGEMV_MMA_ROWS);
}
// The tensor-core GEMV's steps a part at any parts 1 .. PGEMV_MAX_PARTS, cdiv(steps, parts):
// computed by the launcher (PgemvArgs::part_steps), so no warp divides by a runtime value
// (~20-40 instructions of its setup); and the steps [first, last) of its part `part`.
UW_PLAN_HD int64_t pgemv_mma_part_steps(int64_t K, int parts) { return cdiv(cdiv(K, PGEMV_MMA_COLS), parts); }
UW_PLAN_HD void pgemv_mma_steps(int64_t K, int parts, int part, int64_t* first, int64_t* last) {
  pgemv_part_range(cdiv(K, PGEMV_MMA_COLS), pgemv_mma_part_steps(K, parts), part, first, last);
}
// The queued variant: units per tile (PGEMV_MMA_QUEUE_* above), the steps [first, last) of unit
// `part` of a tile (cdiv(steps, units) each, the last what is left: at a power-of-two count the
// register-direct variant's parts), its grid (CTAs of PGEMV_WARPS warps, at most `ctas_per_sm`
// per SM and no more than the units need), its workspace (fp32) and its counters (int32).
UW_PLAN_HD int pgemv_mma_queue_units(int64_t N, int64_t K, int64_t num_sms) {
  const int64_t tiles = cdiv(N, PGEMV_MMA_ROWS), steps = cdiv(K, PGEMV_MMA_COLS);
  int64_t most = steps / PGEMV_MMA_QUEUE_MIN_STEPS;
  if (most > PGEMV_MMA_QUEUE_MAX_UNITS) most = PGEMV_MMA_QUEUE_MAX_UNITS;
  if (most < 1) most = 1;
  int64_t p = cdiv(PGEMV_MMA_QUEUE_UNITS_PER_WARP * num_sms * PGEMV_MMA_WARPS_PER_SM, tiles);
  if (p > most) p = most;
  if (p < 1) p = 1;
  int64_t per = cdiv(steps, p);
  if ((per & 1) != 0 && per < steps) per += 1;  // even units: no buffer swap between them
  return static_cast<int>(cdiv(steps, per));
}
UW_PLAN_HD void pgemv_mma_unit_steps(int64_t K, int units, int part, int64_t* first, int64_t* last) {
  const int64_t steps = cdiv(K, PGEMV_MMA_COLS);
  pgemv_part_range(steps, cdiv(steps, units), part, first, last);
}
UW_PLAN_HD int64_t pgemv_mma_queue_grid(int64_t N, int units, int64_t num_sms, int ctas_per_sm) {
  const int64_t need = cdiv(cdiv(N, PGEMV_MMA_ROWS) * units, PGEMV_WARPS), most = num_sms * ctas_per_sm;
  return need < most ? need : most;
}
UW_PLAN_HD constexpr int pgemv_mma_queue_ctas_per_sm(int M) { return M > 16 ? PGEMV_MMA4_CTAS_PER_SM : PGEMV_MMA_CTAS_PER_SM; }
UW_PLAN_HD int64_t pgemv_mma_queue_workspace(int64_t N, int units, int M) {
  return units > 1 ? cdiv(N, PGEMV_MMA_ROWS) * units * M * PGEMV_MMA_ROWS : 0;
}
UW_PLAN_HD int64_t pgemv_mma_queue_counters(int64_t N) { return PGEMV_QUEUE_TILES + cdiv(N, PGEMV_MMA_ROWS); }
// Per variant (a resolved PGEMV_VARIANT_*, not DEFAULT): whether it is a tensor-core one, the
// most batch rows, the warps per row or tile, and the grid.
UW_PLAN_HD constexpr bool pgemv_is_mma(int variant) {
  return variant == PGEMV_VARIANT_MMA || variant == PGEMV_VARIANT_MMA_STAGED || variant == PGEMV_VARIANT_MMA_PREFETCH ||
         variant == PGEMV_VARIANT_MMA_BULK || variant == PGEMV_VARIANT_MMA_QUEUE || variant == PGEMV_VARIANT_MMA_SPLIT;
}
UW_PLAN_HD int pgemv_max_m(int variant) { return pgemv_is_mma(variant) ? PGEMV_MMA_MAX_M : PGEMV_MAX_M; }
// Whether a variant takes any parts 1 .. PGEMV_MAX_PARTS (pgemv_mma_parts_any), not only a
// power of two: the tensor-core ones whose shared memory is the parts' sums alone.
UW_PLAN_HD constexpr bool pgemv_any_parts(int variant) {
  return variant == PGEMV_VARIANT_MMA || variant == PGEMV_VARIANT_MMA_PREFETCH || variant == PGEMV_VARIANT_MMA_SPLIT;
}
UW_PLAN_HD int pgemv_variant_parts(int64_t N, int64_t K, int64_t num_sms, int variant) {
  return variant == PGEMV_VARIANT_MMA_QUEUE ? pgemv_mma_queue_units(N, K, num_sms)
         : pgemv_any_parts(variant)         ? pgemv_mma_parts_any(N, K, num_sms)
         : pgemv_is_mma(variant)            ? pgemv_mma_parts(N, K, num_sms)
                                            : pgemv_parts(N, K, num_sms);
}
UW_PLAN_HD int64_t pgemv_variant_grid(int64_t N, int parts, int variant) {
  return pgemv_is_mma(variant) ? pgemv_mma_grid(N, parts) : pgemv_grid(N, parts);
}

}  // namespace plan
}  // namespace unweight
