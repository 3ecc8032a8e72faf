// Decompress side of the Huffman tier (huffman_decode.h): the table build and the fast
// multi-way decode loop, with its baseline and AVX2/BMI2 builds (cpu_features.h).  The whole
// hot path lives in this one translation unit so that the compiler inlines it end to end.
#include "huffman_decode.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "../decode_primitives.h"
#include "cpu_features.h"
#include "thread_pool.h"

namespace unweight {
using namespace detail;

namespace {
// Width of the first-level and pair tables; codes longer than this go to the full table.
constexpr int FAST_BITS = 9;

// ---------------------------------------------------------------------------------------
// Fast CPU Huffman decoder.  What the bits mean comes from decode_primitives.h (canonical_codes,
// ctx_of, bf16_from_parts); this part only arranges the work for a superscalar core:
//  * W segments (same chunk, consecutive row groups) are decoded in lockstep, so W
//    independent table-lookup chains overlap (one chain is bound by load latency);
//  * a pair table indexed by both weights' contexts and the next FAST_BITS bits yields two
//    exponents per lookup for ~95% of pairs; the per-pair table row is computed ahead, in a
//    vectorizable pass over the sign+mantissa bytes, so the serial loop does no context math;
//  * the bit reader keeps a sentinel 1 bit at the bottom of its 64-bit window: consuming a
//    code is a single shift, and the bits consumed since the last load are the window's
//    trailing-zero count, so no bit counter is updated per code;
//  * a pair entry holds both exponents already at their place in two BF16 words, so the
//    separate vectorizable pass that assembles the words only masks it; the serial loop
//    writes each entry over the table-row pointer it came from (one array, one register).
// ---------------------------------------------------------------------------------------
constexpr int DEC_WAYS = 4;
constexpr int PAIRS_PER_REFILL = 4;  // fast pairs use <= FAST_BITS bits each

// A pair entry: the two exponents at bits [14:7] of two BF16 words (exp0 << 7, exp1 << 23)
// and the bits it consumes in bits [3:0] (0 for a slow pair's entry, which never is shifted by).
inline uint32_t pair_entry(uint32_t e0, uint32_t e1, uint32_t len) { return (e0 << 7) | (e1 << 23) | len; }
inline uint32_t pair_exp0(uint64_t ent) { return static_cast<uint32_t>(ent >> 7) & 0xFFu; }
inline uint32_t pair_exp1(uint64_t ent) { return static_cast<uint32_t>(ent >> 23) & 0xFFu; }

// Big-endian 8 bytes at p; bytes at or past `end` read as zero (a corrupt segment may ask
// for bits past the stream).  `lim` = end - 8: below it the plain load is in bounds.
inline uint64_t load_be64(const uint8_t* p, const uint8_t* lim, const uint8_t* end) {
  uint64_t v;
  if (__builtin_expect(p <= lim, 1)) {
    std::memcpy(&v, p, 8);
    return __builtin_bswap64(v);
  }
  v = 0;
  const uintptr_t e = reinterpret_cast<uintptr_t>(end);
  for (int i = 0; i < 8; ++i) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) + i;
    v = (v << 8) | (a < e ? *reinterpret_cast<const uint8_t*>(a) : 0u);
  }
  return v;
}

