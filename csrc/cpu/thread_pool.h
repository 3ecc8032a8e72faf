// Work splitting of the CPU codec: every entry point is parallel over independent units
// (segments, row ranges, slices) on `threads` workers, the caller's thread among them.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace unweight {
namespace detail {

// Runs fn on the calling thread and on up to `helpers` parked pool threads (thread_pool.cpp);
// returns when every thread that started fn has finished.  fn must tolerate helpers that
// join late or never.
void run_on_pool(int helpers, const std::function<void()>& fn);

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
  run_on_pool(workers - 1, std::function<void()>(work));
}

// Splits [0, n) into `parts` contiguous ranges.
inline void part_range(int64_t n, int parts, int k, int64_t* b, int64_t* e) {
  *b = n * k / parts;
  *e = n * (k + 1) / parts;
}

}  // namespace detail
}  // namespace unweight
