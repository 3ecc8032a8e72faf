// Compress side of the Huffman tier (huffman_encode.h): plane split + context histogram,
// package-merge code lengths, and the segment encoder.
#include "huffman_encode.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "../decode_primitives.h"
#include "crc32.h"
#include "thread_pool.h"

namespace unweight {
using namespace detail;

// Histogram key of a BF16 word: bits [14:5] = exponent << 2 | top two mantissa bits, i.e.
// exp * 4 + ctx, from one shift and one mask (the C++ side keeps this "exp-major" order
// internally and transposes to [ctx][exp] at the API boundary).
static inline uint32_t hkey(uint16_t w) { return (w >> 5) & 0x3FFu; }

uint32_t split_histogram(const uint16_t* w, int64_t n, uint8_t* sm, int64_t* hist, int threads) {
  // Split from 256K weights (384x1536 on 2 threads: +55% measured); at 147K the pool's
  // hand-off cost about what it saved.
  const int parts = n < (1 << 18) ? 1 : std::max(1, threads);
  std::vector<int64_t> local(static_cast<size_t>(parts) * 1024, 0);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t b, e;
    part_range(n, parts, static_cast<int>(k), &b, &e);
    const uint16_t* __restrict wp = w;
    uint8_t* __restrict sp = sm;
    // Plane split first: a pure map the compiler vectorizes.
    for (int64_t i = b; i < e; ++i) sp[i] = sm_of(wp[i]);
    // Then the histogram, four sub-histograms so that equal neighbours do not serialize on
    // one counter's store-to-load forwarding.
    std::vector<uint32_t> h(4 * 1024, 0);
    int64_t* out = &local[static_cast<size_t>(k) * 1024];
    const int64_t flush_every = int64_t(1) << 30;  // keeps uint32 counters from overflowing
    for (int64_t i = b; i < e;) {
      const int64_t stop = std::min(e, i + flush_every);
      int64_t j = i;
      for (; j + 4 <= stop; j += 4) {
        ++h[hkey(wp[j])];
        ++h[1024 + hkey(wp[j + 1])];
        ++h[2048 + hkey(wp[j + 2])];
        ++h[3072 + hkey(wp[j + 3])];
      }
      for (; j < stop; ++j) ++h[hkey(wp[j])];
      for (int q = 0; q < 1024; ++q) {
        out[q] += int64_t(h[q]) + h[1024 + q] + h[2048 + q] + h[3072 + q];
        h[q] = h[1024 + q] = h[2048 + q] = h[3072 + q] = 0;
      }
      i = stop;
    }
  });
  for (int q = 0; q < 1024; ++q) {
    int64_t t = 0;
    for (int k = 0; k < parts; ++k) t += local[static_cast<size_t>(k) * 1024 + q];
    hist[(q & 3) * 256 + (q >> 2)] = t;  // [ctx][exp]
  }
  return crc32_parallel(reinterpret_cast<const uint8_t*>(w), n * 2, threads);
}

void code_lengths(const int64_t* counts, int n, int max_len, uint8_t* out) {
  struct Item { int64_t w; int leaf; };  // leaf < 0: a package of two items of the level below
  std::vector<Item> leaves;
  for (int i = 0; i < n; ++i) {
    out[i] = 0;
    if (counts[i] > 0) leaves.push_back({counts[i], i});
  }
  const int m = static_cast<int>(leaves.size());
  if (m == 0) return;
  if (m == 1) { out[leaves[0].leaf] = 1; return; }
  if (m > (1 << max_len)) throw std::invalid_argument("too many symbols for the code length limit");
  std::stable_sort(leaves.begin(), leaves.end(), [](const Item& a, const Item& b) { return a.w < b.w; });
  std::vector<std::vector<Item>> lists(max_len);
  lists[0] = leaves;
  for (int l = 1; l < max_len; ++l) {
    const auto& prev = lists[l - 1];
    std::vector<Item> pk;
    for (size_t i = 0; i + 1 < prev.size(); i += 2) pk.push_back({prev[i].w + prev[i + 1].w, -1});
    auto& cur = lists[l];
    size_t a = 0, b = 0;
    while (a < leaves.size() || b < pk.size()) {
      if (b == pk.size() || (a < leaves.size() && leaves[a].w <= pk[b].w)) cur.push_back(leaves[a++]);
      else cur.push_back(pk[b++]);
    }
  }
  // Walk back down: the first `take` items of a level are chosen; each chosen leaf gains one
  // bit, and p chosen packages choose the first 2p items of the level below.
  int take = 2 * m - 2;
  for (int l = max_len - 1; l >= 0 && take > 0; --l) {
    int packages = 0;
    for (int i = 0; i < take; ++i) {
      const Item& it = lists[l][i];
      if (it.leaf >= 0) ++out[it.leaf];
      else ++packages;
    }
    take = 2 * packages;
  }
}