// Window invariant: the top bits are the next stream bits, MSB first; the lowest set bit is
// the sentinel, at position (bits consumed since p).  A load keeps 63 stream bits (the
// sentinel overwrites the 64th), so bits consumed since p plus the width of any peek must stay
// <= 63.  Worst cases between refills (each refill leaves <= 7 bits consumed): a fast group,
// 7 + PAIRS_PER_REFILL * FAST_BITS; a slow pair, which refills first and peeks 12 bits per
// code, followed by the rest of its group's fast pairs: 7 + 2 * 12 + (PAIRS_PER_REFILL - 1) *
// FAST_BITS.  Both are checked below.
static_assert(FAST_BITS <= 15, "a pair entry keeps its length in bits [3:0], under the first exponent");
static_assert(7 + PAIRS_PER_REFILL * FAST_BITS <= 63, "fast group overruns the window");
static_assert(7 + 2 * HUFF_MAX_CODE_LEN + (PAIRS_PER_REFILL - 1) * FAST_BITS <= 63, "slow pair overruns the window");
struct SentinelReader {
  uint64_t win;
  const uint8_t* p;
  inline void start(const uint8_t* s, const uint8_t* lim, const uint8_t* end) {
    p = s;
    win = load_be64(p, lim, end) | 1u;
  }
  inline void refill(const uint8_t* lim, const uint8_t* end) {
    const unsigned t = static_cast<unsigned>(__builtin_ctzll(win));
    p += t >> 3;
    win = (load_be64(p, lim, end) | 1u) << (t & 7u);
  }
  inline uint64_t consumed(const uint8_t* s) const {
    return static_cast<uint64_t>(p - s) * 8 + static_cast<uint64_t>(__builtin_ctzll(win));
  }
};

struct DecodeScratch {
  // Per pair, layout [group][way][pair]: its pair-table row (a pointer), overwritten by the
  // serial loop with the pair's raw entry, so one register walks both.
  std::vector<uint64_t> slot;
};

// The per-row passes around the serial loop, on 4 pairs (8 weights) of one way at a time:
// table rows from the sign+mantissa bytes, and BF16 words from sign+mantissa and entries.
// SSE2 is part of every x86-64, so these need no run-time dispatch.
inline void pair_rows4(const uint8_t* sp, const uint32_t* PP, uint64_t* rp) {
#if defined(__SSE2__)
  uint64_t b8;
  std::memcpy(&b8, sp, 8);
  const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(b8));  // 4 pairs, one per 16-bit lane
  // ctx of the first weight -> bits [1:0], of the second -> [3:2], then * the row size.
  __m128i c = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 5), _mm_set1_epi16(0x3)),
                           _mm_and_si128(_mm_srli_epi16(v, 11), _mm_set1_epi16(0xC)));
  const __m128i zero = _mm_setzero_si128();
  c = _mm_unpacklo_epi16(c, zero);  // 4 x u32
  const __m128i lo = _mm_slli_epi64(_mm_unpacklo_epi32(c, zero), FAST_BITS + 2);
  const __m128i hi = _mm_slli_epi64(_mm_unpackhi_epi32(c, zero), FAST_BITS + 2);
  const __m128i base = _mm_set1_epi64x(static_cast<long long>(reinterpret_cast<uintptr_t>(PP)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(rp), _mm_add_epi64(lo, base));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(rp + 2), _mm_add_epi64(hi, base));
#else
  for (int t = 0; t < 4; ++t) rp[t] = reinterpret_cast<uintptr_t>(PP + ((ctx_of(sp[2 * t]) | (ctx_of(sp[2 * t + 1]) << 2)) << FAST_BITS));
#endif
}

// A pair entry, read as two 16-bit words, has each weight's exponent at bits [14:7] of its
// word (the code length sits in bits [3:0] of the first and is masked off); a sign+mantissa
// byte s becomes (s | s << 8) & 0x807F.  Entries sit in the low half of each 8-byte slot.
inline void merge4(const uint8_t* sp, const uint64_t* ent, uint16_t* o) {
#if defined(__SSE2__)
  uint64_t b8;
  std::memcpy(&b8, sp, 8);
  const __m128i x = _mm_unpacklo_epi8(_mm_cvtsi64_si128(static_cast<long long>(b8)), _mm_setzero_si128());
  const __m128i e = _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ent))),
                                                     _mm_castsi128_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ent + 2))),
                                                     _MM_SHUFFLE(2, 0, 2, 0)));
  const __m128i w = _mm_or_si128(_mm_and_si128(_mm_or_si128(x, _mm_slli_epi16(x, 8)), _mm_set1_epi16(static_cast<short>(0x807F))),
                                 _mm_and_si128(e, _mm_set1_epi16(0x7F80)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), w);
