// Host buffers for decoded and split tensors (host_alloc.h).
#include "host_alloc.h"

#include <pthread.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "thread_pool.h"

namespace unweight {
using namespace detail;

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

}  // namespace unweight
