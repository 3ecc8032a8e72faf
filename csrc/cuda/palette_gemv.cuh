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
  int parts;   // warps per row (plan::pgemv_parts: 1, 2, 4 or 8)
  int lparts;  // log2(parts)
};

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
    const uint8_t* sp = a.sm + r * a.K + c0;
    const uint8_t* ip = a.idx + r * (a.K / 2) + c0 / 2;
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
          ld_stream_v4(sp + q * COLS, s[u]);
          ld_stream_v2(ip + q * (COLS / 2), n[u][0], n[u][1]);
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
    const uint8_t* ipw = a.idx + r * (a.K / 2) + s0 * (COLS / 2);
    constexpr int D = plan::PGEMV_STAGED_DEPTH;
    unsigned char* ring = c.smem() + plan::PGEMV_SMEM_BYTES + static_cast<int64_t>(warp) * D * plan::PGEMV_STAGED_SLOT;
    auto issue = [&](int q, int slot) {  // slot == q % D, a constant where the loop is unrolled
      if (q < nq) {
        unsigned char* st = ring + slot * plan::PGEMV_STAGED_SLOT;
        const bool mine = q < lim;
        c.cp_async16(st + 16 * lane, mine ? sp + q * COLS : a.sm, mine ? 16 : 0);
        if (lane < 16) {
          const bool pair = q < lim_pair;
          c.cp_async16(st + COLS + 16 * lane, pair ? ipw + q * (COLS / 2) + 16 * lane : a.idx, pair ? 16 : 0);
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

    // Verbatim blocks of this part of the row: a warp-uniform cursor into vpos; `rel` is the
    // next entry's block within the row (0xFFFFFFFF: none left).  Step q covers blocks
    // 16 (s0 + q) .. + 15, lane L's 16 columns being half (L & 1) of the step's block L / 2.
    const uint64_t bpr = static_cast<uint64_t>(a.K / PAL_BLOCK), rowbase = static_cast<uint64_t>(r) * bpr;
    const uint64_t b_end = rowbase + (s1 * COLS < a.K ? s1 * COLS / PAL_BLOCK : bpr);
    int64_t cur = a.nv;
    uint32_t rel = 0xFFFFFFFFu;
    if (a.nv > 0) {
      cur = warp_lower_bound(c, a.vpos, a.nv, rowbase + static_cast<uint64_t>(s0) * (COLS / PAL_BLOCK));
      if (cur < a.nv && a.vpos[cur] < b_end) rel = static_cast<uint32_t>(a.vpos[cur] - rowbase);
    }
    const uint32_t blk_first = static_cast<uint32_t>(s0) * (COLS / PAL_BLOCK);

    // Step q of the part from its 16 sign+mantissa bytes s and 8 index bytes n of this lane.
    auto step = [&](int q, const uint32_t (&s)[4], const uint32_t (&n)[2]) {
        uint32_t w[8];  // BF16 pairs of the lane's columns 2j, 2j + 1
UW_UNROLL()
        for (int j = 0; j < 4; ++j) pal_decode4<kPaired>(s[j], n[j >> 1] >> (16 * (j & 1)), a.pt, w[2 * j],
                                                         w[2 * j + 1]);
        // Verbatim blocks of this step (rare): the two lanes holding a block patch its exponents.
        const uint32_t blk0 = blk_first + static_cast<uint32_t>(q) * (COLS / PAL_BLOCK);
        while (rel - blk0 < static_cast<uint32_t>(COLS / PAL_BLOCK)) {
          if (static_cast<uint32_t>(lane >> 1) == rel - blk0) {
            uint32_t e[4];
            ld_stream_v4(a.vexp + cur * PAL_BLOCK + 16 * (lane & 1), e);
UW_UNROLL()
            for (int j = 0; j < 8; ++j) {
              const uint32_t ej = e[j >> 1] >> (16 * (j & 1));
              w[j] = set_exponents(w[j], ej, ej >> 8);
            }
          }
          ++cur;
          rel = cur < a.nv && a.vpos[cur] < b_end ? static_cast<uint32_t>(a.vpos[cur] - rowbase) : 0xFFFFFFFFu;
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
      // Unrolled over the ring so that every slot offset is a constant.
      for (int q0 = 0; q0 < nq; q0 += D) {
UW_UNROLL()
        for (int j = 0; j < D; ++j) {
          const int q = q0 + j;
          if (q >= nq) break;           // warp-uniform: the part's last steps
          c.syncwarp();                 // every lane has read slot (q - 1) % D, which issue refills
          issue(q + D - 1, (j + D - 1) % D);
          c.template cp_async_wait<D - 1>();  // step q's group has landed
          c.syncwarp();                 // and so have the other lanes' copies (the index bytes)
          const unsigned char* st = ring + j * plan::PGEMV_STAGED_SLOT;
          uint32_t s[4], n[2];
          c.lds_v4(st + 16 * lane, s);
          c.lds_v2(st + COLS + 8 * lane, n);
          step(q, s, n);
        }
      }
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

// Launchers of the kernel instantiations (palette_gemv.cu).
template <int MB, bool kPaired, int kVariant>
void launch_pgemv(const PgemvArgs& a, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