#else
  for (int t = 0; t < 4; ++t) {
    o[2 * t] = bf16_from_parts(sp[2 * t], pair_exp0(ent[t]));
    o[2 * t + 1] = bf16_from_parts(sp[2 * t + 1], pair_exp1(ent[t]));
  }
#endif
}

#if defined(UW_HAVE_AVX2_PATH)
// AVX2 forms of pair_rows4 / merge4 on two groups (8 pairs) of one way; `step` is the
// distance in pairs between the two groups' entries in the [group][way][pair] layout.
__attribute__((target("avx2"))) inline void pair_rows8_avx2(const uint8_t* sp, const uint32_t* PP,
                                                                           uint64_t* rp, int step) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp));  // 8 pairs
  const __m128i c = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 5), _mm_set1_epi16(0x3)),
                                 _mm_and_si128(_mm_srli_epi16(v, 11), _mm_set1_epi16(0xC)));
  const __m256i base = _mm256_set1_epi64x(static_cast<long long>(reinterpret_cast<uintptr_t>(PP)));
  const __m256i lo = _mm256_add_epi64(_mm256_slli_epi64(_mm256_cvtepu16_epi64(c), FAST_BITS + 2), base);
  const __m256i hi = _mm256_add_epi64(_mm256_slli_epi64(_mm256_cvtepu16_epi64(_mm_srli_si128(c, 8)), FAST_BITS + 2), base);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(rp), lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(rp + step), hi);
}
// kStream: a non-temporal store, for outputs too big to stay in cache: the line is written
// without being read first (no read-for-ownership) and without evicting the table and
// scratch rows; `o` must then be 32-byte aligned.
template <bool kStream = false>
__attribute__((target("avx2"))) inline void merge8_avx2(const uint8_t* sp, const uint64_t* ent, int step,
                                                                       uint16_t* o) {
  const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp)));
  // The low halves of 4 + 4 slots: lanes 0,2,4,6 of each load, then the two 128-bit halves.
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ent));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ent + step));
  const __m256i e = _mm256_permute4x64_epi64(
      _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), _MM_SHUFFLE(2, 0, 2, 0))),
      _MM_SHUFFLE(3, 1, 2, 0));
  const __m256i w = _mm256_or_si256(
      _mm256_and_si256(_mm256_or_si256(x, _mm256_slli_epi16(x, 8)), _mm256_set1_epi16(static_cast<short>(0x807F))),
      _mm256_and_si256(e, _mm256_set1_epi16(0x7F80)));
  if constexpr (kStream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(o), w);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), w);
}
#endif

