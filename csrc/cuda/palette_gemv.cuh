// Palette GEMV for batches of 1..PGEMV_MAX_M on CUDA cores: the argument block and the CTA
// body, written once over the thread context of emu/ctx.cuh (palette_gemv.cu runs it as the
// kernel and through the warp emulator).  Design: docs/design/gpu-kernels.md, "Palette GEMV".
//
// At batch 1 the weight stream is the whole cost.  The tensor-core GEMM (palette_matmul.cuh)
// stages each warp's 16-row tile through shared memory and reads each row in 64-byte pieces;
// this kernel instead gives one warp one row (or one K part of it) and reads it front to back
// straight into registers: per step of PGEMV_COLS columns, lane L loads the 16 sign+mantissa
// bytes of columns 16L..16L+15 (the warp: 512 contiguous bytes, four whole lines) and their
// 8 index bytes (256 contiguous bytes).  Decode is pal_regs.cuh's register-table decode;
// products are fp32 FMAs, one per weight and batch row, in column order per lane, then a
// butterfly over the lanes and the parts in order: deterministic, the same bits at every
// batch size.
#pragma once
#include "palette_matmul.cuh"  // PalProduct, warp_lower_bound, set_exponents

namespace unweight {
namespace cuda {
namespace detail {

struct PgemvArgs : PalProduct {
  int parts;   // warps per row (plan::pgemv_parts: 1, 2, 4 or 8) or tile (the tensor-core
               // variants: plan::pgemv_variant_parts, 1 .. 8); the queued variant: units per tile
  int lparts;  // log2(parts); log2(PGEMV_WARPS) when parts is no power of two (the tensor-core
               // variants: one tile per CTA of `parts` warps); not the queued variant's
  int64_t part_steps;  // the tensor-core variants' steps a part (plan::pgemv_mma_part_steps)
  int cta_warps;       // warps per CTA (plan::pgemv_mma_cta_warps; the launcher's, not the kernel's)
  // The queued variant (pgemv_mma_queue_body) only: its units (tiles * parts), their sums
  // (fp32 [units][M][PGEMV_MMA_ROWS] when parts > 1) and its counters (plan::PGEMV_QUEUE_*,
  // zero before a launch and after it).
  int64_t units;
  float* ws;
  int32_t* queue;
  int x_prefetch;  // the tensor-core variants: nonzero, x's lines asked into L1 ahead (x_ahead)
};

// The staged variants' stream: a per-warp ring of D slots in shared memory, filled by cp.async
// with one commit group per step.  Before step q, the slot step q - 1 used is refilled with step
// q + D - 1 (issue(step, slot), which commits a group even past the part's end, so that
// wait<D - 1> always means "step q has landed"); then use(q, slot) reads slot q % D.  A
// syncwarp before each refill (every lane has read the slot) and after each wait (the other
// lanes' copies have landed too).  Unrolled over the ring so that every slot offset is a
// constant.
template <int D, class Ctx, class Issue, class Use>
UW_HD void ring_steps(Ctx& c, int nq, Issue&& issue, Use&& use) {
  for (int q0 = 0; q0 < nq; q0 += D) {
UW_UNROLL()
    for (int j = 0; j < D; ++j) {
      const int q = q0 + j;
      if (q >= nq) break;  // warp-uniform: the part's last steps
      c.syncwarp();
      issue(q + D - 1, (j + D - 1) % D);
      c.template cp_async_wait<D - 1>();
      c.syncwarp();
      use(q, j);
    }
  }
}

// One CTA: PGEMV_WARPS / parts rows, `parts` warps each.  MB: batch rows the registers hold
// (M <= MB); kPaired: the palette decode (pal_regs.cuh); U: steps per batch of loads
// (PGEMV_UNROLL, or PGEMV_DEEP_UNROLL for the deep variant; the order of the sums is the same).
// kStaged: the staged variant, whose loads land in a per-warp shared-memory ring of
// PGEMV_STAGED_DEPTH steps through cp.async instead of in registers (U unused); the steps, the
// decode and the sums are the same code in the same order, so are the bits.
template <int MB, bool kPaired, int U, bool kStaged, class Ctx>
UW_HD void pgemv_body(Ctx& c, const PgemvArgs& a) {
  constexpr int COLS = plan::PGEMV_COLS;
  const int lane = c.lane(), warp = c.warp();
  const int64_t r = c.block_x() * (plan::PGEMV_WARPS >> a.lparts) + (warp >> a.lparts);
  const int part = warp & (a.parts - 1);
  int64_t s0 = 0, s1 = 0;
  plan::pgemv_steps(a.K, a.parts, part, &s0, &s1);
  const bool active = r < a.N && s1 > s0;  // warp-uniform
  float acc[MB];
UW_UNROLL()
  for (int m = 0; m < MB; ++m) acc[m] = 0.f;

  if (active) {
    // This lane's columns of the part's first step, then one step (COLS columns) per q.  Its
    // 16 columns exist in steps q < lim (the row's last step may end inside the warp).
    const int64_t c0 = s0 * COLS + 16 * lane;
    const uint8_t* sp = a.sm + a.sm_at(r, c0);
    const uint8_t* ip = a.idx + a.idx_at(r, c0);
    // A step's advance (32-bit: a few KB; the file-order kernel's were immediates).
    const int dq_sm = static_cast<int>(a.sm_cols(COLS)), dq_ix = static_cast<int>(a.idx_cols(COLS));
    const uint16_t* xp = a.x + c0;
    const int nq = static_cast<int>(s1 - s0);
    const int64_t lane_steps = (a.K - 16 * lane + COLS - 1) / COLS - s0;  // steps whose columns exist
    const int lim = static_cast<int>(lane_steps < nq ? (lane_steps > 0 ? lane_steps : 0) : nq);
    const int nb = (nq + U - 1) / U;  // batches of U steps
    // Lane's loads of batch b: U steps of 16 + 8 bytes (zeros where its columns do not exist).
    auto load = [&](int b, uint32_t (&s)[U][4], uint32_t (&n)[U][2]) {
UW_UNROLL()
      for (int u = 0; u < U; ++u) {
        const int q = b * U + u;
        if (q < lim) {
          ld_stream_v4(sp + q * dq_sm, s[u]);
          ld_stream_v2(ip + q * dq_ix, n[u][0], n[u][1]);
        } else {
          s[u][0] = s[u][1] = s[u][2] = s[u][3] = 0u;
          n[u][0] = n[u][1] = 0u;
        }
      }
    };
    // The staged feed: step q's 512 sign+mantissa bytes (lane L copies its own 16) and 256
    // index bytes (lane L < 16 copies those of lanes 2L, 2L + 1: K % 64 == 0 makes both exist
    // or neither) go to slot q % PGEMV_STAGED_DEPTH of the warp's ring, one cp.async group per
    // step (empty past the part's end, so wait<DEPTH - 1> always means "step q has landed").
    // Columns that do not exist are zero-filled from a valid address.
    // Lane 2L's step count decides lane L's index copy (lanes 2L and 2L + 1 exist together).
    const int lim_pair = kStaged ? c.shfl(lim, (2 * lane) & (emu::kWarpSize - 1)) : 0;
    const uint8_t* ipw = kStaged && lane < 16 ? a.idx + a.idx_at(r, s0 * COLS + 32 * lane) : a.idx;
    constexpr int D = plan::PGEMV_STAGED_DEPTH;
    unsigned char* ring = c.smem() + plan::PGEMV_SMEM_BYTES + static_cast<int64_t>(warp) * D * plan::PGEMV_STAGED_SLOT;
    auto issue = [&](int q, int slot) {  // slot == q % D, a constant where the loop is unrolled
      if (q < nq) {
        unsigned char* st = ring + slot * plan::PGEMV_STAGED_SLOT;
        const bool mine = q < lim;
        c.cp_async16(st + 16 * lane, mine ? sp + q * dq_sm : a.sm, mine ? 16 : 0);
        if (lane < 16) {
          const bool pair = q < lim_pair;
          c.cp_async16(st + COLS + 16 * lane, pair ? ipw + q * dq_ix : a.idx, pair ? 16 : 0);
        }
      }
      c.cp_async_commit();
    };
    uint32_t sa[kStaged ? 1 : U][4], na[kStaged ? 1 : U][2], sb[kStaged ? 1 : U][4], nbb[kStaged ? 1 : U][2];
    if constexpr (kStaged) {
UW_UNROLL()
      for (int q = 0; q < D - 1; ++q) issue(q, q);  // in flight while the verbatim cursor is found
    } else {
      // Both buffers' loads go out before the verbatim search (up to three dependent L2 reads),
      // which would otherwise hold the second batch back until it returns.
      load(0, sa, na);
      if (nb > 1) load(1, sb, nbb);
    }

    // Verbatim blocks of this part of the row: a warp-uniform cursor into vpos, from the row
    // index (a.vrow) or a search of the list; `rel` is the next entry's block within the row
    // (0xFFFFFFFF: none left).  Step q covers blocks
    // 16 (s0 + q) .. + 15, lane L's 16 columns being half (L & 1) of the step's block L / 2.
    const uint64_t bpr = static_cast<uint64_t>(a.K / PAL_BLOCK), rowbase = static_cast<uint64_t>(r) * bpr;
    const uint64_t b_end = rowbase + (s1 * COLS < a.K ? s1 * COLS / PAL_BLOCK : bpr);
    int64_t cur = a.nv;
    uint32_t rel = 0xFFFFFFFFu;
    if (a.nv > 0) {
      const uint64_t key = rowbase + static_cast<uint64_t>(s0) * (COLS / PAL_BLOCK);
      if (a.vrow != nullptr) {  // the row's entries from the row index: no search of the whole list
        int64_t lo = 0, hi = 0;
        vrow_bounds(a.vrow, r, a.nv, &lo, &hi);
        cur = s0 == 0 ? lo : lo + lower_bound_u32(a.vpos + lo, hi - lo, key);
      } else {
        cur = warp_lower_bound(c, a.vpos, a.nv, key);
      }
      if (cur < a.nv && a.vpos[cur] < b_end) rel = static_cast<uint32_t>(a.vpos[cur] - rowbase);
      // (and at each move of the cursor up to two batch rows: at four it spills under this
      // kernel's 80-register cap, ptxas sm_90a)
      pmma_cursor_prefetch(a, static_cast<uint32_t>(cur), rel);
    }
    const uint32_t blk_first = static_cast<uint32_t>(s0) * (COLS / PAL_BLOCK);

    // (At four batch rows the default's 80- and the staged variant's 64-register caps would spill.)
    const PalTables pt = lane_tables<(MB <= 2 || (U == plan::PGEMV_DEEP_UNROLL && !kStaged))>(c, a.pt);
    // Step q of the part from its 16 sign+mantissa bytes s and 8 index bytes n of this lane.
    auto step = [&](int q, const uint32_t (&s)[4], const uint32_t (&n)[2]) {
        uint32_t w[8];  // BF16 pairs of the lane's columns 2j, 2j + 1
UW_UNROLL()
        for (int j = 0; j < 4; ++j) pal_decode4<kPaired>(s[j], n[j >> 1] >> (16 * (j & 1)), pt, w[2 * j],
                                                         w[2 * j + 1]);
        // Verbatim blocks of this step (rare): the two lanes holding a block patch its exponents.
        const uint32_t blk0 = blk_first + static_cast<uint32_t>(q) * (COLS / PAL_BLOCK);
        while (rel - blk0 < static_cast<uint32_t>(COLS / PAL_BLOCK)) {
          if (static_cast<uint32_t>(lane >> 1) == rel - blk0) {
            uint32_t e[4];
            // (through L1, where pmma_cursor_prefetch asked for the entry's line)
            ld_reuse_v4(reinterpret_cast<const uint16_t*>(a.vexp + cur * PAL_BLOCK + 16 * (lane & 1)), e);
UW_UNROLL()
            for (int j = 0; j < 8; ++j) {
              const uint32_t ej = e[j >> 1] >> (16 * (j & 1));
              w[j] = set_exponents(w[j], ej, ej >> 8);
            }
          }
          ++cur;
          rel = cur < a.nv && a.vpos[cur] < b_end ? static_cast<uint32_t>(a.vpos[cur] - rowbase) : 0xFFFFFFFFu;
          if constexpr (MB <= 2) pmma_cursor_prefetch(a, static_cast<uint32_t>(cur), rel);  // (see below)
        }
        if (q >= lim) return;  // this lane's columns do not exist (the loads gave zeros)
UW_UNROLL()
        for (int m = 0; m < MB; ++m) {
          if (m >= a.M) break;
          uint32_t x0[4], x1[4];  // x[m] at the lane's 16 columns: bf16 pairs, as w
          ld_reuse_v4(xp + m * a.ldx + q * COLS, x0);
          ld_reuse_v4(xp + m * a.ldx + q * COLS + 8, x1);
UW_UNROLL()
          for (int j = 0; j < 8; ++j) {
            const uint32_t xj = j < 4 ? x0[j] : x1[j - 4];
            acc[m] = fmaf(f32_from_bits(w[j] << 16), f32_from_bits(xj << 16), acc[m]);
            acc[m] = fmaf(f32_from_bits(w[j] & 0xFFFF0000u), f32_from_bits(xj & 0xFFFF0000u), acc[m]);
          }
        }
    };
    if constexpr (kStaged) {
      ring_steps<D>(c, nq, issue, [&](int q, int slot) {
        const unsigned char* st = ring + slot * plan::PGEMV_STAGED_SLOT;
        uint32_t s[4], n[2];
        c.lds_v4(st + 16 * lane, s);
        c.lds_v2(st + COLS + 8 * lane, n);
        step(q, s, n);
      });
    } else {
      auto compute = [&](int b, const uint32_t (&s)[U][4], const uint32_t (&n)[U][2]) {
UW_UNROLL()
        for (int u = 0; u < U; ++u) {
          const int q = b * U + u;
          if (q >= nq) break;  // warp-uniform: the part's last batch
          step(q, s[u], n[u]);
        }
      };
      // Batch b + 1 is in flight while batch b is used; a buffer is refilled (two batches
      // ahead) as soon as it has been used.
      for (int b = 0; b < nb; b += 2) {
        compute(b, sa, na);
        if (b + 2 < nb) load(b + 2, sa, na);
        if (b + 1 >= nb) break;
        compute(b + 1, sb, nbb);
        if (b + 3 < nb) load(b + 3, sb, nbb);
      }
    }
  }

  // Lanes -> one sum per batch row (a fixed butterfly), then the row's parts in part order.
UW_UNROLL()
  for (int m = 0; m < MB; ++m)
    for (int o = 16; o > 0; o >>= 1) acc[m] += c.shfl_xor(acc[m], o);
  const bool row_ok = r < a.N;
  if (a.parts == 1) {
    if (row_ok && lane == 0)
UW_UNROLL()
      for (int m = 0; m < MB; ++m)
        if (m < a.M) a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(acc[m]));
    return;
  }
  float* red = reinterpret_cast<float*>(c.smem());  // [PGEMV_WARPS][PGEMV_MAX_M]
  if (lane == 0)
UW_UNROLL()
    for (int m = 0; m < MB; ++m) c.sts(red + warp * plan::PGEMV_MAX_M + m, acc[m]);
  c.syncthreads();
  if (part == 0 && lane == 0 && row_ok) {
UW_UNROLL()
    for (int m = 0; m < MB; ++m) {
      if (m >= a.M) break;
      float sum = 0.f;
      for (int q = 0; q < a.parts; ++q) sum += c.lds(red + (warp + q) * plan::PGEMV_MAX_M + m);
      a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(sum));
    }
  }
}

// The tensor-core variant (PGEMV_VARIANT_MMA): one CTA holds PGEMV_WARPS / parts tiles of
// PGEMV_MMA_ROWS rows, `parts` warps each; at a parts count that is not a power of two
// (plan::pgemv_mma_parts_any) it holds one tile, its `parts` warps being the CTA.
// NT: n-tiles of 8 batch rows (M <= 8 NT).
//
// A step is PGEMV_MMA_COLS = 128 columns of the warp's 16 rows.  Lane (g = lane/4, t = lane%4)
// owns the step's columns 16t..16t+15 (half 0) and 64+16t..64+16t+15 (half 1) of rows g and
// g + 8: per half and row one 16-byte sign+mantissa load and one 8-byte index load, which over
// the warp cover 64 and 32 contiguous bytes of each of 8 rows (whole sectors); on tile-major
// planes (kernel_plan.h pal_offset) those 8 rows' runs are adjacent, 512 and 256 contiguous
// bytes, and a step is two consecutive tiles.  A half is then
// exactly a 64-column tile of the fused GEMM (palette_matmul.cuh): its mma j (0..3) contracts
// over columns 16t + 4j + {0,1,2,3} of every lane t, and its two 32-column verbatim blocks are
// held by lanes t = 0, 1 and t = 2, 3.  The loads of two steps are in flight while one is used;
// nothing goes through shared memory but the parts' sums.  Accumulation: per step, per half,
// per mma in order, then the parts in part order: deterministic, and a batch row's sums depend
// only on its own x row (the same bits at every batch size 1..PGEMV_MMA_MAX_M).
//
// kStaged (PGEMV_VARIANT_MMA_STAGED): the step's 3 KB land in a per-warp ring of
// PGEMV_MMA_STAGED_DEPTH slots in shared memory through cp.async instead of in registers, so
// DEPTH - 1 steps are in flight per warp at no register cost (the register-direct stream holds
// one to two steps in 48 registers).  A slot is the tile's 16 rows of 128 sign+mantissa bytes,
// then its 16 rows of 64 index bytes.  Copies: lane L takes 16-byte pieces L and L + 32k of
// each plane, so a warp's copy instruction covers 4 (sign+mantissa) or 8 (index) whole rows
// of the step, 128- or 64-byte runs.  Reads: lane (g, t) takes the pieces it would have
// loaded, one 16- and one 8-byte shared load per row and half.  The pieces sit XOR-swizzled
// by row (sign+mantissa piece ^ 4 on odd rows, index 8-byte piece ^ 4 on rows 2, 3 mod 4), so
// each quarter warp's 16-byte reads and each half warp's 8-byte reads fall in 32 distinct
// banks.  The steps, the decode, the mma and the sums are the register-direct variant's, in
// its order: the same bits.  The parts' sums go into each warp's own ring once it is drained.
//
// kPrefetch (PGEMV_VARIANT_MMA_PREFETCH, register-direct only): besides its loads, each step
// asks L2 for the bytes of the step PGEMV_MMA_PREFETCH_STEPS past the last one loaded (lane
// i < 16 row i's sign+mantissa bytes, lane 16 + i its index bytes; device_util.cuh's
// prefetch_l2), so those loads wait on L2 rather than DRAM and what the SM has asked of DRAM
// grows by that many steps at no register or shared-memory cost.  The loads, decode, mma and sums
// are the register-direct variant's: the same bits.
//
// kBulk (PGEMV_VARIANT_MMA_BULK, sm_90+, tile-major planes only): on tile-major planes a warp's
// part is one run of bytes in each plane, so the copy engine can fetch it: lane 0 asks for each
// step with two cp.async.bulk copies (its 2 KB of sign+mantissa bytes, its 1 KB of index bytes)
// into a per-warp ring of PGEMV_MMA_BULK_DEPTH slots, counted on one mbarrier per slot, and the
// lanes wait on the slot's barrier, read back what they would have loaded and go on as the
// register-direct variant does.  DEPTH - 1 steps in flight per warp at no register cost and two
// instructions per step to ask for them (the staged variant spends six cp.async per lane and
// their addresses); the slot holds the two tiles as stored, whose reads are conflict-free with
// no swizzle (a quarter warp's 16-byte reads cover one 128-byte run, a half warp's 8-byte reads
// another).  The same steps, decode, mma and sums in the same order: the same bits.
// A tensor-core GEMV step's advance in each plane: a step's and a half's (one run per row in
// file order; tile-major, a half is one 16-row tile, the next half the next tile).
struct PmmaSteps {
  int dq_sm, dh_sm, dq_ix, dh_ix;
};

// Step q's register-direct loads of lane (g, t): [row g, g + 8][half] 16 sign+mantissa bytes
// and 8 index bytes from the lane's bases sp / ip (the part's first step), zeros for the
// missing half of a half step (q == q_half).
UW_HD void pgemv_mma_load(const uint8_t* const (&sp)[2], const uint8_t* const (&ip)[2], const PmmaSteps& d, int q,
                          int q_half, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) {
UW_UNROLL()
  for (int h = 0; h < 2; ++h)
UW_UNROLL()
    for (int rr = 0; rr < 2; ++rr) {
      if (h == 0 || q != q_half) {
        ld_stream_v4(sp[rr] + q * d.dq_sm + h * d.dh_sm, s[rr][h]);
        ld_stream_v2(ip[rr] + q * d.dq_ix + h * d.dh_ix, n[rr][h][0], n[rr][h][1]);
      } else {
        s[rr][h][0] = s[rr][h][1] = s[rr][h][2] = s[rr][h][3] = 0u;
        n[rr][h][0] = n[rr][h][1] = 0u;
      }
    }
}

// Step q of a warp's 16-row tile, both halves (only the first at q == q_half): the loaded bytes
// s / n decoded into A fragments (pal_regs.cuh), the verbatim blocks patched in (b_first: the
// part's first block of a row; cur / rel: the cursors of pmma_tile_cursors), then per half
// four mma against x (xp[nt]: the lane's x row of n-tile nt at the part's first column),
// accumulated into acc in mma order.
// kProbe (plan::PGEMV_PROBE_*, palette_gemv_probe): NO_DECODE puts the loaded words in the A
// registers as they are (the index words XORed into half of them, so their loads stay live);
// NO_MMA decodes and patches, then folds the A registers into acc's bits instead of loading x
// and multiplying; STREAM folds the loaded words into acc's bits and does nothing else.  None
// is the product.
// kSplit: the planes are in the split layout (plan::PGEMV_VARIANT_MMA_SPLIT; pt from
// pal_split_tables), decoded by pal_decode4_split into the same A registers.
template <int NT, bool kPaired, int kProbe = plan::PGEMV_PROBE_NONE, bool kSplit = false, class Ctx>
UW_HD void pgemv_mma_step(Ctx& c, const PgemvArgs& a, const PalTables& pt, const uint16_t* const (&xp)[NT], int q,
                          int q_half, uint32_t b_first, uint64_t rowbase, uint64_t bpr, uint32_t& cur, uint32_t& rel,
                          const uint32_t (&s)[2][2][4], const uint32_t (&n)[2][2][2], float (&acc)[NT][4]) {
  constexpr int COLS = plan::PGEMV_MMA_COLS, HALF = COLS / 2;
UW_UNROLL()
  for (int h = 0; h < 2; ++h) {
    if (h == 1 && q == q_half) break;  // warp-uniform: the half step's missing half
    if constexpr (kProbe == plan::PGEMV_PROBE_STREAM) {
      uint32_t f = n[0][h][0] ^ n[0][h][1] ^ n[1][h][0] ^ n[1][h][1];
UW_UNROLL()
      for (int j = 0; j < 4; ++j) f ^= s[0][h][j] ^ s[1][h][j];
      acc[0][h] = f32_from_bits(bits_from_f32(acc[0][h]) ^ f);
    } else {
      uint32_t af[4][4];  // [mma][A register]: regs 0, 2 row g; 1, 3 row g + 8
UW_UNROLL()
      for (int j = 0; j < 4; ++j) {
        if constexpr (kProbe == plan::PGEMV_PROBE_NO_DECODE) {
          const uint32_t nn = n[0][h][j >> 1] ^ n[1][h][j >> 1];
          af[j][0] = s[0][h][j];
          af[j][1] = s[1][h][j];
          af[j][2] = s[0][h][j] ^ nn;
          af[j][3] = s[1][h][j] ^ nn;
        } else if constexpr (kSplit) {
          const int sh = 16 * (j & 1);
          pal_decode4_split(s[0][h][j], n[0][h][j >> 1] >> sh, pt, af[j][0], af[j][2]);
          pal_decode4_split(s[1][h][j], n[1][h][j >> 1] >> sh, pt, af[j][1], af[j][3]);
        } else {
          const int sh = 16 * (j & 1);
          pal_decode4<kPaired>(s[0][h][j], n[0][h][j >> 1] >> sh, pt, af[j][0], af[j][2]);
          pal_decode4<kPaired>(s[1][h][j], n[1][h][j >> 1] >> sh, pt, af[j][1], af[j][3]);
        }
      }
      if (a.nv > 0) {  // rare: a row of the tile has a verbatim block in this half
        const uint32_t kb = b_first + static_cast<uint32_t>(q) * (COLS / PAL_BLOCK) + 2 * h;
        pmma_patch_tile(c, a, kb, rowbase, bpr, cur, rel, af);
      }
      if constexpr (kProbe == plan::PGEMV_PROBE_NO_MMA) {
        uint32_t f = 0;
UW_UNROLL()
        for (int j = 0; j < 4; ++j) f ^= af[j][0] ^ af[j][1] ^ af[j][2] ^ af[j][3];
        acc[0][h] = f32_from_bits(bits_from_f32(acc[0][h]) ^ f);
      } else {
        // x[nt*8+g] at 8 of the lane's columns (bf16 pairs): the B registers of mma 2jp, 2jp + 1,
        // loaded just before them (L1 hits mostly), so at most 4 NT registers hold x.
        const int64_t off = static_cast<int64_t>(q) * COLS + h * HALF;
UW_UNROLL()
        for (int jp = 0; jp < 2; ++jp) {
          uint32_t xb[NT][4];
UW_UNROLL()
          for (int nt = 0; nt < NT; ++nt) ld_reuse_v4(xp[nt] + off + 8 * jp, xb[nt]);
UW_UNROLL()
          for (int j = 2 * jp; j < 2 * jp + 2; ++j)
UW_UNROLL()
            for (int nt = 0; nt < NT; ++nt) {
              const uint32_t b[2] = {xb[nt][2 * (j & 1)], xb[nt][2 * (j & 1) + 1]};
              c.mma_bf16_16816(acc[nt], af[j], b, acc[nt]);
            }
        }
      }
    }
  }
}

// x's lines of a step asked into L1 (prefetch.global.L1: no register held for the data), two
// steps before the step's mma need them.  A step's x loads (ld_reuse_v4) sit just before its
// mma, whose inputs they are, so without it the warp waits there on L2 each time its part
// moves on to x's next line (in a layer split into parts, every warp at every step: its slice
// of x is its own).  xp: the lane's x rows at the part's first column, as the step reads them
// (pmma_x_row: rows past M read row M - 1).  Lanes t == 0 ask for half 0 of their rows' steps,
// t == 1 for half 1 (128 bytes each: one line where x's rows start on 128-byte lines), up to
// x_ahead_steps: t == 1 not at a half step, whose second half lies past the row.  Only after
// the grid-dependency wait: x is what the launch ahead may still be writing, and a line in L1
// would outlive the wait.
UW_HD int x_ahead_steps(int t, int nq, int q_half, bool on) { return !on || t > 1 ? 0 : t == 0 ? nq : q_half; }
// Step q (counted from xp's column) when `ask` (x_ahead_steps says which steps a lane asks for).
template <int NT>
UW_HD void x_ahead(const uint16_t* const (&xp)[NT], int t, int q, bool ask) {
  const int64_t off = int64_t{q} * plan::PGEMV_MMA_COLS + (t & 1) * (plan::PGEMV_MMA_COLS / 2);
UW_UNROLL()
  for (int nt = 0; nt < NT; ++nt)
    if (ask) prefetch_line<true>(xp[nt] + off);
}

template <int NT, bool kPaired, bool kStaged, bool kPrefetch, bool kBulk, int kProbe = plan::PGEMV_PROBE_NONE,
          bool kSplit = false, class Ctx>
UW_HD void pgemv_mma_body(Ctx& c, const PgemvArgs& a) {
  constexpr int COLS = plan::PGEMV_MMA_COLS, HALF = COLS / 2, ROWS = plan::PGEMV_MMA_ROWS;
  static_assert(kProbe == plan::PGEMV_PROBE_NONE || (!kStaged && !kPrefetch && !kBulk),
                "the timing probes are of the register-direct variant");
  static_assert(ROWS == plan::PMMA_TILE_N, "a tile is the fused GEMM's (its verbatim cursors and patch)");
  // A launch that may start before the one ahead of it on the stream ends (programmatic
  // dependent launch, sm_90+) streams its planes and verbatim lists, which no launch writes,
  // and waits only before it reads x or writes y; it lets the next launch start once it has
  // waited (then every launch ahead of this one is complete, so the next one's early reads
  // of its own planes can race with nothing but this launch, which writes only y).
  const int lane = c.lane(), warp = c.warp(), g = lane >> 2, t = lane & 3;
  // (a parts count that is no power of two: lparts = log2(PGEMV_WARPS), so tile = block_x and
  // part = warp, the CTA being the tile's `parts` warps)
  const int64_t tile = c.block_x() * (plan::PGEMV_WARPS >> a.lparts) + (warp >> a.lparts);
  const int64_t row0 = tile * ROWS;
  const int part = warp & ((1 << a.lparts) - 1);
  int64_t s0 = 0, s1 = 0;
  plan::pgemv_part_range(plan::cdiv(a.K, COLS), a.part_steps, part, &s0, &s1);  // (plan::pgemv_mma_steps)
  const bool active = row0 < a.N && s1 > s0;  // warp-uniform
  float acc[NT][4];
UW_UNROLL()
  for (int nt = 0; nt < NT; ++nt)
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  if (active) {
    const int nq = static_cast<int>(s1 - s0);
    // K % 128 == 64: the row's last step has only its first half (warp-uniform).
    const int q_half = a.K % COLS != 0 && s1 * COLS > a.K ? nq - 1 : nq;
    // Rows past N (the last tile) read row N - 1 again: valid memory, results never stored.
    const int64_t last = a.N - 1;
    const int64_t r_lo = row0 + g < last ? row0 + g : last, r_hi = row0 + g + 8 < last ? row0 + g + 8 : last;
    const int64_t c0 = s0 * COLS + 16 * t;
    const uint8_t* const sp[2] = {a.sm + a.sm_at(r_lo, c0), a.sm + a.sm_at(r_hi, c0)};
    const uint8_t* const ip[2] = {a.idx + a.idx_at(r_lo, c0), a.idx + a.idx_at(r_hi, c0)};
    // A step's and a half's advance in each plane (one run per row in file order; tile-major,
    // a half is one 16-row tile, the next half the next tile).
    const int dq_sm = static_cast<int>(a.sm_cols(COLS)), dh_sm = static_cast<int>(a.sm_cols(HALF));
    const int dq_ix = static_cast<int>(a.idx_cols(COLS)), dh_ix = static_cast<int>(a.idx_cols(HALF));
    // Step q's loads: [row g, g + 8][half] 16 sign+mantissa bytes and 8 index bytes (zeros for
    // the missing half of a half step).
    const PmmaSteps d{dq_sm, dh_sm, dq_ix, dh_ix};
    auto load = [&](int q, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) { pgemv_mma_load(sp, ip, d, q, q_half, s, n); };
    // The staged feed (kStaged): step q's copies into ring slot `slot` (== q % D), one
    // cp.async group per step, empty past the part's end (so wait<D - 1> always means "step q
    // has landed").  The missing half of a half step is zero-filled from a valid address.
    constexpr int D = plan::PGEMV_MMA_STAGED_DEPTH, SLOT = plan::PGEMV_MMA_STAGED_SLOT;
    constexpr int SM_ROW = COLS, IDX_ROW = COLS / 2, IDX_AT = ROWS * SM_ROW;
    unsigned char* const ring = c.smem() + static_cast<int64_t>(warp) * D * SLOT;
    // This lane's copy pieces: sign+mantissa rows lane/8 + 4k (k < 4), piece lane % 8; index
    // rows lane/4 + 8k (k < 2), piece lane % 4; their sources (rows past N: row N - 1) and
    // swizzled destinations within a slot.
    const int cp_piece = lane & 7, ci_piece = lane & 3;
    const uint8_t* csp[kStaged ? 4 : 1];
    const uint8_t* cip[kStaged ? 2 : 1];
    int cs_dst[kStaged ? 4 : 1], ci_dst[kStaged ? 2 : 1];
    if constexpr (kStaged) {
UW_UNROLL()
      for (int k = 0; k < 4; ++k) {
        const int rt = (lane >> 3) + 4 * k;
        const int64_t r = row0 + rt < last ? row0 + rt : last;
        csp[k] = a.sm + a.sm_at(r, s0 * COLS + 16 * cp_piece);
        cs_dst[k] = rt * SM_ROW + 16 * (cp_piece ^ ((rt & 1) << 2));
      }
UW_UNROLL()
      for (int k = 0; k < 2; ++k) {
        const int rt = (lane >> 2) + 8 * k;
        const int64_t r = row0 + rt < last ? row0 + rt : last;
        cip[k] = a.idx + a.idx_at(r, s0 * COLS + 32 * ci_piece);
        ci_dst[k] = IDX_AT + rt * IDX_ROW + 16 * (ci_piece ^ (((rt >> 1) & 1) << 1));
      }
    }
    auto issue = [&](int q, int slot) {
      if (q < nq) {
        unsigned char* st = ring + slot * SLOT;
        const bool sm_ok = q != q_half || cp_piece < 4, idx_ok = q != q_half || ci_piece < 2;
UW_UNROLL()
        for (int k = 0; k < 4; ++k)
          c.cp_async16(st + cs_dst[k], sm_ok ? csp[k] + q * dq_sm : a.sm, sm_ok ? 16 : 0);
UW_UNROLL()
        for (int k = 0; k < 2; ++k)
          c.cp_async16(st + ci_dst[k], idx_ok ? cip[k] + q * dq_ix : a.idx, idx_ok ? 16 : 0);
      }
      c.cp_async_commit();
    };
    // Lane (g, t)'s reads of a slot: rows g and g + 8 (the swizzle depends on g alone).
    const int rd_sm = g * SM_ROW, rd_idx = IDX_AT + g * IDX_ROW;
    const int sw_sm = (g & 1) << 2, sw_idx = ((g >> 1) & 1) << 2;
    auto read = [&](int slot, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) {
      const unsigned char* st = ring + slot * SLOT;
UW_UNROLL()
      for (int rr = 0; rr < 2; ++rr)
UW_UNROLL()
        for (int h = 0; h < 2; ++h) {
          c.lds_v4(st + rd_sm + rr * 8 * SM_ROW + 16 * ((4 * h + t) ^ sw_sm), s[rr][h]);
          c.lds_v2(st + rd_idx + rr * 8 * IDX_ROW + 8 * ((4 * h + t) ^ sw_idx), n[rr][h]);
        }
    };
    // The prefetch feed (kPrefetch): this lane's row of the tile (rows past N: row N - 1, as
    // the loads) in one of the two planes, and the bytes of step q there: its two halves, one
    // run in file order, two tile-major (only the first at a half step, whose missing half may
    // lie past the plane).
    constexpr int PF = plan::PGEMV_MMA_PREFETCH_STEPS;
    const bool pf_idx = lane >= ROWS;
    const int64_t pf_r = row0 + (lane & (ROWS - 1)) < last ? row0 + (lane & (ROWS - 1)) : last;
    const uint32_t pf_half = pf_idx ? HALF / 2 : HALF;  // bytes of a half step's row
    const int pf_q = pf_idx ? dq_ix : dq_sm, pf_h = pf_idx ? dh_ix : dh_sm;
    const uint8_t* const pf = pf_idx ? a.idx + a.idx_at(pf_r, s0 * COLS) : a.sm + a.sm_at(pf_r, s0 * COLS);
    auto prefetch = [&](int q) {
      if (kPrefetch && q < nq) {
        const uint8_t* p = pf + static_cast<int64_t>(q) * pf_q;
        const bool whole = q != q_half;
        if (static_cast<uint32_t>(pf_h) == pf_half) {
          prefetch_l2(p, whole ? 2 * pf_half : pf_half);
        } else {
          prefetch_l2(p, pf_half);
          if (whole) prefetch_l2(p + pf_h, pf_half);
        }
      }
    };
    // The bulk feed (kBulk): slot `slot` holds step q's two tiles of sign+mantissa bytes (16 rows
    // of 64, twice), then its two of index bytes (16 rows of 32, twice); the second of each pair
    // is neither copied nor read at a half step.  Barrier `slot` counts one arrival (lane 0's,
    // with the step's bytes) and the two copies; the k-th use of a slot waits on parity k & 1.
    static_assert(!kBulk || (!kStaged && !kPrefetch), "one feed per variant");
    constexpr int DB = plan::PGEMV_MMA_BULK_DEPTH, BSLOT = plan::PGEMV_MMA_BULK_SLOT, B_SM = ROWS * COLS;
    unsigned char* const bring = c.smem() + static_cast<int64_t>(warp) * DB * BSLOT;
    uint64_t* const bars = reinterpret_cast<uint64_t*>(c.smem() + plan::PGEMV_WARPS * DB * BSLOT) + warp * DB;
    const uint8_t* const bsm = a.sm + a.sm_at(row0, s0 * COLS);  // the part's run in each plane
    const uint8_t* const bix = a.idx + a.idx_at(row0, s0 * COLS);
    auto bissue = [&](int q, int slot) {
      if (lane == 0 && q < nq) {
        const unsigned smb = static_cast<unsigned>((q == q_half ? HALF : COLS) * ROWS);
        c.mbar_arrive_expect_tx(bars + slot, smb + smb / 2);
        c.bulk_copy(bring + slot * BSLOT, bsm + static_cast<int64_t>(q) * dq_sm, smb, bars + slot);
        c.bulk_copy(bring + slot * BSLOT + B_SM, bix + static_cast<int64_t>(q) * dq_ix, smb / 2, bars + slot);
      }
    };
    auto bread = [&](int q, int slot, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) {
      const unsigned char* st = bring + slot * BSLOT;
UW_UNROLL()
      for (int h = 0; h < 2; ++h)
UW_UNROLL()
        for (int rr = 0; rr < 2; ++rr) {
          if (h == 1 && q == q_half) {
            s[rr][h][0] = s[rr][h][1] = s[rr][h][2] = s[rr][h][3] = 0u;
            n[rr][h][0] = n[rr][h][1] = 0u;
          } else {
            const int row = g + 8 * rr;
            c.lds_v4(st + h * ROWS * HALF + row * HALF + 16 * t, s[rr][h]);
            c.lds_v2(st + B_SM + h * ROWS * (HALF / 2) + row * (HALF / 2) + 8 * t, n[rr][h]);
          }
        }
    };
    uint32_t sa[2][2][4], na[2][2][2], sb[2][2][4], nb[2][2][2];
    if constexpr (kBulk) {
      if (lane == 0) {
UW_UNROLL()
        for (int j = 0; j < DB; ++j) c.mbar_init(bars + j, 1);
        c.mbar_init_fence();
      }
      c.syncwarp();
UW_UNROLL()
      for (int q = 0; q < DB - 1; ++q) bissue(q, q);  // in flight while the verbatim cursors are found
    } else if constexpr (kStaged) {
UW_UNROLL()
      for (int q = 0; q < D - 1; ++q) issue(q, q);  // in flight while the verbatim cursors are found
    } else {
      // Both buffers' loads go out before the verbatim search (dependent L2 reads).
      load(0, sa, na);
      if (nq > 1) load(1, sb, nb);
      if constexpr (kPrefetch) {
UW_UNROLL()
        for (int q = 2; q < 2 + PF; ++q) prefetch(q);
      }
    }

    // x rows of this lane's n-tile columns (B fragment: n = g; pmma_x_row).
    const uint16_t* xp[NT];
UW_UNROLL()
    for (int nt = 0; nt < NT; ++nt) xp[nt] = a.x + pmma_x_row(nt * 8 + g, a.M) * a.ldx + c0;

    // Verbatim blocks: lane i < 16 follows row row0 + i with a cursor into vpos, as the fused
    // GEMM does (`rel`: that entry's block within its row, 0xFFFFFFFF when none is left).
    const uint64_t bpr = static_cast<uint64_t>(a.K / PAL_BLOCK);
    const uint64_t rowbase = static_cast<uint64_t>(row0 + (lane & (ROWS - 1))) * bpr;
    const uint64_t b_first = static_cast<uint64_t>(s0) * (COLS / PAL_BLOCK);
    const uint64_t b_end = (s1 * COLS < a.K ? static_cast<uint64_t>(s1 * COLS) : static_cast<uint64_t>(a.K)) / PAL_BLOCK;
    uint32_t cur = 0, rel = 0xFFFFFFFFu;
    if (kProbe != plan::PGEMV_PROBE_STREAM && a.nv > 0)
      pmma_tile_cursors(c, a, row0, bpr, b_first, b_end, rowbase, cur, rel);

    const PalTables pt = lane_tables(c, a.pt);  // (~16 moves per half step saved)
    // Step q's x into L1 (the probes that load no x ask for none).
    const int x_steps = x_ahead_steps(t, nq, q_half, (kProbe == plan::PGEMV_PROBE_NONE ||
                                                      kProbe == plan::PGEMV_PROBE_NO_DECODE) && a.x_prefetch != 0);
    auto x_lines = [&](int q) { x_ahead<NT>(xp, t, q, q < x_steps); };
    auto compute = [&](int q, const uint32_t (&s)[2][2][4], const uint32_t (&n)[2][2][2]) {
      x_lines(q + 2);
      pgemv_mma_step<NT, kPaired, kProbe, kSplit>(c, a, pt, xp, q, q_half, static_cast<uint32_t>(b_first), rowbase,
                                                  bpr, cur, rel, s, n, acc);
    };
    c.grid_dep_wait();  // (x, then y, are what an earlier launch may still be writing or reading)
    c.grid_dep_launch();
    x_lines(0);
    x_lines(1);
    if constexpr (kBulk) {
      for (int q0 = 0; q0 < nq; q0 += DB) {
UW_UNROLL()
        for (int j = 0; j < DB; ++j) {
          const int q = q0 + j;
          if (q >= nq) break;  // warp-uniform: the part's last steps
          c.syncwarp();        // every lane has read slot (j + DB - 1) % DB (step q - 1) before its refill
          bissue(q + DB - 1, (j + DB - 1) % DB);
          c.mbar_wait(bars + j, static_cast<unsigned>(q / DB) & 1u);
          bread(q, j, sa, na);
          compute(q, sa, na);
        }
      }
    } else if constexpr (kStaged) {
      ring_steps<D>(c, nq, issue, [&](int q, int slot) {
        read(slot, sa, na);
        compute(q, sa, na);
      });
    } else {
      // Step q + 1 is in flight while step q is used; a buffer is refilled (two steps ahead) as
      // soon as it has been used.
      for (int q = 0; q < nq; q += 2) {
        compute(q, sa, na);
        if (q + 2 < nq) load(q + 2, sa, na);
        prefetch(q + 2 + PF);
        if (q + 1 >= nq) break;
        compute(q + 1, sb, nb);
        if (q + 3 < nq) load(q + 3, sb, nb);
        prefetch(q + 3 + PF);
      }
    }
  }

  // Epilogue.  acc[nt][e]: tile row g (+8 for e >= 2), batch row nt*8 + 2t + (e & 1).  With
  // parts, the sums go through shared memory, [warp][tile row][batch row], and part 0's warp
  // adds them in part order.
  // (kStaged: each warp's sums in its own ring, whose copies have all landed by now: the groups
  // still counted are the empty ones past the part's end.)
  // (kBulk: likewise, every copy having been waited for in the loop.)
  constexpr int kWarpFloats = kStaged ? plan::PGEMV_MMA_STAGED_DEPTH * plan::PGEMV_MMA_STAGED_SLOT / 4
                              : kBulk ? plan::PGEMV_MMA_BULK_DEPTH * plan::PGEMV_MMA_BULK_SLOT / 4
                                      : ROWS * plan::PGEMV_MMA_MAX_M;
  static_assert(kWarpFloats >= ROWS * plan::PGEMV_MMA_MAX_M, "a warp's sums fit its ring");
  float* red = reinterpret_cast<float*>(c.smem());
  auto at = [&](int w, int nt, int e) {
    return red + w * kWarpFloats + (g + (e >> 1) * 8) * plan::PGEMV_MMA_MAX_M + nt * 8 + 2 * t + (e & 1);
  };
  if (a.parts > 1) {
    if constexpr (kStaged) {
      c.template cp_async_wait<0>();
      c.syncwarp();  // every lane's last ring read is done before the sums overwrite it
    }
    if constexpr (kBulk) c.syncwarp();  // (the same)
UW_UNROLL()
    for (int nt = 0; nt < NT; ++nt)
      for (int e = 0; e < 4; ++e) c.sts(at(warp, nt, e), acc[nt][e]);
    c.syncthreads();
    if (part != 0) return;
  }
  if (!active) return;
UW_UNROLL()
  for (int nt = 0; nt < NT; ++nt)
    for (int e = 0; e < 4; ++e) {
      const int m = nt * 8 + 2 * t + (e & 1);
      const int64_t r = row0 + g + (e >> 1) * 8;
      if (m >= a.M || r >= a.N) continue;
      float sum = acc[nt][e];
      if (a.parts > 1) {
        sum = 0.f;
UW_UNROLL(1)  // once per warp: kept short rather than unrolled for each of the 4 NT sums
        for (int q = 0; q < a.parts; ++q) sum += c.lds(at(warp + q, nt, e));
      }
      a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(sum));
    }
}

