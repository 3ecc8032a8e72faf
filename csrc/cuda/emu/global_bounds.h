// The global buffers an emulated launch may touch (warp_emu.h checks its kernel bodies' global
// accesses against them).  Plain C++: the bindings, compiled without nvcc, open the scope.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace unweight {
namespace emu {

// The global buffers launches on this OS thread may touch, while a GlobalBounds is alive: an
// emulation's caller names every buffer it hands the kernel, [start, start + bytes), so a read
// a byte past a plane's end fails the launch (on a GPU it may read another allocation, or
// fault).  Scopes do not nest.
struct GlobalRanges {
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  // Buffers an earlier launch on the stream writes or reads (x, y, the scratch counters): a
  // kernel that may start before that launch ends (programmatic dependent launch) touches them
  // only after its grid-dependency wait.
  std::vector<std::pair<uintptr_t, uintptr_t>> after_wait;
  static bool in(const std::vector<std::pair<uintptr_t, uintptr_t>>& v, const void* p, size_t n) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (const auto& [lo, hi] : v)
      if (a >= lo && a + n <= hi) return true;
    return false;
  }
  bool contains(const void* p, size_t n) const { return in(r, p, n); }
  bool needs_wait(const void* p, size_t n) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (const auto& [lo, hi] : after_wait)
      if (a < hi && a + n > lo) return true;
    return false;
  }
};
inline const GlobalRanges*& global_ranges() {
  static thread_local const GlobalRanges* g = nullptr;
  return g;
}
class GlobalBounds {
 public:
  GlobalBounds(std::initializer_list<std::pair<const void*, size_t>> bufs) {
    for (const auto& [p, n] : bufs)
      if (p != nullptr && n > 0) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        ranges_.r.emplace_back(a, a + n);
      }
    global_ranges() = &ranges_;
  }
  // Names [p, p + n) as one more buffer of the launch.
  void add(const void* p, size_t n) {
    if (p == nullptr || n == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    ranges_.r.emplace_back(a, a + n);
  }
  // Marks [p, p + n) as a buffer the kernel may touch only after its grid-dependency wait (and
  // names it as a buffer of the launch).
  void after_wait(const void* p, size_t n) {
    if (p == nullptr || n == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    ranges_.r.emplace_back(a, a + n);
    ranges_.after_wait.emplace_back(a, a + n);
  }
  ~GlobalBounds() { global_ranges() = nullptr; }
  GlobalBounds(const GlobalBounds&) = delete;
  GlobalBounds& operator=(const GlobalBounds&) = delete;

 private:
  GlobalRanges ranges_;
};

}  // namespace emu
}  // namespace unweight
