// Palette tier (palette.h): encode, and decode with its baseline and AVX2 row builds
// (cpu_features.h).
#include "palette.h"

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

#if defined(UW_HAVE_AVX2_PATH)
// Palette decode of one row, 32 weights per step: nibbles split and interleaved back into
// column order, mapped through the 16-entry palette with one byte shuffle, and merged with
// the sign+mantissa bytes.  Returns the first column it did not decode (the caller finishes
// the row); *max_nibble receives the largest index seen, for the range check.
__attribute__((target("avx2"))) static int64_t palette_row_avx2(const uint8_t* srow, const uint8_t* irow,
                                                                const uint8_t* pal8, int64_t cols, uint16_t* orow,
                                                                uint32_t* max_nibble) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pal8)));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256i vmax = _mm256_setzero_si256();
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(irow + c / 2));
    const __m128i lo = _mm_and_si128(v, low4);                     // even columns
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);  // odd columns
    const __m256i nib = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    vmax = _mm256_max_epu8(vmax, nib);
    const __m256i ex = _mm256_shuffle_epi8(table, nib);  // 32 exponents, column order
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(srow + c));
    for (int h = 0; h < 2; ++h) {
      const __m256i s16 = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(x, 1) : _mm256_castsi256_si128(x));
      const __m256i e16 = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(ex, 1) : _mm256_castsi256_si128(ex));
      __m256i w = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(s16, _mm256_set1_epi16(0x80)), 8),
                                  _mm256_and_si256(s16, _mm256_set1_epi16(0x7F)));
      w = _mm256_or_si256(w, _mm256_slli_epi16(e16, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(orow + c + 16 * h), w);
    }
  }
  alignas(32) uint8_t m[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(m), vmax);
  *max_nibble = *std::max_element(m, m + 32);
  return c;
}
#endif

void palette_encode(const uint16_t* w, int64_t rows, int64_t cols, const int16_t* map,
                    uint8_t* idx, std::vector<uint32_t>* vpos, std::vector<uint8_t>* vexp,
                    int threads) {
  const int64_t bpr = (cols + PAL_BLOCK - 1) / PAL_BLOCK;
  const int64_t ib = (cols + 1) / 2;
  const int parts = rows * cols < (1 << 20) ? 1 : std::max(1, threads) * 4;
  std::vector<std::vector<uint32_t>> pos(parts);
  std::vector<std::vector<uint8_t>> ex(parts);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t rb, re;
    part_range(rows, parts, static_cast<int>(k), &rb, &re);
    for (int64_t r = rb; r < re; ++r) {
      const uint16_t* row = w + r * cols;
      uint8_t* irow = idx + r * ib;
      std::memset(irow, 0, ib);
      for (int64_t b = 0; b < bpr; ++b) {
        const int64_t k0 = b * PAL_BLOCK, k1 = std::min(cols, k0 + PAL_BLOCK);
        int miss = 0;
        for (int64_t c = k0; c < k1; ++c) miss |= map[exp_of(row[c])] < 0;
        if (miss) {
          pos[k].push_back(static_cast<uint32_t>(r * bpr + b));
          const size_t at = ex[k].size();
          ex[k].resize(at + PAL_BLOCK, 0);
          for (int64_t c = k0; c < k1; ++c) ex[k][at + (c - k0)] = exp_of(row[c]);
          continue;  // nibbles of a verbatim block stay 0
        }
        for (int64_t c = k0; c < k1; ++c)
          irow[c >> 1] |= static_cast<uint8_t>(map[exp_of(row[c])] << ((c & 1) * 4));
      }
    }
  });
  for (int k = 0; k < parts; ++k) {
    vpos->insert(vpos->end(), pos[k].begin(), pos[k].end());
    vexp->insert(vexp->end(), ex[k].begin(), ex[k].end());
  }
}

std::string palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows_total,
                           int64_t cols, int64_t r0, int64_t r1, const uint8_t* palette,
                           int pal_size, const uint32_t* vpos, int64_t nverb,
                           const uint8_t* vexp, uint16_t* out, int threads) {
  const int64_t bpr = (cols + PAL_BLOCK - 1) / PAL_BLOCK;
  const int64_t ib = (cols + 1) / 2;
  for (int64_t v = 0; v < nverb; ++v) {
    if (vpos[v] >= static_cast<uint64_t>(rows_total * bpr) || (v && vpos[v] <= vpos[v - 1]))
      return "verbatim block list is not ascending or out of range at entry " + std::to_string(v);
  }
  // Nibbles beyond pal_size map to a sentinel that fails the check below.
  uint16_t pal[16];
  for (int i = 0; i < 16; ++i) pal[i] = i < pal_size ? palette[i] : 0x100;
  uint8_t pal8[16];
  for (int i = 0; i < 16; ++i) pal8[i] = static_cast<uint8_t>(pal[i]);
  const int64_t n = r1 - r0;
  std::atomic<int> bad{0};
#if defined(UW_HAVE_AVX2_PATH)
  const bool simd = cpu_has_avx2_bmi2();
#endif
  parallel_for(n, threads, 64, [&](int64_t lr) {
    const uint8_t* srow = sm + lr * cols;
    const uint8_t* irow = idx + lr * ib;
    uint16_t* orow = out + lr * cols;
    int64_t c = 0;
    uint32_t seen = 0;
#if defined(UW_HAVE_AVX2_PATH)
    if (simd) {
      uint32_t mx = 0;
      c = palette_row_avx2(srow, irow, pal8, cols, orow, &mx);
      if (mx >= static_cast<uint32_t>(pal_size)) seen = 0x100;
    }
#endif
    for (; c < cols; ++c) {
      const uint32_t e = pal[pal_nibble(irow, c)];
      seen |= e;
      orow[c] = bf16_from_parts(srow[c], e);
    }
    if (seen & 0x100) bad = 1;
  });
  // Verbatim blocks of the selected rows: the block ids are sorted, so find the run.
  const uint32_t* lo = std::lower_bound(vpos, vpos + nverb, static_cast<uint32_t>(r0 * bpr));
  const uint32_t* hi = std::lower_bound(vpos, vpos + nverb, static_cast<uint32_t>(r1 * bpr));
  for (const uint32_t* p = lo; p < hi; ++p) {
    const int64_t v = p - vpos;
    const int64_t r = *p / bpr, b = *p % bpr;
    const int64_t k0 = b * PAL_BLOCK, k1 = std::min(cols, k0 + PAL_BLOCK);
    for (int64_t c = k0; c < k1; ++c) {
      const int64_t o = (r - r0) * cols + c;
      out[o] = bf16_from_parts(sm[o], vexp[v * PAL_BLOCK + (c - k0)]);
    }
  }
  // A nibble >= pal_size outside verbatim blocks is corruption; inside them it was
  // overwritten above, but the format requires those nibbles to be 0, so it is corrupt too.
  if (bad) return "palette index out of range (corrupt index plane)";
  return "";
}

}  // namespace unweight