// Decodes W same-shaped segments: rows x cols weights each, segment j's sign+mantissa rows at
// sm + j*sm_seg + r*sm_stride, output likewise.  PP is the pair table, L the full 12-bit
// table (both [ctx...][bits]).  used[j] receives the bits consumed; returns false on an
// invalid code.
template <int W, bool kAvx2>
__attribute__((always_inline)) inline bool decode_ways_body(
    const uint8_t* const* starts, const uint8_t* stream_end, const uint32_t* PP, const uint16_t* F,
    const uint16_t* L, const uint8_t* sm, int64_t sm_seg, int64_t sm_stride, uint16_t* out, int64_t out_seg,
    int64_t out_stride, int rows, int cols, uint64_t* used, DecodeScratch& s, bool prefetch) {
  constexpr int G = PAIRS_PER_REFILL;
  static_assert(G == 4, "pair_rows4/merge4 work on groups of 4 pairs");
  const uint8_t* lim = stream_end - 8;
  SentinelReader br[W];
#pragma GCC unroll 8
  for (int j = 0; j < W; ++j) br[j].start(starts[j], lim, stream_end);
  const int ngroups = cols / (2 * G);
  const int tail0 = ngroups * 2 * G;  // first weight decoded one code at a time
  s.slot.resize(static_cast<size_t>(ngroups) * W * G + 1);
  uint32_t bad = 0;
  // The peek shift as a run-time value: with BMI2 it becomes one shrx, where a constant
  // shift is a register copy and a shr (one more uop per pair in a loop bound by uops).
  unsigned peek_sh = 64 - FAST_BITS;
#if defined(__GNUC__)
  asm("" : "+r"(peek_sh));
#endif
  // One code from the full table: the tail of a row, and pairs the pair table leaves out.
  // Codes up to FAST_BITS long come from the small per-context table F, so the rare slow
  // pair does not pull the 32 KB full table L into L1 over the pair table.
  auto single = [&](SentinelReader& b, uint8_t sv) -> uint32_t {
    const uint16_t f = F[(ctx_of(sv) << FAST_BITS) | static_cast<uint32_t>(b.win >> (64 - FAST_BITS))];
    if (__builtin_expect(f != 0, 1)) {
      b.win <<= (f & 0xFFu);
      return f >> 8;
    }
    const uint16_t q = L[(ctx_of(sv) << HUFF_MAX_CODE_LEN) | static_cast<uint32_t>(b.win >> (64 - HUFF_MAX_CODE_LEN))];
    bad |= (q == 0);
    b.win <<= lut_len(q);
    return lut_sym(q);
  };
  for (int r = 0; r < rows; ++r) {
    const uint8_t* srow = sm + r * sm_stride;
    const bool pf_next = prefetch && r + 1 < rows;
    // The next row's sign+mantissa line of each way under group g: one 64-byte line every
    // 8 groups (64 weights), issued from the table-row pass.
    auto prefetch_sm = [&](int g) {
      if (pf_next && (g & 7) == 0)
#pragma GCC unroll 8
        for (int j = 0; j < W; ++j) __builtin_prefetch(srow + sm_stride + j * sm_seg + g * 2 * G, 0, 2);
    };
    uint64_t* rowp = s.slot.data();
    {
      int g = 0;
#if defined(UW_HAVE_AVX2_PATH)
      if constexpr (kAvx2)
        for (; g + 2 <= ngroups; g += 2) {
          prefetch_sm(g);
#pragma GCC unroll 8
          for (int j = 0; j < W; ++j)
            pair_rows8_avx2(srow + j * sm_seg + g * 2 * G, PP, rowp + (g * W + j) * G, W * G);
        }
#endif
      for (; g < ngroups; ++g) {
        prefetch_sm(g);
#pragma GCC unroll 8
        for (int j = 0; j < W; ++j) pair_rows4(srow + j * sm_seg + g * 2 * G, PP, rowp + (g * W + j) * G);
      }
    }
    for (int g = 0; g < ngroups; ++g, rowp += W * G) {
#pragma GCC unroll 8
      for (int j = 0; j < W; ++j) br[j].refill(lim, stream_end);
#pragma GCC unroll 4
      for (int t = 0; t < G; ++t)
#pragma GCC unroll 8
        for (int j = 0; j < W; ++j) {
          const uint32_t e = reinterpret_cast<const uint32_t*>(rowp[j * G + t])[br[j].win >> peek_sh];
          if (__builtin_expect(e != 0, 1)) {
            br[j].win <<= (e & 63u);  // the length sits in the low bits: one shift
            rowp[j * G + t] = e;
          } else {
            br[j].refill(lim, stream_end);
            const uint8_t* sp = srow + j * sm_seg + g * 2 * G + 2 * t;
            const uint32_t e0 = single(br[j], sp[0]);
            const uint32_t e1 = single(br[j], sp[1]);
            rowp[j * G + t] = pair_entry(e0, e1, 0);
          }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < W; ++j) {
      const uint8_t* sp = srow + j * sm_seg;
      uint16_t* o = out + j * out_seg + r * out_stride;
      // The next row's output line under group g: one 64-byte line every 4 groups.
      auto prefetch_out = [&](int g) {
        if (pf_next && (g & 3) == 0) __builtin_prefetch(o + out_stride + g * 2 * G, 1, 2);
      };
      for (int k = tail0; k < cols; ++k) {
        br[j].refill(lim, stream_end);
        o[k] = bf16_from_parts(sp[k], single(br[j], sp[k]));
      }
      int g = 0;
#if defined(UW_HAVE_AVX2_PATH)
      if constexpr (kAvx2) {
        if (prefetch && (reinterpret_cast<uintptr_t>(o) & 31) == 0) {
          // Big output: streaming stores, +8-11% over prefetched plain stores on 14336 x
          // 4096, one or two threads, also when a crc32 pass reads the output right after.
          for (; g + 2 <= ngroups; g += 2)
            merge8_avx2<true>(sp + g * 2 * G, s.slot.data() + (g * W + j) * G, W * G, o + g * 2 * G);
        } else {
          for (; g + 2 <= ngroups; g += 2) {
            prefetch_out(g);
            merge8_avx2(sp + g * 2 * G, s.slot.data() + (g * W + j) * G, W * G, o + g * 2 * G);
          }
        }
      }
#endif
      for (; g < ngroups; ++g) {
        prefetch_out(g);
        merge4(sp + g * 2 * G, s.slot.data() + (g * W + j) * G, o + g * 2 * G);
      }
    }
  }
#if defined(UW_HAVE_AVX2_PATH)
  if constexpr (kAvx2) {
    if (prefetch) _mm_sfence();  // streaming stores are weakly ordered: drain before returning
  }
#endif
#pragma GCC unroll 8
  for (int j = 0; j < W; ++j) used[j] = br[j].consumed(starts[j]);
  return bad == 0;
}

#define UW_DECODE_ARGS                                                                            \
  const uint8_t *const *starts, const uint8_t *stream_end, const uint32_t *PP, const uint16_t *F, const uint16_t *L, \
      const uint8_t *sm, int64_t sm_seg, int64_t sm_stride, uint16_t *out, int64_t out_seg,       \
      int64_t out_stride, int rows, int cols, uint64_t *used, DecodeScratch &s, bool prefetch
#define UW_DECODE_PASS starts, stream_end, PP, F, L, sm, sm_seg, sm_stride, out, out_seg, out_stride, rows, cols, used, s, prefetch

// Two builds of the same loop: a baseline x86-64 one, and one for cores with BMI2 (one-uop
// variable shifts, tzcnt) and AVX2 (wider merge pass), picked at run time so a wheel built
// on one machine still runs on any x86-64.
template <int W>
bool decode_ways_base(UW_DECODE_ARGS) { return decode_ways_body<W, false>(UW_DECODE_PASS); }
#if defined(UW_HAVE_AVX2_PATH)
template <int W>
__attribute__((target("avx2,bmi,bmi2"))) bool decode_ways_avx2(UW_DECODE_ARGS) {
  return decode_ways_body<W, true>(UW_DECODE_PASS);
}
#endif
template <int W>
bool decode_ways(UW_DECODE_ARGS) {
#if defined(UW_HAVE_AVX2_PATH)
  if (cpu_has_avx2_bmi2()) return decode_ways_avx2<W>(UW_DECODE_PASS);
#endif
  return decode_ways_base<W>(UW_DECODE_PASS);
}
#undef UW_DECODE_ARGS
#undef UW_DECODE_PASS
}  // namespace

