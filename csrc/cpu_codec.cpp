// C++ CPU codec of unweight format v1.  What the bits mean (canonical tables, contexts, BF16
// assembly) comes from the shared primitives of decode_primitives.h, the same ones the CUDA
// kernels use; the CPU Huffman decoder reads bits with its own sentinel-bit reader (below).
#include "cpu_codec.h"

#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <pthread.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "decode_primitives.h"

namespace unweight {
namespace {

// Persistent worker threads.  Spawning and joining threads on every call cost ~50 us, as
// much as decoding a whole 384 x 384 matrix, so small tensors ran no faster on 2 threads than
// on 1; the pool keeps its threads parked on a condition variable between calls.  One job
// runs at a time: a caller that finds the pool busy (another Python thread, or a nested
// call) falls back to plain threads.  After fork() the child starts a fresh pool, since the
// parent's threads do not exist there.
class ThreadPool {
 public:
  static ThreadPool& get() {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { instance() = nullptr; }); });
    ThreadPool*& p = instance();
    if (!p) p = new ThreadPool();  // never destroyed: parked threads end with the process
    return *p;
  }
  // Runs fn on the calling thread and on up to `helpers` pool threads; returns when every
  // thread that started fn has finished.  fn must tolerate helpers that join late or never.
  void run(int helpers, const std::function<void()>& fn) {
    std::unique_lock<std::mutex> own(busy_, std::try_to_lock);
    if (!own.owns_lock()) {
      std::vector<std::thread> ts;
      for (int t = 0; t < helpers; ++t) ts.emplace_back(fn);
      fn();
      for (auto& t : ts) t.join();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      // A new thread starts from the generation before this job's, so it takes part in it.
      while (static_cast<int>(threads_.size()) < helpers) threads_.emplace_back([this, g = gen_] { loop(g); });
      job_ = &fn;
      wanted_ = helpers;
      ++gen_;
    }
    start_.notify_all();
    fn();
    std::unique_lock<std::mutex> lk(mu_);
    wanted_ = 0;  // helpers that have not woken yet are not needed any more
    done_.wait(lk, [this] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  static ThreadPool*& instance() {
    static ThreadPool* p = nullptr;
    return p;
  }
  void loop(uint64_t seen) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      start_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (wanted_ == 0) continue;
      --wanted_;
      ++running_;
      const std::function<void()>* fn = job_;
      lk.unlock();
      (*fn)();
      lk.lock();
      if (--running_ == 0) done_.notify_all();
    }
  }
  std::mutex busy_, mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  const std::function<void()>* job_ = nullptr;
  uint64_t gen_ = 0;
  int wanted_ = 0, running_ = 0;
};

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
  ThreadPool::get().run(workers - 1, std::function<void()>(work));
}

// Splits [0, n) into `parts` contiguous ranges.
inline void part_range(int64_t n, int parts, int k, int64_t* b, int64_t* e) {
  *b = n * k / parts;
  *e = n * (k + 1) / parts;
}

constexpr int FAST_BITS = 9;

// Tests set this to run the baseline builds (no AVX2/BMI2 decode loop, zlib's crc32) on a
// machine that has the faster ones, so both are checked on one machine.
std::atomic<bool> g_force_baseline{false};

}  // namespace

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

// Host buffers for decoded tensors.  NumPy's own arrays are not used: it advises
// MADV_HUGEPAGE on every array >= 4 MiB, which with THP "defrag=madvise" can stall a first
// touch in direct compaction (measured here: a 117 MB decode fell from 0.85 to 0.60 GB/s in
// a loop), and a fresh mapping pays a page fault per 4 KiB on first touch (~0.5 ns per byte
// here, as much as decoding).
//  * Below kBigMin: malloc, which reuses its freed small blocks.
//  * From kBigMin: a mapping whose pages are faulted in up front, in bulk and split across
//    the threads (MADV_POPULATE_WRITE, Linux 5.14+; elsewhere they fault in on first touch):
//    0.30-0.36 vs 0.42-0.52 ns per byte on one thread, 0.19-0.22 vs 0.28-0.31 on two,
//    measured here on 117 MB.  Freed big buffers are kept, up to kCacheBytes in all, and handed
//    out again for a request of the same size or up to a quarter smaller, with no page
//    touched: decoding a model tensor by tensor asks for the same few sizes over and over.
//    (glibc's malloc only does this below its 32 MiB mmap threshold, and only while its heap
//    top is free; measured, a 23 MB output faulted in afresh on most calls.)  The cache is
//    released by host_cache_clear() and never holds more than kCacheBytes.
constexpr size_t kBigMin = size_t(4) << 20;
constexpr size_t kCacheBytes = size_t(128) << 20;

