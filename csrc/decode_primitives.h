// Decode primitives of unweight format v1, shared by the C++ CPU codec (csrc/cpu/) and
// the CUDA kernels (cuda/*.cu).  Everything here is header-only, branch-light and free of
// host-only calls so that one definition of "what the bits mean" serves both sides; the
// pure-NumPy reference decoder (unweight/codec/reference.py) is written independently from
// docs/FORMAT.md, and all three are tested against the same golden files.
#pragma once
#include <cstdint>

#include "unweight_constants.h"

#if defined(__CUDACC__)
#define UW_HD __host__ __device__ __forceinline__
#else
#define UW_HD inline
#endif

namespace unweight {

// ---------------------------------------------------------------------------------------
// BF16 <-> planes.  A BF16 word is [15] sign, [14:7] exponent, [6:0] mantissa.  The
// sign+mantissa byte keeps the sign in bit 7 so that "sm & 0x80" and "sm & 0x7f" are the two
// halves that go back around the exponent with one shift each.
// ---------------------------------------------------------------------------------------
UW_HD uint8_t sm_of(uint16_t w) { return static_cast<uint8_t>(((w >> 8) & 0x80u) | (w & 0x7Fu)); }
UW_HD uint8_t exp_of(uint16_t w) { return static_cast<uint8_t>((w >> 7) & 0xFFu); }
UW_HD uint16_t bf16_from_parts(uint8_t sm, uint32_t e) {
  return static_cast<uint16_t>(((sm & 0x80u) << 8) | ((e & 0xFFu) << 7) | (sm & 0x7Fu));
}
// Huffman context of a weight: its top two mantissa bits.  Conditioning the exponent code on
// them recovers the exponent/mantissa mutual information (~0.04 bit/weight on trained
// weights) while the sign+mantissa plane stays a dense byte per weight.
UW_HD uint32_t ctx_of(uint8_t sm) { return (sm >> HUFF_CTX_SHIFT) & (HUFF_NUM_CTX - 1); }

// ---------------------------------------------------------------------------------------
// Huffman decode table.  One flat table per context, indexed by the next HUFF_MAX_CODE_LEN
// bits of the stream (MSB first).  Entry layout: [15:4] symbol (exponent), [3:0] code length;
// an entry of 0 marks code space no symbol owns (only a one-symbol context has any).
// ---------------------------------------------------------------------------------------
constexpr uint32_t LUT_SIZE = 1u << HUFF_MAX_CODE_LEN;
UW_HD uint32_t lut_len(uint16_t entry) { return entry & 0xFu; }
UW_HD uint32_t lut_sym(uint16_t entry) { return entry >> 4; }

// Canonical code assignment (FORMAT.md "Canonical code"): symbols sorted by (length, value);
// the first gets all-zero bits, each next one is previous + 1, shifted left when the length
// grows.  From the code lengths `lengths[0..n)` of symbols lo..lo+n-1 of one context, writes
// each used symbol's code to codes[i] (unused symbols are left alone).  Returns false when
// the lengths do not form a valid code: a length above the limit, an over-full code (Kraft
// sum > 1), or an incomplete code with more than one symbol.
UW_HD bool canonical_codes(const uint8_t* lengths, int n, uint16_t* codes) {
  uint32_t count[HUFF_MAX_CODE_LEN + 1];
  for (int l = 0; l <= HUFF_MAX_CODE_LEN; ++l) count[l] = 0;
  int used = 0;
  for (int i = 0; i < n; ++i) {
    if (lengths[i] > HUFF_MAX_CODE_LEN) return false;
    if (lengths[i]) { ++count[lengths[i]]; ++used; }
  }
  if (used == 0) return true;  // context never occurs in this tensor
  // Kraft sum in units of 2^-MAX.
  uint32_t kraft = 0;
  for (int l = 1; l <= HUFF_MAX_CODE_LEN; ++l) kraft += count[l] << (HUFF_MAX_CODE_LEN - l);
  if (kraft > LUT_SIZE) return false;
  if (used > 1 && kraft != LUT_SIZE) return false;
  if (used == 1) {
    // A lone symbol gets the one-bit code "0" whatever length was stored; FORMAT.md requires 1.
    for (int i = 0; i < n; ++i)
      if (lengths[i] && lengths[i] != 1) return false;
  }
  uint32_t next[HUFF_MAX_CODE_LEN + 2];
  uint32_t code = 0;
  count[0] = 0;
  for (int l = 1; l <= HUFF_MAX_CODE_LEN; ++l) {
    code = (code + count[l - 1]) << 1;
    next[l] = code;
  }
  for (int i = 0; i < n; ++i)
    if (lengths[i]) codes[i] = static_cast<uint16_t>(next[lengths[i]]++);
  return true;
}

// Decode table entry of a symbol (exponent) whose code is `len` bits: [15:4] symbol, [3:0] length.
UW_HD uint16_t lut_entry(int sym, uint32_t len) { return static_cast<uint16_t>((static_cast<uint32_t>(sym) << 4) | len); }

// The full decode table of one context: fills `lut` (LUT_SIZE entries) from the code lengths
// (see canonical_codes; same failures).  Every index whose first bits are a symbol's code
// holds that symbol's entry; code space no symbol owns (only a one-symbol context has any)
// holds 0.  `codes`, if given, receives each symbol's code (for encoders).
UW_HD bool build_lut(const uint8_t* lengths, int n, int lo, uint16_t* lut, uint16_t* codes) {
  uint16_t local[256];
  uint16_t* c = codes ? codes : local;
  if (n > 256) return false;
  for (uint32_t i = 0; i < LUT_SIZE; ++i) lut[i] = 0;
  if (!canonical_codes(lengths, n, c)) return false;
  for (int i = 0; i < n; ++i) {
    const uint32_t l = lengths[i];
    if (!l) continue;
    const uint32_t first = static_cast<uint32_t>(c[i]) << (HUFF_MAX_CODE_LEN - l);
    const uint32_t span = 1u << (HUFF_MAX_CODE_LEN - l);
    const uint16_t entry = lut_entry(lo + i, l);
    for (uint32_t j = 0; j < span; ++j) lut[first + j] = entry;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Bit reader over one segment: a 64-bit window whose top `nbits` bits are the next stream
// bits, MSB first, refilled a byte at a time by refill_bounded below (valid on the GPU: no
// unaligned wide loads).  Used by the CUDA kernels and their host emulation.
// ---------------------------------------------------------------------------------------
struct BitReader {
  const uint8_t* p;
  uint64_t window;
  int nbits;
  UW_HD uint32_t peek() const { return static_cast<uint32_t>(window >> (64 - HUFF_MAX_CODE_LEN)); }
  UW_HD void consume(uint32_t n) { window <<= n; nbits -= static_cast<int>(n); }
  // Bits consumed since `start`.
  UW_HD uint64_t consumed(const uint8_t* start) const {
    return static_cast<uint64_t>(p - start) * 8 - static_cast<uint64_t>(nbits);
  }
};

// ---------------------------------------------------------------------------------------
// Palette tier: a 4-bit index per weight, two per byte, the even column in the low nibble.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t pal_nibble(const uint8_t* idx_row, int64_t col) {
  return (idx_row[col >> 1] >> ((col & 1) * 4)) & 0xFu;
}

}  // namespace unweight

// =======================================================================================
// Additions for the CUDA kernels (csrc/cuda/*.cu).  Appended, never edited in place:
// the functions above define the format and are shared with the CPU codec unchanged.
// =======================================================================================
namespace unweight {

// Tops a BitReader's window up to > 56 bits a byte at a time, never dereferencing at or past
// `limit`: zero bits are shifted in instead.  A GPU thread decoding a corrupt segment whose
// symbols claim more bits than the segment has would otherwise read past the end of the
// stream allocation and take the whole CUDA context down with an illegal-address fault; with
// the bound, it reads zeros, and the length check after the segment (consumed bits vs. byte
// length) reports the corruption.
UW_HD void refill_bounded(BitReader& br, const uint8_t* limit) {
  while (br.nbits <= 56) {
    const uint8_t b = br.p < limit ? *br.p : static_cast<uint8_t>(0);
    br.window |= static_cast<uint64_t>(b) << (56 - br.nbits);
    br.nbits += 8;
    ++br.p;
  }
}

// Starts a reader at `start` that never loads at or past `limit` (zeros come in instead).
UW_HD void init_bounded(BitReader& br, const uint8_t* start, const uint8_t* limit) {
  br.p = start;
  br.window = 0;
  br.nbits = 0;
  refill_bounded(br, limit);
}

// Starts a bounded reader (see init_bounded) at stream bit `bit`: a chain of the checkpoint
// index (FORMAT.md "Checkpoint index") begins anywhere inside a byte.  Its consumed() count
// is then taken from base + (bit >> 3) and includes the (bit & 7) bits skipped here.
UW_HD void init_bounded_at(BitReader& br, const uint8_t* base, uint64_t bit, const uint8_t* limit) {
  init_bounded(br, base + (bit >> 3), limit);
  br.consume(static_cast<uint32_t>(bit & 7));
}

// Decodes weights [first, end) of one segment, taken row-major in a segment `w` weights wide,
// from a reader standing at weight `first`'s code, never loading at or past `limit`.  sm and
// out address the segment's first weight, each with its own row stride.  Weights in
// [wlo, whi) are written (kExpOnly: exponent bytes to out8, else BF16 words to out16); the
// rest are decoded only, because a weight's code can be found only after every code before it
// (a row gather decodes its chain from the checkpoint up to its row).  Returns false on a bit
// pattern that is no code of its context.  lut_all: the 4 context tables, anything indexable
// by a uint32_t (a pointer; the GPU emulator's checked shared-memory view).
template <bool kExpOnly, class Lut>
UW_HD bool decode_run_bounded(BitReader& br, const uint8_t* limit, Lut lut_all,
                              const uint8_t* sm, int64_t sm_stride, uint16_t* out16, uint8_t* out8,
                              int64_t out_stride, int64_t w, int64_t first, int64_t end, int64_t wlo,
                              int64_t whi) {
  uint32_t bad = 0;
  int64_t r = first / w, c = first % w;
  for (int64_t i = first; i < end; ++i) {
    if (br.nbits < HUFF_MAX_CODE_LEN) refill_bounded(br, limit);
    const uint8_t s = sm[r * sm_stride + c];
    const uint16_t e = lut_all[(ctx_of(s) << HUFF_MAX_CODE_LEN) | br.peek()];
    bad |= (e == 0);
    br.consume(lut_len(e));
    if (i >= wlo && i < whi) {
      if (kExpOnly)
        out8[r * out_stride + c] = static_cast<uint8_t>(lut_sym(e));
      else
        out16[r * out_stride + c] = bf16_from_parts(s, lut_sym(e));
    }
    if (++c == w) {
      c = 0;
      ++r;
    }
  }
  return bad == 0;
}

// fp32 bit pattern of the BF16 word with sign+mantissa byte `sm` and exponent `e`: the BF16
// word in the top half.  The fused GEMV multiplies in fp32 straight from this, so a weight is
// never rounded or converted through a float intermediate.
UW_HD uint32_t f32_bits_from_parts(uint8_t sm, uint32_t e) {
  return static_cast<uint32_t>(bf16_from_parts(sm, e)) << 16;
}

// fp32 -> BF16 round-to-nearest-even on the bit pattern (NaN stays a quiet NaN), written out
// so the GPU kernels and their host emulation round identically.
UW_HD uint16_t bf16_round_bits(uint32_t f) {
  if ((f & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((f >> 16) | 0x40u);
  return static_cast<uint16_t>((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------------------------------------
// CRC-32: the checksum of every tensor (zlib's, as FORMAT.md defines it), in zlib's bit-reflected
// form: bit 31 of a word holds x^0, bit 0 holds x^31.  The device checksum (cuda/crc32.cuh)
// works on raw CRC states (a zero start, no final inversion), which are linear in the message:
// the raw state after a message followed by n zero bytes is the state times x^(8n) mod P, so
// states of separate pieces combine by multiplication and xor, in any order.
// ---------------------------------------------------------------------------------------
constexpr uint32_t CRC32_POLY = 0xEDB88320u;  // x^32 + x^26 + ... + 1, reflected, x^32 left out
constexpr uint32_t CRC32_ONE = 0x80000000u;   // the polynomial 1
constexpr uint32_t CRC32_X = 0x40000000u;     // x
constexpr uint32_t CRC32_X_INV = 0xDB710641u;  // x^-1 mod P: (P - 1) / x, times x is 1 (tested)
// The raw state after the single byte b from a zero state (zlib's byte table).
UW_HD uint32_t crc32_byte_state(uint32_t b) {
  uint32_t c = b & 0xFFu;
  for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (CRC32_POLY & (0u - (c & 1u)));
  return c;
}
// a * b mod P (zlib's multmodp), branch-free: 32 steps of one bit of a.
UW_HD uint32_t crc32_multmod(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (int i = 31; i >= 0; --i) {
    p ^= b & (0u - ((a >> i) & 1u));
    b = (b >> 1) ^ (CRC32_POLY & (0u - (b & 1u)));
  }
  return p;
}
// x^(8 * 2^k) mod P (inv: x^(-8 * 2^k)), by squaring: the powers the shifts below multiply by.
UW_HD uint32_t crc32_pow8(int k, bool inv = false) {
  uint32_t p = inv ? CRC32_X_INV : CRC32_X;
  for (int i = 0; i < 3 + k; ++i) p = crc32_multmod(p, p);
  return p;
}
// The state `s` moved n bytes on (n > 0: n zero bytes appended; n < 0: -n bytes taken back,
// which only undoes zero bytes), with pow[k] = x^(8 * 2^k) for every bit k of n and inv[k] =
// x^(-8 * 2^k) for every bit k of -n.
UW_HD uint32_t crc32_shift(uint32_t s, int64_t n, const uint32_t* pow, const uint32_t* inv) {
  const uint32_t* t = n < 0 ? inv : pow;
  uint64_t m = n < 0 ? static_cast<uint64_t>(-n) : static_cast<uint64_t>(n);
  for (int k = 0; m != 0; ++k, m >>= 1)
    if (m & 1u) s = crc32_multmod(s, t[k]);
  return s;
}

}  // namespace unweight
