// The palette decode in registers, shared by the fused palette GEMM (palette_matmul.cuh) and
// the wide palette -> BF16 decode (palette_decode.cuh): the palette as byte-permute tables
// and the decode of four weights into two BF16 pairs.  Design and operation counts:
// docs/design/gpu-kernels.md, "Decode: byte permutes on register tables".
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"

namespace unweight {
namespace cuda {
namespace detail {

// Palette as rotated exponent bytes ror8(e) = (e & 1) << 7 | e >> 1, four per word:
// tab = entries 0..15; dtab = entry k ^ entry k+8 for k < 8 (the paired decode).
struct PalTables {
  uint32_t tab[4];
  uint32_t dtab[2];
};

// Rotated exponent byte: the byte layout that lets the decode assemble BF16 with byte
// selects only (bit 7 -> BF16 bit 7, bits 0..6 -> BF16 bits 8..14).
UW_HD uint32_t ror8(uint32_t e) { return ((e & 1u) << 7) | ((e >> 1) & 0x7Fu); }

// The 16 table bytes t (entry k's byte in t[k]) as the decode's words: tab, and dtab's
// entry k ^ entry k + 8 for k < 8.
inline void pal_pack_tables(const uint32_t (&t)[16], PalTables& a) {
  for (int w = 0; w < 4; ++w) a.tab[w] = t[4 * w] | t[4 * w + 1] << 8 | t[4 * w + 2] << 16 | t[4 * w + 3] << 24;
  for (int w = 0; w < 2; ++w) {
    a.dtab[w] = 0;
    for (int i = 0; i < 4; ++i) a.dtab[w] |= (t[4 * w + i] ^ t[4 * w + i + 8]) << (8 * i);
  }
}

// Fills the tables from the palette; returns whether the paired decode applies: every
// entry k < 8 and its partner k + 8 have exponents of the same parity (unused entries take
// their partner's parity), which is what one byte-select per table needs (bit 7 of a prmt
// result depends only on the low three bits of the index).  A contiguous run of 16
// exponents, the usual palette of trained weights, always pairs.
inline bool pal_tables(const Palette& pal, PalTables& a) {
  uint32_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = i < pal.size ? ror8((pal.w[i / 4] >> (8 * (i % 4))) & 0xFFu) : 0u;
  bool paired = true;
  for (int k = 0; k < 8; ++k) {
    if (k + 8 >= pal.size) t[k + 8] = t[k] & 0x80u;  // unused: never indexed by valid data
    if ((t[k] ^ t[k + 8]) & 0x80u) paired = false;
  }
  pal_pack_tables(t, a);
  return paired;
}

// The split layout's tables (plan::PGEMV_VARIANT_MMA_SPLIT): entry q = c << 1 | sign is the BF16
// high byte sign << 7 | h[c], h the palette's distinct exponent halves e >> 1 in ascending order
// (codes c past them take h[0]).  Entries k and k + 8 differ only in c's top bit, so they share
// bit 7 (the sign) and the paired lookup always applies.  Returns false when the palette has
// more than PAL_SPLIT_HALVES halves.
inline bool pal_split_tables(const Palette& pal, PalTables& a) {
  uint32_t h[plan::PAL_SPLIT_HALVES];
  int nh = 0;
  for (uint32_t v = 0; v < 128; ++v) {  // ascending halves
    bool used = false;
    for (int i = 0; i < pal.size; ++i) used |= ((pal.w[i / 4] >> (8 * (i % 4))) & 0xFFu) >> 1 == v;
    if (!used) continue;
    if (nh == plan::PAL_SPLIT_HALVES) return false;
    h[nh++] = v;
  }
  if (nh == 0) return false;
  uint32_t t[16];
  for (int q = 0; q < 16; ++q) t[q] = (static_cast<uint32_t>(q & 1) << 7) | h[(q >> 1) < nh ? q >> 1 : 0];
  pal_pack_tables(t, a);
  return true;
}

// The tables as per-lane registers.  Kernel parameters are uniform values, and a prmt takes at
// most one operand from the uniform side: with both table words of a lookup uniform, the
// compiler moves one into a register before every lookup (~1 move per 3 prmt in the palette
// kernels).  A shuffle's result is a per-lane register, which the compiler keeps.  Up to six
// registers more: kernels whose register cap would then spill keep the uniform tables
// (kLane false returns u as it is).
template <bool kLane = true, class Ctx>
UW_HD PalTables lane_tables(Ctx& c, const PalTables& u) {
  if constexpr (!kLane) {
    return u;
  } else {
    PalTables t;
UW_UNROLL()
    for (int i = 0; i < 4; ++i) t.tab[i] = c.shfl(u.tab[i], 0);
UW_UNROLL()
    for (int i = 0; i < 2; ++i) t.dtab[i] = c.shfl(u.dtab[i], 0);
    return t;
  }
}

// Four weights -> two A registers (BF16 pairs, lower column in the low half).  s: their
// sign+mantissa bytes (weight j in byte j); sel: their palette indices (weight j in bits
// 4j..4j+3; bits 16+ are ignored).  With r = ror8(exponent) per weight, the BF16 low bytes
// are Z = s & 0x7F | r & 0x80 and the high bytes H = s & 0x80 | r & 0x7F; two byte
// interleaves give the pairs.  The palette lookup is prmt on table words in registers:
// paired:  r = prmt(dtab, idx) ^ prmt(tab[8..15], idx & 7)  -- an index >= 8 makes the first
//          prmt replicate the msb of dtab[idx & 7], which pairing made 0;  8 ops / 4 weights
// general: two 8-entry lookups, a byte mask from prmt's replicate mode (0x7F / 0x00) for
//          bits 0..6 and that mask + 1 (0x80 / 0x01) for bit 7;  11 ops / 4 weights
template <bool kPaired>
UW_HD void pal_decode4(uint32_t s, uint32_t sel, const PalTables& a, uint32_t& lo, uint32_t& hi) {
  const uint32_t s7 = sel & 0x7777u;
  uint32_t zb, hb;  // sources of the low-byte bit 7 and of the high-byte bits 0..6
  if (kPaired) {
    const uint32_t r = emu::prmt(a.dtab[0], a.dtab[1], sel) ^ emu::prmt(a.tab[2], a.tab[3], s7);
    zb = r;
    hb = r;
  } else {
    const uint32_t e_lo = emu::prmt(a.tab[0], a.tab[1], s7), e_hi = emu::prmt(a.tab[2], a.tab[3], s7);
    const uint32_t m = emu::prmt(0x7F7F7F7Fu, 0x7F7F7F7Fu, sel);  // 0x7F: index < 8; 0x00: >= 8
    const uint32_t m2 = m + 0x01010101u;                          // bit 7 set: index < 8
    zb = (e_lo & m2) | (e_hi & ~m2);
    hb = (e_lo & m) | (e_hi & ~m);
  }
  const uint32_t z = emu::bitsel(s, zb, 0x80808080u);  // s & 0x7F7F7F7F | zb & 0x80808080
  const uint32_t h = emu::bitsel(s, hb, 0x7F7F7F7Fu);  // s & 0x80808080 | hb & 0x7F7F7F7F
  lo = emu::prmt(z, h, 0x5140u);
  hi = emu::prmt(z, h, 0x7362u);
}

// Four weights of the split layout -> two A registers: s, their BF16 low bytes (weight j in
// byte j); sel, their codes (weight j in bits 4j..4j+3).  The high bytes come from the paired
// lookup of pal_split_tables (an index >= 8 makes the first prmt replicate a zero msb, as in
// pal_decode4), then the two interleaves: 6 operations per 4 weights.
UW_HD void pal_decode4_split(uint32_t s, uint32_t sel, const PalTables& a, uint32_t& lo, uint32_t& hi) {
  const uint32_t h = emu::prmt(a.dtab[0], a.dtab[1], sel) ^ emu::prmt(a.tab[2], a.tab[3], sel & 0x7777u);
  lo = emu::prmt(s, h, 0x5140u);
  hi = emu::prmt(s, h, 0x7362u);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
