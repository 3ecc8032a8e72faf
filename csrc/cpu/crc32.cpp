// CRC-32 of a buffer, split across threads (crc32.h).
#include "crc32.h"

#include <zlib.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "cpu_features.h"
#include "thread_pool.h"

namespace unweight {
using namespace detail;

namespace {
// CRC-32 (zlib's polynomial) of `n` bytes continuing from `crc`, as zlib's crc32() returns.
// zlib 1.2.x computes it a byte-slice at a time (~2-3 GB/s), which made the checksum a fifth
// of compress time; CPUs with carry-less multiply fold 64 bytes per step instead (the method
// of Intel's "Fast CRC computation for generic polynomials using PCLMULQDQ"): four 128-bit
// lanes are folded forward by 512 bits, then into one lane by 128 bits, and zlib finishes
// the last 16 folded bytes plus the tail.  Fold constants are x^k mod P (bit-reflected) for
// the gzip polynomial, k = 4*128 +- 32 and 128 +- 32.  Checked against zlib in the tests.
inline uint32_t crc32_zlib(uint32_t crc, const uint8_t* p, size_t n) {
  while (n) {  // zlib takes uInt lengths: < 4 GiB steps
    const size_t step = std::min<size_t>(n, size_t(1) << 30);
    crc = static_cast<uint32_t>(crc32(crc, p, static_cast<uInt>(step)));
    p += step;
    n -= step;
  }
  return crc;
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("pclmul,sse4.1"))) inline __m128i crc_fold(__m128i x, __m128i k, __m128i d) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), d);
}
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_clmul(uint32_t crc, const uint8_t* p, size_t n) {
  if (n < 64) return crc32_zlib(crc, p, n);
  const __m128i k512 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  auto ld = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  // The running state (~crc) enters as an xor into the first 32 message bits.
  __m128i x0 = _mm_xor_si128(ld(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = ld(p + 16), x2 = ld(p + 32), x3 = ld(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    x0 = crc_fold(x0, k512, ld(p));
    x1 = crc_fold(x1, k512, ld(p + 16));
    x2 = crc_fold(x2, k512, ld(p + 32));
    x3 = crc_fold(x3, k512, ld(p + 48));
  }
  x0 = crc_fold(crc_fold(crc_fold(x0, k128, x1), k128, x2), k128, x3);
  for (; n >= 16; p += 16, n -= 16) x0 = crc_fold(x0, k128, ld(p));
  uint8_t last[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(last), x0);
  // The folded lane is a 16-byte message with a zero start state: zlib's crc32 starting
  // from 0xFFFFFFFF (its own inversion undone) yields the final crc, and goes on over the tail.
  return crc32_zlib(crc32_zlib(0xFFFFFFFFu, last, 16), p, n);
}
#endif
inline uint32_t crc32_any(uint32_t crc, const uint8_t* p, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  if (clmul && !g_force_baseline.load(std::memory_order_relaxed)) return crc32_clmul(crc, p, n);
#endif
  return crc32_zlib(crc, p, n);
}
}  // namespace

uint32_t crc32_parallel(const uint8_t* data, int64_t nbytes, int threads) {
  // Pieces on separate threads, joined with zlib's crc32_combine into the crc of the whole.
  const int parts = nbytes < (8 << 20) ? 1 : std::max(1, threads);
  std::vector<uLong> crc(parts);
  std::vector<int64_t> len(parts);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t b, e;
    part_range(nbytes, parts, static_cast<int>(k), &b, &e);
    crc[k] = crc32_any(0, data + b, static_cast<size_t>(e - b));
    len[k] = e - b;
  });
  uLong total = crc[0];
  for (int k = 1; k < parts; ++k) total = crc32_combine(total, crc[k], static_cast<z_off_t>(len[k]));
  return static_cast<uint32_t>(total);
}

void crc32_rows(const uint8_t* data, int64_t rows, int64_t row_bytes, uint32_t* out, int threads) {
  // Rows of a few KiB each: a worker takes ~256 KiB of them at a time.
  const int64_t grain = std::max<int64_t>(1, (int64_t(256) << 10) / std::max<int64_t>(1, row_bytes));
  parallel_for(rows, threads, grain, [&](int64_t r) {
    out[r] = crc32_any(0, data + r * row_bytes, static_cast<size_t>(row_bytes));
  });
}

}  // namespace unweight