namespace {
// MSB-first bit writer: `acc` holds the `n` pending bits right-aligned (bits above them are
// stale and never read).  Up to 4 codes (<= 48 bits) go in between flushes, since a flush
// leaves n < 8, so put() is a shift, an or and an add with no branch; flush() stores 8 bytes
// unconditionally and advances by whole bytes.
struct BitWriter {
  uint64_t acc = 0;
  int n = 0;
  uint8_t* out = nullptr;
  inline void put(uint32_t code, int len) {
    acc = (acc << len) | code;
    n += len;
  }
  inline void flush() {
    const uint64_t be = __builtin_bswap64(n ? acc << (64 - n) : 0);
    std::memcpy(out, &be, 8);
    out += n >> 3;
    n &= 7;
  }
  inline void finish() {  // pending bits, zero-padded to a byte boundary
    flush();
    if (n) { *out++ = static_cast<uint8_t>(acc << (8 - n)); n = 0; }
  }
};

// Worst-case bytes of a segment of `count` weights, plus room for the 8-byte stores.
inline size_t seg_capacity(int64_t count) {
  return static_cast<size_t>((count * HUFF_MAX_CODE_LEN + 7) / 8 + 16);
}

constexpr int ENC_WAYS = 2;

// Encodes segments [s, s + k) (k <= ENC_WAYS, same chunk, consecutive row groups) and appends
// them, in order, to `dst`, recording each one's byte size.  A full run drives ENC_WAYS
// writers in lockstep so their shift/or chains overlap (more ways spill registers on
// x86-64).  tab[hkey] = code << 4 | len.
void encode_run(const uint16_t* w, const Grid& g, int64_t s, int k, const uint32_t* tab,
                std::vector<uint8_t>* scratch, std::vector<uint8_t>* dst,
                std::vector<uint32_t>* sizes) {
  const int64_t ng = g.n_groups();
  const int64_t c = s / ng, gi0 = s % ng;
  const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
  const int cols = static_cast<int>(k1 - k0);
  const bool full = k == ENC_WAYS && (gi0 + ENC_WAYS) * g.R <= g.rows;
  BitWriter bw[ENC_WAYS];
  int64_t rows[ENC_WAYS];
  size_t cap = 0;
  #pragma GCC unroll 8
  for (int j = 0; j < k; ++j) {
    const int64_t r0 = (gi0 + j) * g.R;
    rows[j] = std::min(g.rows, r0 + g.R) - r0;
    cap = std::max(cap, seg_capacity(rows[j] * cols));
  }
  if (scratch->size() < ENC_WAYS * cap) scratch->resize(ENC_WAYS * cap);
  #pragma GCC unroll 8
  for (int j = 0; j < k; ++j) bw[j].out = scratch->data() + j * cap;
  if (full) {
    const uint16_t* wr = w + gi0 * g.R * g.cols + k0;
    const int64_t seg = g.R * g.cols;  // distance between the ways' rows
    for (int64_t r = 0; r < g.R; ++r, wr += g.cols) {
      int q = 0;
      for (; q + 4 <= cols; q += 4) {
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t)
#pragma GCC unroll 8
          for (int j = 0; j < ENC_WAYS; ++j) {
            const uint32_t e = tab[hkey(wr[j * seg + q + t])];
            bw[j].put(e >> 4, static_cast<int>(e & 0xF));
          }
#pragma GCC unroll 8
        for (int j = 0; j < ENC_WAYS; ++j) bw[j].flush();
      }
      for (; q < cols; ++q)
        #pragma GCC unroll 8
        for (int j = 0; j < ENC_WAYS; ++j) {
          const uint32_t e = tab[hkey(wr[j * seg + q])];
          bw[j].put(e >> 4, static_cast<int>(e & 0xF));
          bw[j].flush();
        }
    }
  } else {
    #pragma GCC unroll 8
    for (int j = 0; j < k; ++j) {
      const uint16_t* wr = w + (gi0 + j) * g.R * g.cols + k0;
      for (int64_t r = 0; r < rows[j]; ++r, wr += g.cols)
        for (int q = 0; q < cols; ++q) {
          const uint32_t e = tab[hkey(wr[q])];
          bw[j].put(e >> 4, static_cast<int>(e & 0xF));
          bw[j].flush();
        }
    }
  }
  #pragma GCC unroll 8
  for (int j = 0; j < k; ++j) {
    bw[j].finish();
    const uint8_t* base = scratch->data() + j * cap;
    const size_t len = static_cast<size_t>(bw[j].out - base);
    dst->insert(dst->end(), base, base + len);
    sizes->push_back(static_cast<uint32_t>(len));
  }
}
}  // namespace

