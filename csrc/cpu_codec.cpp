// C++ CPU codec of unweight format v1.  Decode loops call the shared primitives of
// decode_primitives.h, the same ones the CUDA kernels use.
#include "cpu_codec.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
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

constexpr int FAST_BITS = 8;

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

// Histogram key of a BF16 word: bits [14:5] = exponent << 2 | top two mantissa bits, i.e.
// exp * 4 + ctx, from one shift and one mask (the C++ side keeps this "exp-major" order
// internally and transposes to [ctx][exp] at the API boundary).
static inline uint32_t hkey(uint16_t w) { return (w >> 5) & 0x3FFu; }

uint32_t split_histogram(const uint16_t* w, int64_t n, uint8_t* sm, int64_t* hist, int threads) {
  const int parts = n < (1 << 20) ? 1 : std::max(1, threads);
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
                        std::vector<uint32_t>* off, std::vector<uint8_t>* stream, int threads) {
  const int64_t nseg = g.n_groups() * g.n_chunks();
  std::vector<uint32_t> tab(1024);
  for (int q = 0; q < 1024; ++q) {
    const int ctx = q & 3, e = q >> 2;
    tab[q] = (uint32_t(codes[ctx * 256 + e]) << 4) | lens[ctx * 256 + e];
  }
  // Contiguous runs of segments per part, each encoded into its own buffer; the parts are
  // then concatenated, so the output needs no size pass and no worst-case allocation.
  const int parts = static_cast<int>(std::min<int64_t>(nseg, std::max(1, threads) * 8));
  std::vector<std::vector<uint8_t>> buf(parts);
  std::vector<std::vector<uint32_t>> sizes(parts);
  parallel_for(parts, threads, 1, [&](int64_t k) {
    int64_t b, e;
    part_range(nseg, parts, static_cast<int>(k), &b, &e);
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
}

namespace {
constexpr int WAYS = 2;

// refill_bounded on a copy: passing the readers by value keeps their address from being
// taken, so the compiler can hold them in registers across the whole decode loop.
inline BitReader refilled_bounded(BitReader b, const uint8_t* end) {
  refill_bounded(b, end);
  return b;
}

// Decodes W same-shaped segments in lockstep: rows x cols weights each, segment j's sign+
// mantissa rows at sm + j*sm_seg + r*sm_stride, output likewise.  Exponents of a row go to a
// small buffer first and the BF16 words are assembled in a separate vectorizable pass, which
// keeps the serial decode loop at about a dozen instructions per symbol.  `used[j]` receives
// the bits consumed; returns false on an invalid code.
template <int W>
bool decode_ways(const uint8_t* const* starts, const uint8_t* stream_end, const uint32_t* PP,
                 const uint16_t* P, const uint16_t* L, const uint8_t* sm, int64_t sm_seg, int64_t sm_stride, uint16_t* out,
                 int64_t out_seg, int64_t out_stride, int rows, int cols, uint64_t* used) {
  const uint8_t* lim = stream_end - 8;
  BitReader br[W];
  #pragma GCC unroll 8
  for (int j = 0; j < W; ++j) {
    br[j].p = starts[j];
    br[j].window = 0;
    br[j].nbits = 0;
    // (The bounded refill may leave 64 bits; the 8-byte refill needs nbits <= 63, which holds
    // at every later refill because each step consumes at least 4 bits.)
    if (starts[j] <= lim) br[j].refill();
    else br[j] = refilled_bounded(br[j], stream_end);
  }
  std::vector<uint8_t> ebuf(static_cast<size_t>(W) * cols + 8);
  uint32_t bad = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* srow = sm + r * sm_stride;
    uint8_t* eb = ebuf.data();
    int k = 0;
    for (; k + 4 <= cols; k += 4) {
      // The 8-byte refill is legal while p <= lim; past that (the stream's last bytes, or a
      // corrupt segment asking for more bits than exist) the byte-wise bounded refill feeds
      // zeros, and the caller's consumed-bit check rejects a segment that overran.
      bool near_end = false;
#pragma GCC unroll 8
      for (int j = 0; j < W; ++j) near_end |= br[j].p > lim;
      if (__builtin_expect(!near_end, 1)) {
#pragma GCC unroll 8
        for (int j = 0; j < W; ++j) br[j].refill();
      } else {
        #pragma GCC unroll 8
        for (int j = 0; j < W; ++j) {
          if (br[j].p <= lim) br[j].refill();
          else br[j] = refilled_bounded(br[j], stream_end);
        }
      }
      // A refill leaves >= 56 bits; 4 codes use <= 48.  Weights go in pairs: one lookup
      // indexed by both weights' contexts yields both exponents for most pairs.
#pragma GCC unroll 2
      for (int t = 0; t < 4; t += 2)
#pragma GCC unroll 8
        for (int j = 0; j < W; ++j) {
          uint16_t two;
          std::memcpy(&two, srow + j * sm_seg + k + t, 2);
          // ctx of the first weight in bits [9:8], of the second in [11:10]: the two
          // mantissa-bit pairs sit at bits 5-6 and 13-14; *65 copies the first next to the
          // second without overlap.
          const uint32_t ci = ((static_cast<uint32_t>(two & 0x6060u) * 65u) >> 3) & 0xF00u;
          const uint32_t e = PP[ci | static_cast<uint32_t>(br[j].window >> (64 - FAST_BITS))];
          if (__builtin_expect(e != 0, 1)) {
            br[j].consume(e & 0xFFu);
            const uint16_t ex = static_cast<uint16_t>(e >> 16);
            std::memcpy(eb + j * cols + k + t, &ex, 2);
            continue;
          }
          for (int h = 0; h < 2; ++h) {
            const uint8_t sv = srow[j * sm_seg + k + t + h];
            uint32_t f = P[(ctx_of(sv) << FAST_BITS) | static_cast<uint32_t>(br[j].window >> (64 - FAST_BITS))];
            if (!f) {
              const uint16_t q = L[(ctx_of(sv) << HUFF_MAX_CODE_LEN) | br[j].peek()];
              bad |= (q == 0);
              f = (lut_sym(q) << 8) | lut_len(q);
            }
            br[j].consume(f & 0xFFu);
            eb[j * cols + k + t + h] = static_cast<uint8_t>(f >> 8);
          }
        }
    }
    for (; k < cols; ++k)
      #pragma GCC unroll 8
      for (int j = 0; j < W; ++j) {
        if (br[j].nbits < HUFF_MAX_CODE_LEN) {
          if (br[j].p <= lim) br[j].refill();
          else br[j] = refilled_bounded(br[j], stream_end);
        }
        const uint8_t sv = srow[j * sm_seg + k];
        const uint16_t f = L[(ctx_of(sv) << HUFF_MAX_CODE_LEN) | br[j].peek()];
        bad |= (f == 0);
        br[j].consume(lut_len(f));
        eb[j * cols + k] = static_cast<uint8_t>(lut_sym(f));
      }
    #pragma GCC unroll 8
    for (int j = 0; j < W; ++j) {
      const uint8_t* __restrict sp = srow + j * sm_seg;
      const uint8_t* __restrict ep = eb + j * cols;
      uint16_t* __restrict o = out + j * out_seg + r * out_stride;
      for (int q = 0; q < cols; ++q) o[q] = bf16_from_parts(sp[q], ep[q]);
    }
  }
  #pragma GCC unroll 8
  for (int j = 0; j < W; ++j) used[j] = br[j].consumed(starts[j]);
  return bad == 0;
}
}  // namespace

std::string huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           const Grid& g, const uint8_t* table, int exp_lo, int exp_hi,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out, int64_t out_stride, int threads) {
  const int n = exp_hi - exp_lo + 1;
  std::vector<uint16_t> lut(static_cast<size_t>(HUFF_NUM_CTX) * LUT_SIZE);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    if (!build_lut(table + t * n, n, exp_lo, &lut[t * LUT_SIZE], nullptr))
      return "invalid huffman code lengths for context " + std::to_string(t);
  // First-level table: entries of the full table whose code fits in FAST_BITS bits, else 0.
  std::vector<uint16_t> fast(static_cast<size_t>(HUFF_NUM_CTX) << FAST_BITS);
  for (int t = 0; t < HUFF_NUM_CTX; ++t)
    for (uint32_t i = 0; i < (1u << FAST_BITS); ++i) {
      const uint16_t e = lut[t * LUT_SIZE + (i << (HUFF_MAX_CODE_LEN - FAST_BITS))];
      fast[(t << FAST_BITS) | i] =
          (e && lut_len(e) <= FAST_BITS) ? static_cast<uint16_t>((lut_sym(e) << 8) | lut_len(e)) : 0;
    }
  // Pair table: for the contexts of two neighbouring weights and the next FAST_BITS bits,
  // both exponents when both codes fit in those bits (most pairs: codes average ~2.6 bits).
  // Entry [31:16] exp0 | exp1 << 8, [7:0] total length; 0 sends the pair to the slow path.
  std::vector<uint32_t> pair(static_cast<size_t>(HUFF_NUM_CTX * HUFF_NUM_CTX) << FAST_BITS, 0);
  for (int c0x = 0; c0x < HUFF_NUM_CTX; ++c0x)
    for (int c1x = 0; c1x < HUFF_NUM_CTX; ++c1x)
      for (uint32_t i = 0; i < (1u << FAST_BITS); ++i) {
        const uint16_t a = fast[(c0x << FAST_BITS) | i];
        if (!a) continue;
        const uint32_t la = a & 0xFF;
        const uint32_t rest = (i << la) & ((1u << FAST_BITS) - 1);  // bits after the first code
        const uint16_t b = fast[(c1x << FAST_BITS) | rest];
        if (!b || la + (b & 0xFFu) > FAST_BITS) continue;
        pair[((c0x | (c1x << 2)) << FAST_BITS) | i] =
            (static_cast<uint32_t>(a >> 8) << 16) | (static_cast<uint32_t>(b >> 8) << 24) | (la + (b & 0xFFu));
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
  const uint8_t* lim = stream_end - 8;
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
  const int64_t runs = (nsel_g + WAYS - 1) / WAYS;
  parallel_for(runs * nsel_c, threads, 1, [&](int64_t u) {
    const int64_t c = c0 + u / runs, q0 = g0 + (u % runs) * WAYS;
    const int64_t k0 = c * g.C, k1 = std::min(g.cols, k0 + g.C);
    const int64_t lk = k0 - c0 * g.C;
    const int cols = static_cast<int>(k1 - k0);
    const int64_t qn = std::min<int64_t>(WAYS, g1 - q0);
    const bool full = qn == WAYS && (q0 + WAYS) * g.R <= g.rows;
    if (!full) {
      for (int64_t gi = q0; gi < q0 + qn; ++gi) {
        const int64_t s = c * ng + gi;
        const int64_t r0 = gi * g.R, r1 = std::min(g.rows, r0 + g.R);
        const int64_t lr = r0 - g0 * g.R;
        // Bounded reads: a corrupt segment may ask for more bits than the stream holds.
        check(s, decode_segment_bounded<false>(stream + off[s], stream_end, lut.data(),
                                               sm + lr * sm_stride + lk, sm_stride,
                                               out + lr * out_stride + lk, nullptr, out_stride,
                                               static_cast<int>(r1 - r0), cols));
      }
      return;
    }
    const uint8_t* starts[WAYS];
    for (int j = 0; j < WAYS; ++j) starts[j] = stream + off[c * ng + q0 + j];
    const int64_t lr = q0 * g.R - g0 * g.R;
    uint64_t used[WAYS];
    const bool ok = decode_ways<WAYS>(starts, stream_end, pair.data(), fast.data(), lut.data(), sm + lr * sm_stride + lk,
                                      g.R * sm_stride, sm_stride, out + lr * out_stride + lk, g.R * out_stride,
                                      out_stride, static_cast<int>(g.R), cols, used);
    for (int j = 0; j < WAYS; ++j) check(c * ng + q0 + j, ok ? used[j] : ~uint64_t(0));
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