// The queued tensor-core GEMV (PGEMV_VARIANT_MMA_QUEUE): the register-direct variant's tiles,
// steps, loads, decode and mma, handed out as units from a queue instead of one part per warp.
// A tile's steps are cut into a.parts units (plan::pgemv_mma_unit_steps; any count, not only
// 1, 2, 4 or 8), unit u being part u % parts of tile u / parts.  The grid is persistent (what
// the SMs hold at once): warp w of the launch's W takes unit w first, then each unit it asks
// the queue for (one atomic add on a.queue[PGEMV_QUEUE_HEAD], issued a unit ahead so that its
// answer is back when needed) is W + the count it was handed, until that passes a.units.  A
// warp that streams faster takes more units, so the launch ends when the queue runs dry
// rather than when its slowest warp's fixed share is done, and a tile count that is not a
// multiple of the warps the SMs hold costs at most one unit per warp, not a second wave.
//
// The stream of steps runs on across units: the two loads in flight while a step is used
// belong to the unit's next steps or, at its last two, to the next unit's first (the unit
// after that is asked for at the unit's start).  A unit with an odd count of steps leaves the
// next unit's first step in the second buffer: the buffers are swapped (the moves wait for
// those loads), so the units are planned with an even count where the tile's steps allow.
//
// Sums: a unit's are the register-direct kernel's part sums (the same steps in the same mma
// order).  With one unit per tile they are stored as they are; otherwise each unit stores its
// sums to a.ws ([unit][batch row][tile row], fp32), fences, and counts itself in on its
// tile's arrival counter, and the tile's last unit to arrive adds the tile's units in unit
// order (0 + u_0 + u_1 + ...), rounds once and resets the counter.  That is the register-direct
// kernel's order at the same parts, so at parts 1, 2, 4 and 8 the bits are that variant's,
// whichever warp ran which unit and in whatever order.  The last warp of the launch to finish
// resets the queue: every counter is zero again for the next launch on the stream, and a
// CUDA graph replays it as it is.
template <int NT, bool kPaired, class Ctx>
UW_HD void pgemv_mma_queue_body(Ctx& c, const PgemvArgs& a) {
  constexpr int COLS = plan::PGEMV_MMA_COLS, HALF = COLS / 2, ROWS = plan::PGEMV_MMA_ROWS;
  const int lane = c.lane(), g = lane >> 2, t = lane & 3;
  // (32-bit: the launcher holds the units under 2^31)
  const int32_t W = static_cast<int32_t>(c.grid_x()) * plan::PGEMV_WARPS;
  const int32_t U = static_cast<int32_t>(a.units);
  const int32_t P = a.parts;
  int32_t u = static_cast<int32_t>(c.block_x()) * plan::PGEMV_WARPS + c.warp();
  // Per unit: its tile's first row, first step, steps, half step (plan as the register-direct
  // kernel's), and the lane's byte of row r_lo at its first step in the sign+mantissa plane with
  // row r_hi's distance from it.  The index plane's offsets are those halved (PalProduct::idx_at),
  // so the lane's four plane bases are made from three registers where each load needs them:
  // held as four pointers they spilled at batch 9-16, reloaded from local memory every step.
  struct Unit {
    int32_t tile, row0, s0;
    int nq, q_half;
    int64_t o;    // sm_at(r_lo, first column)
    int32_t dhi;  // sm_at(r_hi, first column) - o: >= 0, < 16 K (the launcher holds K under 2^27)
  };
  const int64_t last = a.N - 1;
  auto setup = [&](int32_t unit, Unit& w) {
    w.tile = unit / P;
    const int part = unit - w.tile * P;
    w.row0 = w.tile * ROWS;
    int64_t s0 = 0, s1 = 0;
    plan::pgemv_mma_unit_steps(a.K, P, part, &s0, &s1);
    w.s0 = static_cast<int32_t>(s0);
    w.nq = static_cast<int>(s1 - s0);
    w.q_half = a.K % COLS != 0 && s1 * COLS > a.K ? w.nq - 1 : w.nq;
    const int64_t r_lo = w.row0 + g < last ? int64_t{w.row0} + g : last;
    const int64_t r_hi = w.row0 + g + 8 < last ? int64_t{w.row0} + g + 8 : last;
    const int64_t c0 = s0 * COLS + 16 * t;
    w.o = a.sm_at(r_lo, c0);
    w.dhi = static_cast<int32_t>(a.sm_at(r_hi, c0) - w.o);
  };
  const PmmaSteps d{static_cast<int>(a.sm_cols(COLS)), static_cast<int>(a.sm_cols(HALF)),
                    static_cast<int>(a.idx_cols(COLS)), static_cast<int>(a.idx_cols(HALF))};
  // Step q's loads of unit w (pgemv_mma_load from the unit's bases).
  auto unit_load = [&](const Unit& w, int q, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) {
    const int64_t o_hi = w.o + w.dhi;
    const uint8_t* const sp[2] = {a.sm + w.o, a.sm + o_hi};
    const uint8_t* const ip[2] = {a.idx + static_cast<int64_t>(static_cast<uint64_t>(w.o) / 2),
                                  a.idx + static_cast<int64_t>(static_cast<uint64_t>(o_hi) / 2)};
    pgemv_mma_load(sp, ip, d, q, w.q_half, s, n);
  };
  const uint64_t bpr = static_cast<uint64_t>(a.K / PAL_BLOCK);
  int32_t* const head = a.queue + plan::PGEMV_QUEUE_HEAD;
  int32_t* const arrivals = a.queue + plan::PGEMV_QUEUE_TILES;

  if (u < U) {
    const PalTables pt = lane_tables(c, a.pt);
    Unit cu{}, nu{};
    uint32_t sa[2][2][4], na[2][2][2], sb[2][2][4], nb[2][2][2];
    setup(u, cu);
    unit_load(cu, 0, sa, na);
    if (cu.nq > 1) unit_load(cu, 1, sb, nb);
    // (as the register-direct kernel: the planes before the wait, the rest after it, and the
    // next launch let start only then)
    c.grid_dep_wait();  // (the queue, the sums, x and y: an earlier launch may still use them)
    c.grid_dep_launch();
    // x into L1 as the register-direct kernel asks for it, two steps ahead: the first unit's
    // first two steps here, a unit's later steps and the next unit's first two with their planes.
    // The lane's x rows at unit w's first column.
    auto unit_x = [&](const Unit& w, const uint16_t* (&xp)[NT]) {
UW_UNROLL()
      for (int nt = 0; nt < NT; ++nt)
        xp[nt] = a.x + pmma_x_row(nt * 8 + g, a.M) * a.ldx + int64_t{w.s0} * COLS + 16 * t;
    };
    if (a.x_prefetch != 0) {
      const uint16_t* x0[NT];
      unit_x(cu, x0);
      const int steps = x_ahead_steps(t, cu.nq, cu.q_half, true);
      for (int q = 0; q < 2; ++q) x_ahead<NT>(x0, t, q, q < steps);
    }
    while (true) {
      // The unit after this one: asked for now, its answer read before the last two steps.
      int32_t asked = 0;
      if (lane == 0) asked = c.atomic_add(head, int32_t{1});
      const uint64_t rowbase = static_cast<uint64_t>(cu.row0 + (lane & (ROWS - 1))) * bpr;
      const uint64_t b_first = static_cast<uint64_t>(cu.s0) * (COLS / PAL_BLOCK);
      const int64_t s_end = (int64_t{cu.s0} + cu.nq) * COLS;
      const uint64_t b_end = static_cast<uint64_t>(s_end < a.K ? s_end : a.K) / PAL_BLOCK;
      uint32_t cur = 0, rel = 0xFFFFFFFFu;
      if (a.nv > 0) pmma_tile_cursors(c, a, cu.row0, bpr, b_first, b_end, rowbase, cur, rel);
      const uint16_t* xp[NT];
      unit_x(cu, xp);
      float acc[NT][4];
UW_UNROLL()
      for (int nt = 0; nt < NT; ++nt)
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
      // Step q of unit w's x (xp is this unit's: the rows are every unit's, the columns move by
      // the units' first steps).
      auto x_lines = [&](const Unit& w, int q) {
        x_ahead<NT>(xp, t, w.s0 - cu.s0 + q, q < x_ahead_steps(t, w.nq, w.q_half, a.x_prefetch != 0));
      };
      auto step = [&](int q, const uint32_t (&s)[2][2][4], const uint32_t (&n)[2][2][2]) {
        x_lines(cu, q + 2);  // (the next unit's first two: asked for with their planes, below)
        pgemv_mma_step<NT, kPaired>(c, a, pt, xp, q, cu.q_half, static_cast<uint32_t>(b_first), rowbase, bpr, cur,
                                    rel, s, n, acc);
      };
      // Steps whose refills stay inside the unit.
      int q = 0;
      for (; q + 3 < cu.nq; q += 2) {
        step(q, sa, na);
        unit_load(cu, q + 2, sa, na);
        step(q + 1, sb, nb);
        unit_load(cu, q + 3, sb, nb);
      }
      const int32_t un = W + c.shfl(asked, 0);  // (W + a count below U + W: no overflow)
      const bool has_next = un < U;  // warp-uniform
      if (has_next) setup(un, nu);
      // A one-step unit: the stream's second step is the next unit's first.
      if (cu.nq == 1 && has_next) {
        unit_load(nu, 0, sb, nb);
        x_lines(nu, 0);
      }
      // Global step q2 of the stream: this unit's, or the next unit's q2 - nq.
      auto refill = [&](int q2, uint32_t (&s)[2][2][4], uint32_t (&n)[2][2][2]) {
        if (q2 < cu.nq)
          unit_load(cu, q2, s, n);
        else if (has_next && q2 - cu.nq < nu.nq) {
          unit_load(nu, q2 - cu.nq, s, n);
          x_lines(nu, q2 - cu.nq);
        }
      };
      for (; q < cu.nq; q += 2) {
        step(q, sa, na);
        refill(q + 2, sa, na);
        if (q + 1 >= cu.nq) break;
        step(q + 1, sb, nb);
        refill(q + 3, sb, nb);
      }
      if (cu.nq & 1) {  // the next unit's first step is in the second buffer
UW_UNROLL()
        for (int i = 0; i < 2; ++i)
UW_UNROLL()
          for (int h = 0; h < 2; ++h) {
UW_UNROLL()
            for (int k = 0; k < 4; ++k) {
              const uint32_t v = sa[i][h][k];
              sa[i][h][k] = sb[i][h][k];
              sb[i][h][k] = v;
            }
UW_UNROLL()
            for (int k = 0; k < 2; ++k) {
              const uint32_t v = na[i][h][k];
              na[i][h][k] = nb[i][h][k];
              nb[i][h][k] = v;
            }
          }
      }

      // The unit's sums.  acc[nt][e]: tile row g (+8 for e >= 2), batch row nt*8 + 2t + (e & 1).
      if (P == 1) {
UW_UNROLL()
        for (int nt = 0; nt < NT; ++nt)
          for (int e = 0; e < 4; ++e) {
            const int m = nt * 8 + 2 * t + (e & 1);
            const int64_t r = int64_t{cu.row0} + g + (e >> 1) * 8;
            if (m < a.M && r < a.N) a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(acc[nt][e]));
          }
      } else {
        const int64_t tile_units = static_cast<int64_t>(P);
        auto ws_at = [&](int64_t unit, int m, int row) { return a.ws + (unit * a.M + m) * ROWS + row; };
UW_UNROLL()
        for (int nt = 0; nt < NT; ++nt)
          for (int e = 0; e < 4; ++e) {
            const int m = nt * 8 + 2 * t + (e & 1);
            if (m < a.M) c.st_grid(ws_at(u, m, g + (e >> 1) * 8), acc[nt][e]);
          }
        c.threadfence();  // release: the sums before the arrival
        c.syncwarp();
        int32_t is_last = 0;
        if (lane == 0) {
          is_last = c.atomic_add(arrivals + cu.tile, int32_t{1}) == P - 1;
          if (is_last) arrivals[cu.tile] = 0;
        }
        if (c.shfl(is_last, 0)) {  // warp-uniform
          c.threadfence();  // acquire: the other units' sums after their arrivals
UW_UNROLL()
          for (int nt = 0; nt < NT; ++nt)
            for (int e = 0; e < 4; ++e) {
              const int m = nt * 8 + 2 * t + (e & 1);
              const int row = g + (e >> 1) * 8;
              const int64_t r = int64_t{cu.row0} + row;
              if (m >= a.M || r >= a.N) continue;
              float sum = 0.f;
UW_UNROLL(1)
              for (int64_t p = 0; p < tile_units; ++p) sum += c.ld_grid(ws_at(cu.tile * tile_units + p, m, row));
              a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(sum));
            }
        }
      }
      if (!has_next) break;
      u = un;
      cu = nu;
    }
  }
  // Every warp of the launch counts itself out; the last resets the queue for the next launch
  // (its fence orders every warp's last ask, made before that warp's count, before the reset).
  c.grid_dep_wait();  // (a warp with no unit has not waited yet)
  c.threadfence();
  if (lane == 0 && c.atomic_add(a.queue + plan::PGEMV_QUEUE_DONE, int32_t{1}) == W - 1) {
    c.threadfence();
    a.queue[plan::PGEMV_QUEUE_HEAD] = 0;
    a.queue[plan::PGEMV_QUEUE_DONE] = 0;
  }
}

