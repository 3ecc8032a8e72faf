// C++ CPU codec of unweight format v1.  Decode loops call the shared primitives of
// decode_primitives.h, the same ones the CUDA kernels use.
#include "cpu_codec.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "decode_primitives.h"

namespace unweight {
namespace {

// Runs fn(i) for i in [0, n) on `threads` workers pulling indices from a shared counter, so
// uneven units (segments whose rows differ in cost) still balance.
template <class F>
void parallel_for(int64_t n, int threads, int64_t grain, F&& fn) {
  if (n <= 0) return;
  const int64_t units = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, units)));
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    for (;;) {
      const int64_t u = next.fetch_add(1);
      if (u >= units) break;
      const int64_t b = u * grain, e = std::min(n, b + grain);
      for (int64_t i = b; i < e; ++i) fn(i);
    }
  };
  if (workers == 1) { work(); return; }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
}

// Splits [0, n) into `parts` contiguous ranges.
inline void part_range(int64_t n, int parts, int k, int64_t* b, int64_t* e) {
  *b = n * k / parts;
  *e = n * (k + 1) / parts;
}

}  // namespace

uint32_t crc32_parallel(const uint8_t* data, int64_t nbytes, int threads) {
  // zlib's crc32 + crc32_combine: a well-kept implementation; combining lets the pieces run
  // on separate threads and still yield the crc of the whole buffer.
  const int parts = nbytes < (8 << 20) ? 1 : std::max(1, threads);
  std::vector<uLong> crc(parts);
  std::vector<int64_t> len(parts);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t b, e;
    part_range(nbytes, parts, static_cast<int>(k), &b, &e);
    uLong c = crc32(0L, Z_NULL, 0);
    // zlib takes uInt lengths: feed in < 4 GiB steps.
    for (int64_t p = b; p < e;) {
      const int64_t step = std::min<int64_t>(e - p, int64_t(1) << 30);
      c = crc32(c, data + p, static_cast<uInt>(step));
      p += step;
    }
    crc[k] = c;
    len[k] = e - b;
  });
  uLong total = crc[0];
  for (int k = 1; k < parts; ++k) total = crc32_combine(total, crc[k], static_cast<z_off_t>(len[k]));
  return static_cast<uint32_t>(total);
}

uint32_t split_histogram(const uint16_t* w, int64_t n, uint8_t* sm, int64_t* hist, int threads) {
  const int parts = n < (1 << 20) ? 1 : std::max(1, threads);
  std::vector<int64_t> local(static_cast<size_t>(parts) * HUFF_NUM_CTX * 256, 0);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t b, e;
    part_range(n, parts, static_cast<int>(k), &b, &e);
    // Four sub-histograms break the store-to-load dependency when neighbours share a bin.
    std::vector<uint32_t> h(4 * HUFF_NUM_CTX * 256, 0);
    int64_t* out = &local[static_cast<size_t>(k) * HUFF_NUM_CTX * 256];
    const int64_t flush_every = int64_t(1) << 30;  // keep uint32 bins from overflowing
    int64_t i = b;
    while (i < e) {
      const int64_t stop = std::min(e, i + flush_every);
      int64_t j = i;
      for (; j + 4 <= stop; j += 4) {
        for (int u = 0; u < 4; ++u) {
          const uint16_t x = w[j + u];
          const uint8_t s = sm_of(x);
          sm[j + u] = s;
          ++h[(u * HUFF_NUM_CTX + ctx_of(s)) * 256 + exp_of(x)];
        }
      }
      for (; j < stop; ++j) {
        const uint16_t x = w[j];
        const uint8_t s = sm_of(x);
        sm[j] = s;
        ++h[ctx_of(s) * 256 + exp_of(x)];
      }
      for (int u = 0; u < 4; ++u)
        for (int q = 0; q < HUFF_NUM_CTX * 256; ++q) {
          out[q] += h[u * HUFF_NUM_CTX * 256 + q];
          h[u * HUFF_NUM_CTX * 256 + q] = 0;
        }
      i = stop;
    }
  });
  for (int q = 0; q < HUFF_NUM_CTX * 256; ++q) {
    int64_t s = 0;
    for (int k = 0; k < parts; ++k) s += local[static_cast<size_t>(k) * HUFF_NUM_CTX * 256 + q];
    hist[q] = s;
  }
  return crc32_parallel(reinterpret_cast<const uint8_t*>(w), n * 2, threads);
}

void huffman_segment_bits(const uint16_t* w, const Grid& g, const uint8_t* lens, uint64_t* bits,
                          int threads) {
  const int64_t ng = g.n_groups(), nc = g.n_chunks();
  parallel_for(ng * nc, threads, 16, [&](int64_t s) {
    const int64_t c = s / ng, gi = s % ng;
    const int64_t r0 = gi * g.R, r1 = std::min(g.rows, r0 + g.R);
    const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
    uint64_t total = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* row = w + r * g.cols;
      for (int64_t k = k0; k < k1; ++k) {
        const uint16_t x = row[k];
        total += lens[ctx_of(sm_of(x)) * 256 + exp_of(x)];
      }
    }
    bits[s] = total;
  });
}

