// Host buffers for decoded and split tensors, in place of NumPy's own allocations; the
// policy (malloc, or pre-faulted pages with a bounded cache of freed ones) and the
// measurements behind it are in host_alloc.cpp.
#pragma once
#include <cstddef>

namespace unweight {

// Uninitialized host buffer of at least n bytes; *cap receives its capacity, which
// host_free(p, cap) needs back.  nullptr when out of memory.
void* host_alloc(size_t n, int threads, size_t* cap);
void host_free(void* p, size_t cap);
// Unmaps the cache of freed buffers; returns the bytes released.
size_t host_cache_clear();

}  // namespace unweight