void huffman_encode_all(const uint16_t* w, const Grid& g, const uint8_t* lens, const uint16_t* codes,
                        std::vector<uint32_t>* off, std::vector<uint8_t>* stream, int threads,
                        int64_t chk_interval, int64_t chk_cols, uint16_t* chk) {
  const int64_t nseg = g.n_groups() * g.n_chunks();
  std::vector<uint32_t> tab(1024);
  for (int q = 0; q < 1024; ++q) {
    const int ctx = q & 3, e = q >> 2;
    tab[q] = (uint32_t(codes[ctx * 256 + e]) << 4) | lens[ctx * 256 + e];
  }
  // Contiguous runs of segments per part, each encoded into its own buffer; the parts are
  // then concatenated, so the output needs no size pass and no worst-case allocation.  Parts
  // hold whole ENC_WAYS-segment runs: a part of one segment would encode it one way at a
  // time, which on a small matrix cost as much as the second thread gained.  Several parts
  // per thread keep each buffer small enough for malloc to hand out reused memory.
  const int64_t nruns = (nseg + ENC_WAYS - 1) / ENC_WAYS;
  const int parts = static_cast<int>(std::min<int64_t>(nruns, int64_t(std::max(1, threads)) * 8));
  std::vector<std::vector<uint8_t>> buf(parts);
  std::vector<std::vector<uint32_t>> sizes(parts);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t rb, re;
    part_range(nruns, parts, static_cast<int>(k), &rb, &re);
    const int64_t b = rb * ENC_WAYS, e = std::min(nseg, re * ENC_WAYS);
    buf[k].reserve(static_cast<size_t>((e - b) * g.R * g.C * 3 / 8 + 64));
    std::vector<uint8_t> scratch;
    for (int64_t s = b; s < e;) {
      // Runs of up to 4 row groups that stay inside one chunk.
      const int64_t ng = g.n_groups();
      const int run = static_cast<int>(std::min<int64_t>({ENC_WAYS, e - s, ng - s % ng}));
      encode_run(w, g, s, run, tab.data(), &scratch, &buf[k], &sizes[k]);
      s += run;
    }
  });
  off->assign(static_cast<size_t>(nseg + 1), 0);
  uint64_t pos = 0;
  int64_t s = 0;
  for (int k = 0; k < parts; ++k)
    for (uint32_t sz : sizes[k]) {
      (*off)[s++] = static_cast<uint32_t>(pos);
      pos += sz;
      if (pos + STREAM_SLACK_BYTES > 0xFFFFFFFFull) throw std::length_error("exponent stream exceeds 4 GiB");
    }
  (*off)[nseg] = static_cast<uint32_t>(pos);
  stream->assign(static_cast<size_t>(pos + STREAM_SLACK_BYTES), 0);
  std::vector<uint64_t> base(parts + 1, 0);
  for (int k = 0; k < parts; ++k) base[k + 1] = base[k] + buf[k].size();
  parallel_for(parts, threads, 1, [&](int64_t k) {
    if (!buf[k].empty()) std::memcpy(stream->data() + base[k], buf[k].data(), buf[k].size());
  });
  // The index is a function of the code lengths alone: the same builder a loader runs.
  if (chk) huffman_index(w, g, lens, threads, chk_interval, chk_cols, chk);
}

void huffman_index(const uint16_t* w, const Grid& g, const uint8_t* lens, int threads, int64_t chk_interval,
                   int64_t chk_cols, uint16_t* chk) {
  if (chk_interval <= 0 || chk_cols <= 0) return;
  const int64_t S = chk_interval, ng = g.n_groups(), nseg = ng * g.n_chunks();
  // lens[ctx * 256 + exp] reordered by hkey (exp << 2 | ctx), the key of one BF16 word
  uint8_t len_of[1024];
  for (int q = 0; q < 1024; ++q) len_of[q] = lens[(q & 3) * 256 + (q >> 2)];
  parallel_for(nseg, threads, 1, [&](int64_t s) {
    const int64_t c = s / ng, r0 = (s % ng) * g.R, r1 = std::min(g.rows, r0 + g.R);
    const int64_t k0 = c * g.C, width = std::min(g.cols, k0 + g.C) - k0;
    uint16_t* row = chk + s * chk_cols;
    // bits: the bit position of the next symbol; idx: its index in the segment.  Between
    // checkpoints the lengths are summed in runs with no per-symbol test.
    int64_t bits = 0, last = 0, idx = 0, next = S;
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* wr = w + r * g.cols + k0;
      int64_t q = 0;
      while (q < width) {
        const int64_t n = std::min(width - q, next - idx);
        uint32_t run = 0;
        for (int64_t j = 0; j < n; ++j) run += len_of[hkey(wr[q + j])];
        bits += run;
        q += n;
        idx += n;
        if (idx == next) {
          if (idx < (r1 - r0) * width) row[next / S - 1] = static_cast<uint16_t>(bits - last);
          last = bits;
          next += S;
        }
      }
    }
  });
}

}  // namespace unweight