void huffman_encode(const uint16_t* w, const Grid& g, const uint8_t* lens, const uint16_t* codes,
                    const uint32_t* off, uint8_t* stream, int threads) {
  const int64_t ng = g.n_groups(), nc = g.n_chunks();
  // One table of (code << 4 | len) per (ctx, exponent) keeps the inner loop at one load.
  std::vector<uint32_t> tab(HUFF_NUM_CTX * 256);
  for (int i = 0; i < HUFF_NUM_CTX * 256; ++i) tab[i] = (uint32_t(codes[i]) << 4) | lens[i];
  parallel_for(ng * nc, threads, 16, [&](int64_t s) {
    const int64_t c = s / ng, gi = s % ng;
    const int64_t r0 = gi * g.R, r1 = std::min(g.rows, r0 + g.R);
    const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
    uint8_t* dst = stream + off[s];
    uint64_t acc = 0;  // pending bits, right-aligned
    int nacc = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* row = w + r * g.cols;
      for (int64_t k = k0; k < k1; ++k) {
        const uint16_t x = row[k];
        const uint32_t t = tab[ctx_of(sm_of(x)) * 256 + exp_of(x)];
        const int l = static_cast<int>(t & 0xF);
        acc = (acc << l) | (t >> 4);
        nacc += l;
        if (nacc >= 32) {
          nacc -= 32;
          const uint32_t word = static_cast<uint32_t>(acc >> nacc);
          dst[0] = uint8_t(word >> 24); dst[1] = uint8_t(word >> 16);
          dst[2] = uint8_t(word >> 8);  dst[3] = uint8_t(word);
          dst += 4;
        }
      }
    }
    while (nacc >= 8) { nacc -= 8; *dst++ = uint8_t(acc >> nacc); }
    if (nacc > 0) *dst++ = uint8_t(acc << (8 - nacc));  // zero padding to the byte boundary
  });
}

std::string huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           const Grid& g, const uint8_t* table, int exp_lo, int exp_hi,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out, int64_t out_stride, int threads) {
  const int n = exp_hi - exp_lo + 1;
  std::vector<uint16_t> lut(static_cast<size_t>(HUFF_NUM_CTX) * LUT_SIZE);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    if (!build_lut(table + t * n, n, exp_lo, &lut[t * LUT_SIZE], nullptr))
      return "invalid huffman code lengths for context " + std::to_string(t);
  const int64_t ng = g.n_groups();
  const int64_t nsel_g = g1 - g0, nsel_c = c1 - c0;
  // Offsets must be monotone and inside the stream before any segment is touched.
  const int64_t nseg = ng * g.n_chunks();
  if (static_cast<int64_t>(off[nseg]) + STREAM_SLACK_BYTES > stream_bytes)
    return "exponent stream is shorter than its offsets say (truncated?)";
  for (int64_t s = 0; s < nseg; ++s)
    if (off[s + 1] < off[s]) return "segment offsets are not ascending at segment " + std::to_string(s);
  std::atomic<int64_t> bad{-1};
  parallel_for(nsel_g * nsel_c, threads, 8, [&](int64_t i) {
    const int64_t c = c0 + i / nsel_g, gi = g0 + i % nsel_g;
    const int64_t s = c * ng + gi;
    const int64_t r0 = gi * g.R, r1 = std::min(g.rows, r0 + g.R);
    const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
    const int64_t lr = r0 - g0 * g.R, lk = k0 - c0 * g.C;
    const uint64_t used = decode_segment(stream + off[s], lut.data(), sm + lr * sm_stride + lk,
                                         sm_stride, out + lr * out_stride + lk, out_stride,
                                         static_cast<int>(r1 - r0), static_cast<int>(k1 - k0));
    const uint64_t have = uint64_t(off[s + 1] - off[s]);
    if (used == ~uint64_t(0) || (used + 7) / 8 != have) {
      int64_t expect = -1;
      bad.compare_exchange_strong(expect, s);
    }
  });
  if (bad.load() >= 0) {
    const int64_t s = bad.load();
    return "corrupt exponent stream in segment " + std::to_string(s) + " (chunk " +
           std::to_string(s / ng) + ", row group " + std::to_string(s % ng) + ")";
  }
  return "";
}

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
  const int64_t n = r1 - r0;
  std::atomic<int> bad{0};
  parallel_for(n, threads, 64, [&](int64_t lr) {
    const uint8_t* srow = sm + lr * cols;
    const uint8_t* irow = idx + lr * ib;
    uint16_t* orow = out + lr * cols;
    uint32_t seen = 0;
    for (int64_t c = 0; c < cols; ++c) {
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