std::string huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           const Grid& g, const uint8_t* table, int exp_lo, int exp_hi,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out, int64_t out_stride, int threads) {
  const int n = exp_hi - exp_lo + 1;
  std::vector<uint16_t> codes(static_cast<size_t>(HUFF_NUM_CTX) * n);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    if (!canonical_codes(table + t * n, n, &codes[t * n]))
      return "invalid huffman code lengths for context " + std::to_string(t);
  // Full 12-bit table, read only where the FAST_BITS table below has no entry: the indices
  // under codes longer than FAST_BITS, and code space no symbol owns (left 0, which flags the
  // code invalid).  So only the long codes are written; filling every code's span, as
  // build_lut does, cost ~10-15 us per call here, a fifth of decoding a 192 x 576 matrix.
  std::vector<uint16_t> lut(static_cast<size_t>(HUFF_NUM_CTX) * LUT_SIZE);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    for (int i = 0; i < n; ++i) {
      const uint32_t l = table[t * n + i];
      if (l <= FAST_BITS) continue;
      const uint32_t first = static_cast<uint32_t>(codes[t * n + i]) << (HUFF_MAX_CODE_LEN - l);
      std::fill_n(&lut[t * LUT_SIZE + first], 1u << (HUFF_MAX_CODE_LEN - l), lut_entry(exp_lo + i, l));
    }
  // The two small tables are filled by code ranges, from each context's list of codes of at
  // most FAST_BITS bits: a tensor is decoded once, so building them entry by entry (~30 us,
  // with a data-dependent branch per entry) was a visible share of decoding a small matrix.
  struct Code { uint32_t sym, len, bits; };
  std::vector<Code> short_codes[HUFF_NUM_CTX];
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    for (int i = 0; i < n; ++i) {
      const uint32_t l = table[t * n + i];
      if (l && l <= FAST_BITS) short_codes[t].push_back({static_cast<uint32_t>(exp_lo + i), l, codes[t * n + i]});
    }
  // First-level table: entries of the full table whose code fits in FAST_BITS bits, else 0.
  std::vector<uint16_t> fast(static_cast<size_t>(HUFF_NUM_CTX) << FAST_BITS, 0);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    for (const Code& a : short_codes[t]) {
      uint16_t* f = &fast[(static_cast<uint32_t>(t) << FAST_BITS) | (a.bits << (FAST_BITS - a.len))];
      std::fill(f, f + (1u << (FAST_BITS - a.len)), static_cast<uint16_t>((a.sym << 8) | a.len));
    }
  // Pair table: for the contexts of two neighbouring weights and the next FAST_BITS bits,
  // both exponents when both codes fit in those bits (most pairs: codes average ~2.6 bits).
  // Entry: pair_entry(exp0, exp1, total length); 0 sends the pair to the slow path.
  std::vector<uint32_t> pair(static_cast<size_t>(HUFF_NUM_CTX * HUFF_NUM_CTX) << FAST_BITS, 0);
  for (uint32_t c0x = 0; c0x < HUFF_NUM_CTX; ++c0x)
    for (uint32_t c1x = 0; c1x < HUFF_NUM_CTX; ++c1x) {
      uint32_t* row = &pair[(c0x | (c1x << 2)) << FAST_BITS];
      for (const Code& a : short_codes[c0x])
        for (const Code& b : short_codes[c1x]) {
          const uint32_t l = a.len + b.len;
          if (l > FAST_BITS) continue;
          const uint32_t first = (a.bits << (FAST_BITS - a.len)) | (b.bits << (FAST_BITS - l));
          std::fill(row + first, row + first + (1u << (FAST_BITS - l)), pair_entry(a.sym, b.sym, l));
        }
    }
  const int64_t ng = g.n_groups();
  const int64_t nsel_g = g1 - g0, nsel_c = c1 - c0;
  // Offsets must be monotone and inside the stream before any segment is touched.
  const int64_t nseg = ng * g.n_chunks();
  if (static_cast<int64_t>(off[nseg]) + STREAM_SLACK_BYTES > stream_bytes)
    return "exponent stream is shorter than its offsets say (truncated?)";
  for (int64_t s = 0; s < nseg; ++s)
    if (off[s + 1] < off[s]) return "segment offsets are not ascending at segment " + std::to_string(s);
  const uint8_t* stream_end = stream + stream_bytes;
  std::atomic<int64_t> bad{-1};
  auto flag = [&](int64_t s) {
    int64_t expect = -1;
    bad.compare_exchange_strong(expect, s);
  };
  // A valid segment's consumed bits round up to exactly its stored byte length.
  auto check = [&](int64_t s, uint64_t used) {
    if (used == ~uint64_t(0) || (used + 7) / 8 != uint64_t(off[s + 1] - off[s])) flag(s);
  };
  // Work unit: up to WAYS row groups of one chunk, decoded in lockstep when they have the
  // same shape: independent bit readers hide the table-lookup latency that bounds a single
  // Huffman decode chain (more ways than WAYS run out of x86-64 registers and spill).
  const int64_t runs = (nsel_g + DEC_WAYS - 1) / DEC_WAYS;
  // A segment's rows are cols weights long and a whole matrix row apart, too short a run for
  // the hardware prefetcher to follow; on a big output, each row's sign+mantissa and output
  // lines are prefetched while the row above is decoded.  Measured here (A/B, one process):
  // 4096 x 4096 +11%, 14336 x 4096 +15% on one thread and +19% on two, 4096 x 14336 +4%;
  // 1-2% slower up to 8 MB of output, where the data stays in cache between rows anyway.
  const bool prefetch = nsel_g * g.R * nsel_c * g.C * 2 >= (int64_t(16) << 20);
  // Units go across the chunks of one run of row groups before moving down: a unit touches a
  // page of sign+mantissa and of output per row and way, and the next unit (the next chunk)
  // then finds the same pages in the TLB and the lines beside its own already fetched.  Going
  // down one chunk first walked a fresh page per row and way each time: A/B, one process,
  // 4096 x 4096 / 14336 x 4096 / 4096 x 14336 +19% / +21% / +15% on one thread, +6% / +10% /
  // +20% on two; 512 x 4096 +7%; matrices of one chunk are unchanged.
  parallel_for(runs * nsel_c, threads, 1, [&](int64_t u) {
    thread_local DecodeScratch scratch;
    const int64_t c = c0 + u % nsel_c, q0 = g0 + (u / nsel_c) * DEC_WAYS;
    const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
    const int64_t lk = k0 - c0 * g.C;
    const int cols = static_cast<int>(k1 - k0);
    const int64_t qn = std::min<int64_t>(DEC_WAYS, g1 - q0);
    const bool full = qn == DEC_WAYS && (q0 + DEC_WAYS) * g.R <= g.rows;
    if (!full) {
      // A run cut short by the grid's edge: one segment at a time (rows may differ).
      for (int64_t gi = q0; gi < q0 + qn; ++gi) {
        const int64_t s = c * ng + gi;
        const int64_t r0 = gi * g.R, r1 = std::min(g.rows, r0 + g.R);
        const int64_t lr = r0 - g0 * g.R;
        const uint8_t* start = stream + off[s];
        uint64_t used;
        const bool ok = decode_ways<1>(&start, stream_end, pair.data(), fast.data(), lut.data(), sm + lr * sm_stride + lk, 0,
                                       sm_stride, out + lr * out_stride + lk, 0, out_stride,
                                       static_cast<int>(r1 - r0), cols, &used, scratch, prefetch);
        check(s, ok ? used : ~uint64_t(0));
      }
      return;
    }
    const uint8_t* starts[DEC_WAYS];
    for (int j = 0; j < DEC_WAYS; ++j) starts[j] = stream + off[c * ng + q0 + j];
    const int64_t lr = q0 * g.R - g0 * g.R;
    uint64_t used[DEC_WAYS];
    const bool ok = decode_ways<DEC_WAYS>(starts, stream_end, pair.data(), fast.data(), lut.data(), sm + lr * sm_stride + lk,
                                          g.R * sm_stride, sm_stride, out + lr * out_stride + lk, g.R * out_stride,
                                          out_stride, static_cast<int>(g.R), cols, used, scratch, prefetch);
    for (int j = 0; j < DEC_WAYS; ++j) check(c * ng + q0 + j, ok ? used[j] : ~uint64_t(0));
  });
  if (bad.load() >= 0) {
    const int64_t s = bad.load();
    return "corrupt exponent stream in segment " + std::to_string(s) + " (chunk " +
           std::to_string(s / ng) + ", row group " + std::to_string(s % ng) + ")";
  }
  return "";
}

}  // namespace unweight