namespace {
// A mutex fork() copies while another thread holds it would stay locked in the child, so the
// lock is taken around fork (the critical sections are a few list operations).
std::mutex& cache_mu() {
  static std::mutex* mu = [] {
    pthread_atfork([] { cache_mu().lock(); }, [] { cache_mu().unlock(); }, [] { cache_mu().unlock(); });
    return new std::mutex;
  }();
  return *mu;
}
std::vector<std::pair<void*, size_t>> g_cache;  // (mapping, size), oldest first
size_t g_cache_total = 0;
}  // namespace

void* host_alloc(size_t n, int threads, size_t* cap) {
  n = std::max<size_t>(n, 1);
  *cap = n;
#if defined(__linux__)
  if (n >= kBigMin) {
    const size_t page = 4096, size = (n + page - 1) / page * page;
    {
      std::lock_guard<std::mutex> lock(cache_mu());
      for (size_t i = g_cache.size(); i-- > 0;) {
        const size_t have = g_cache[i].second;
        if (have >= size && have - size <= size / 4) {
          void* p = g_cache[i].first;
          g_cache.erase(g_cache.begin() + static_cast<std::ptrdiff_t>(i));
          g_cache_total -= have;
          *cap = have;
          return p;
        }
      }
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    constexpr size_t kSlice = size_t(8) << 20;  // page-aligned, as madvise needs
    const int64_t slices = static_cast<int64_t>((size + kSlice - 1) / kSlice);
    parallel_for(slices, threads, 1, [&](int64_t k) {
      const size_t b = static_cast<size_t>(k) * kSlice;
      madvise(static_cast<char*>(p) + b, std::min(kSlice, size - b), MADV_POPULATE_WRITE);  // advisory
    });
    *cap = size;
    return p;
  }
#endif
  return std::malloc(n);
}

void host_free(void* p, size_t cap) {
  if (!p) return;
#if defined(__linux__)
  if (cap >= kBigMin) {
    std::vector<std::pair<void*, size_t>> drop;
    {
      std::lock_guard<std::mutex> lock(cache_mu());
      if (cap <= kCacheBytes) {
        g_cache.emplace_back(p, cap);
        g_cache_total += cap;
        p = nullptr;
      }
      while (g_cache_total > kCacheBytes) {  // oldest out first
        drop.push_back(g_cache.front());
        g_cache_total -= g_cache.front().second;
        g_cache.erase(g_cache.begin());
      }
    }
    if (p) munmap(p, cap);
    for (auto& d : drop) munmap(d.first, d.second);
    return;
  }
#endif
  std::free(p);
}

size_t host_cache_clear() {
  std::vector<std::pair<void*, size_t>> drop;
  {
    std::lock_guard<std::mutex> lock(cache_mu());
    drop.swap(g_cache);
    g_cache_total = 0;
  }
  size_t freed = 0;
#if defined(__linux__)
  for (auto& d : drop) {
    munmap(d.first, d.second);
    freed += d.second;
  }
#endif
  return freed;
}

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
                        std::vector<uint32_t>* off, std::vector<uint8_t>* stream, int threads) {
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
}

namespace {
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

#if defined(__x86_64__) && defined(__GNUC__)
#define UW_HAVE_AVX2_PATH 1
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
#if defined(__x86_64__) && defined(__GNUC__)
template <int W>
__attribute__((target("avx2,bmi,bmi2"))) bool decode_ways_avx2(UW_DECODE_ARGS) {
  return decode_ways_body<W, true>(UW_DECODE_PASS);
}
inline bool cpu_has_avx2_bmi2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  return ok && !g_force_baseline.load(std::memory_order_relaxed);
}
#endif
template <int W>
bool decode_ways(UW_DECODE_ARGS) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx2_bmi2()) return decode_ways_avx2<W>(UW_DECODE_PASS);
#endif
  return decode_ways_base<W>(UW_DECODE_PASS);
}
#undef UW_DECODE_ARGS
#undef UW_DECODE_PASS
}  // namespace

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

void set_force_baseline_cpu(bool on) { g_force_baseline.store(on); }

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