// The tensor-core GEMV over the slots of a palette stack (runtime/expert_slots.py): slot s
// (grid y) computes y[s] = x[s] @ W[ids[s]]^T at batch 1, reading its expert's id on the device
// (no host sync: a CUDA graph captures it, and a replay runs whatever ids the tensor holds).  The
// stack's experts share one palette and hold their planes at a fixed stride and their verbatim
// lists padded to one length V (ascending block ids within the expert; their row index, when
// given, [E, N + 1] of offsets into each expert's own list), so a slot is the
// register-direct GEMV's launch with its pointers moved: the same tiles, steps, parts and sums,
// so each slot's bits are those of pgemv_mma_body on its expert alone.  An id outside [0, E)
// leaves its slot unwritten and adds 1 to *err (once per slot).
struct PgemvSlotArgs {
  PgemvArgs base;      // expert 0's [N, K] product at M = 1, with slot 0's x and y rows
  const int64_t* ids;  // [slots]
  int64_t E;           // experts in the stack
  int64_t sm_stride, idx_stride;  // bytes from one expert's plane to the next
  int64_t V;           // each expert's verbatim list length (vpos [E, V], vexp [E, V, PAL_BLOCK])
  int32_t* err;
};

template <bool kPaired, class Ctx>
UW_HD void pgemv_slots_body(Ctx& c, const PgemvSlotArgs& a) {
  const int64_t slot = c.block_y();
  c.grid_dep_wait();  // (the ids are the router's output: read after the launches ahead have ended)
  const int64_t e = a.ids[slot];  // the CTA's: every warp of it returns, or none
  if (e < 0 || e >= a.E) {
    if (c.block_x() == 0 && c.tid() == 0) c.atomic_add(a.err, int32_t{1});
    return;
  }
  PgemvArgs p = a.base;
  p.sm += e * a.sm_stride;
  p.idx += e * a.idx_stride;
  p.vpos += e * a.V;
  p.vexp += e * a.V * PAL_BLOCK;
  if (p.vrow != nullptr) p.vrow += e * (p.N + 1);  // (the row index [E, N + 1], offsets within the expert's list)
  p.x += slot * p.ldx;
  p.y += slot * p.ldy;
  pgemv_mma_body<1, kPaired, false, false, false>(c, p);
}

// Launchers of the kernel instantiations (palette_gemv.cu).
template <int MB, bool kPaired, int kVariant>
void launch_pgemv(const PgemvArgs& a, int64_t ctas, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
