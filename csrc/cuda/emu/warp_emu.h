// Host emulator of CUDA thread-block semantics, for kernel bodies written against the
// context interface of ctx.cuh.  Lets CPU-only CI run a cooperative kernel (shuffles,
// ballots, shared memory with barriers, cp.async pipelines, mma.sync) exactly as written.
//
//     const char* err = emu::launch(grid_x, grid_y, threads, smem_bytes,
//                                   [&](emu::ThreadCtx& c) { body(c, args); });
//
// Model.  CTAs run one after another, x fastest (deterministic).  Inside a CTA every thread
// is a fiber (ucontext) on the calling OS thread; a fiber runs until it reaches a collective
// (a warp op, a barrier, an mma) and yields there until every participant has arrived, so
// all lanes see each other's values exactly as on the GPU.  What it checks, beyond running
// the body:
//   * a barrier or warp collective that some participant never reaches (a hang on the GPU)
//     ends the launch with an error instead of hanging;
//   * lanes of one warp calling a collective with different masks (undefined on the GPU) is
//     an error;
//   * cp.async is deferred: the source is read when the copy is issued but the bytes land in
//     shared memory only when a cp_async_wait<N> retires its group, so a body that reads a
//     stage before waiting for it reads stale bytes (tests see wrong results);
//   * shared memory starts filled with 0xA5, not zeros.
// What it does not model: memory races between threads (a missing syncwarp/syncthreads
// between a write and another thread's read is not detected: fibers share memory at once),
// timing, occupancy, and the exact rounding of the tensor cores (mma_bf16_16816 returns the
// exactly rounded fp32 value of c + sum of the 16 exact products; hardware adds in its own
// order and may differ in the last bits, so tests compare against references with bounds).
// Restrictions: 1-D blocks whose size is a multiple of 32, at most one warp collective in
// flight per warp (divergent halves of a warp may not run two collectives at once).
// Errors are static strings; every other call returns nullptr.
//
// Cost: a collective is a fiber switch per lane (swapcontext, ~1 us), so the emulator is for
// small shapes (thousands of collectives per test, not millions).
#pragma once
#include <ucontext.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ctx.cuh"

namespace unweight {
namespace emu {

class Cta;

// Bodies are __host__ __device__ templates, so nvcc's device pass also sees them
// instantiated for ThreadCtx: every method below is __host__ __device__ too, with a body that
// exists only in the host pass (the device pass never runs them).
#if defined(__CUDA_ARCH__)
#define UW_EMU_HOST_ONLY(...) __builtin_unreachable();
#else
#define UW_EMU_HOST_ONLY(...) __VA_ARGS__
#endif

// The per-thread context handed to a body on the host (see ctx.cuh for the interface).
class ThreadCtx {
 public:
  UW_HD int tid() const { return tid_; }
  UW_HD int lane() const { return tid_ & (kWarpSize - 1); }
  UW_HD int warp() const { return tid_ / kWarpSize; }
  UW_HD int nthreads() const { UW_EMU_HOST_ONLY(return h_nthreads();) }
  UW_HD int64_t block_x() const { UW_EMU_HOST_ONLY(return h_block(0);) }
  UW_HD int64_t block_y() const { UW_EMU_HOST_ONLY(return h_block(1);) }
  UW_HD int64_t grid_x() const { UW_EMU_HOST_ONLY(return h_block(2);) }
  UW_HD int64_t grid_y() const { UW_EMU_HOST_ONLY(return h_block(3);) }
  UW_HD unsigned char* smem() const { UW_EMU_HOST_ONLY(return h_smem();) }

  UW_HD void syncthreads() { UW_EMU_HOST_ONLY(h_syncthreads();) }
  UW_HD void syncwarp(unsigned mask = kFullMask) { UW_EMU_HOST_ONLY(exchange(mask, nullptr, 0);) }
  UW_HD void threadfence() {}
  UW_HD int atomic_add(int* p, int v) {  // fibers never run concurrently: a plain add is atomic
    const int old = *p;
    *p = old + v;
    return old;
  }
  template <class T>
  UW_HD T shfl(T v, int src, unsigned mask = kFullMask) { UW_EMU_HOST_ONLY(return h_shfl(v, src, mask);) }
  template <class T>
  UW_HD T shfl_xor(T v, int lanemask, unsigned mask = kFullMask) {
    UW_EMU_HOST_ONLY(return h_shfl(v, lane() ^ lanemask, mask);)
  }
  UW_HD unsigned ballot(bool p, unsigned mask = kFullMask) { UW_EMU_HOST_ONLY(return h_ballot(p, mask);) }
  UW_HD void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    UW_EMU_HOST_ONLY(h_mma(d, a, b, c);)
  }
  UW_HD void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
    UW_EMU_HOST_ONLY(h_cp_async16(smem_dst, gmem_src, src_bytes);)
  }
  UW_HD void cp_async_commit() { UW_EMU_HOST_ONLY(h_commit();) }
  template <int N>
  UW_HD void cp_async_wait() { UW_EMU_HOST_ONLY(h_wait(N);) }

  static constexpr int kSlotBytes = 48;  // largest per-lane payload: an mma's a, b, c

 private:
  friend class Cta;
  struct Copy {
    unsigned char* dst;
    unsigned char bytes[16];
  };
  inline int h_nthreads() const;
  inline int64_t h_block(int which) const;
  inline unsigned char* h_smem() const;
  inline void h_syncthreads();
  inline const unsigned char* exchange(unsigned mask, const void* in, size_t n);
  template <class T>
  T h_shfl(T v, int src, unsigned mask) {
    static_assert(sizeof(T) <= 8, "shfl of at most 8 bytes");
    const unsigned char* s = exchange(mask, &v, sizeof(T));
    T out;
    if (((mask >> (src & 31)) & 1u) == 0) {
      std::memset(&out, 0xA5, sizeof(T));  // undefined on the GPU: make it visible
    } else {
      std::memcpy(&out, s + kSlotBytes * (src & 31), sizeof(T));
    }
    return out;
  }
  unsigned h_ballot(bool p, unsigned mask) {
    const unsigned char b = p ? 1 : 0;
    const unsigned char* s = exchange(mask, &b, 1);
    unsigned r = 0;
    for (int l = 0; l < kWarpSize; ++l)
      if (((mask >> l) & 1u) && s[kSlotBytes * l]) r |= 1u << l;
    return r;
  }
  inline void h_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]);
  void h_cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
    Copy cp;
    cp.dst = static_cast<unsigned char*>(smem_dst);
    std::memset(cp.bytes, 0, 16);
    const int n = src_bytes < 0 ? 0 : (src_bytes > 16 ? 16 : src_bytes);
    std::memcpy(cp.bytes, gmem_src, static_cast<size_t>(n));
    open_.push_back(cp);
  }
  void h_commit() {
    groups_.push_back(std::move(open_));
    open_.clear();
  }
  void h_wait(int n) {
    while (groups_.size() > static_cast<size_t>(n)) {
      for (const Copy& cp : groups_.front()) std::memcpy(cp.dst, cp.bytes, 16);
      groups_.erase(groups_.begin());
    }
  }

  Cta* cta_ = nullptr;
  int tid_ = 0;
  std::vector<Copy> open_;
  std::vector<std::vector<Copy>> groups_;
};

// One CTA: its fibers, shared memory and rendezvous state.
class Cta {
 public:
  Cta(int nthreads, size_t smem_bytes, int64_t bx, int64_t by, int64_t gx, int64_t gy)
      : n_(nthreads), bx_(bx), by_(by), gx_(gx), gy_(gy),
        smem_raw_(new unsigned char[smem_bytes + 128]), warps_(static_cast<size_t>((nthreads + 31) / 32)),
        threads_(static_cast<size_t>(nthreads)) {
    uintptr_t p = reinterpret_cast<uintptr_t>(smem_raw_.get());
    smem_ = reinterpret_cast<unsigned char*>((p + 127) & ~uintptr_t(127));
    std::memset(smem_, 0xA5, smem_bytes);
    for (int t = 0; t < n_; ++t) {
      threads_[t].ctx.cta_ = this;
      threads_[t].ctx.tid_ = t;
    }
  }

  // Runs body(ThreadCtx&) on every thread; nullptr or a static error string.
  template <class F>
  const char* run(F& body) {
    body_ = &body;
    call_ = [](void* f, ThreadCtx& c) { (*static_cast<F*>(f))(c); };
    live_ = n_;
    for (int t = 0; t < n_; ++t) {
      Thread& th = threads_[t];
      th.stack.reset(new char[kStackBytes]);
      getcontext(&th.uc);
      th.uc.uc_stack.ss_sp = th.stack.get();
      th.uc.uc_stack.ss_size = kStackBytes;
      th.uc.uc_link = &main_;
      const uintptr_t self = reinterpret_cast<uintptr_t>(this);
      makecontext(&th.uc, reinterpret_cast<void (*)()>(&Cta::entry), 3, static_cast<unsigned>(self >> 32),
                  static_cast<unsigned>(self & 0xFFFFFFFFu), static_cast<unsigned>(t));
    }
    while (live_ > 0 && error_ == nullptr) {
      const uint64_t before = progress_;
      for (int t = 0; t < n_ && error_ == nullptr; ++t) {
        if (threads_[t].done) continue;
        swapcontext(&main_, &threads_[t].uc);
      }
      if (error_ == nullptr && live_ > 0 && progress_ == before)
        error_ = "emulated kernel deadlocked: a barrier or warp collective that not every participant reaches";
    }
    return error_;
  }

  int nthreads() const { return n_; }
  int64_t bx() const { return bx_; }
  int64_t by() const { return by_; }
  int64_t gx() const { return gx_; }
  int64_t gy() const { return gy_; }
  unsigned char* smem() const { return smem_; }

  // Warp rendezvous: deposits n bytes for lane `tid % 32`, waits for every lane of `mask`,
  // returns this round's 32 slots (valid until the caller's next collective: a slot buffer
  // is reused two rounds later, after every lane has passed the round in between).
  const unsigned char* exchange(int tid, unsigned mask, const void* in, size_t n) {
    Warp& w = warps_[static_cast<size_t>(tid / kWarpSize)];
    const int lane = tid & (kWarpSize - 1);
    if (((mask >> lane) & 1u) == 0) fail(tid, "warp collective called by a lane outside its own mask");
    if (w.arrived == 0) {
      w.mask = mask;
    } else if (w.mask != mask) {
      fail(tid, "lanes of one warp called a collective with different masks");
    }
    const int buf = static_cast<int>(w.gen & 1u);
    if (n) std::memcpy(w.slots[buf] + ThreadCtx::kSlotBytes * lane, in, n);
    ++progress_;
    const uint64_t gen = w.gen;
    if (++w.arrived == __builtin_popcount(mask)) {
      w.arrived = 0;
      ++w.gen;
    } else {
      while (w.gen == gen) yield(tid);
    }
    return w.slots[buf];
  }

  void barrier(int tid) {
    ++progress_;
    const uint64_t gen = bar_gen_;
    if (++bar_arrived_ == live_) {
      bar_arrived_ = 0;
      ++bar_gen_;
    } else {
      while (bar_gen_ == gen) yield(tid);
    }
  }

 private:
  static constexpr size_t kStackBytes = 256 * 1024;
  struct Warp {
    unsigned mask = 0;
    int arrived = 0;
    uint64_t gen = 0;
    unsigned char slots[2][ThreadCtx::kSlotBytes * kWarpSize];
  };
  struct Thread {
    ThreadCtx ctx;
    ucontext_t uc;
    std::unique_ptr<char[]> stack;
    bool done = false;
  };

  static void entry(unsigned hi, unsigned lo, unsigned t) {
    Cta* self = reinterpret_cast<Cta*>((static_cast<uintptr_t>(hi) << 32) | lo);
    Thread& th = self->threads_[t];
    self->call_(self->body_, th.ctx);
    th.done = true;
    --self->live_;
    ++self->progress_;
    // An exited thread no longer holds up a CTA barrier (as on sm_70+).
    if (self->bar_arrived_ > 0 && self->bar_arrived_ == self->live_) {
      self->bar_arrived_ = 0;
      ++self->bar_gen_;
    }
  }  // returns through uc_link to the scheduler

  void yield(int tid) {
    swapcontext(&threads_[static_cast<size_t>(tid)].uc, &main_);
    // The scheduler resumes no fiber after an error; nothing to check here.
  }

  [[noreturn]] void fail(int tid, const char* msg) {
    if (error_ == nullptr) error_ = msg;
    for (;;) yield(tid);  // never resumed: the scheduler stops at the first error
  }

  int n_;
  int64_t bx_, by_, gx_, gy_;
  std::unique_ptr<unsigned char[]> smem_raw_;
  unsigned char* smem_ = nullptr;
  std::vector<Warp> warps_;
  std::vector<Thread> threads_;
  ucontext_t main_;
  void* body_ = nullptr;
  void (*call_)(void*, ThreadCtx&) = nullptr;
  int live_ = 0, bar_arrived_ = 0;
  uint64_t bar_gen_ = 0, progress_ = 0;
  const char* error_ = nullptr;
};

inline int ThreadCtx::h_nthreads() const { return cta_->nthreads(); }
inline int64_t ThreadCtx::h_block(int which) const {
  return which == 0 ? cta_->bx() : which == 1 ? cta_->by() : which == 2 ? cta_->gx() : cta_->gy();
}
inline unsigned char* ThreadCtx::h_smem() const { return cta_->smem(); }
inline void ThreadCtx::h_syncthreads() { cta_->barrier(tid_); }
inline const unsigned char* ThreadCtx::exchange(unsigned mask, const void* in, size_t n) {
  return cta_->exchange(tid_, mask, in, n);
}

// mma.sync m16n8k16 bf16 -> fp32: every lane deposits its fragments, then computes its own
// four outputs from the whole tiles (rebuilt with the PTX layout functions of ctx.cuh).
inline void ThreadCtx::h_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  struct Payload {
    uint32_t a[4], b[2];
    float c[4];
  } in;
  static_assert(sizeof(Payload) <= static_cast<size_t>(kSlotBytes), "mma payload exceeds a slot");
  std::memcpy(in.a, a, sizeof(in.a));
  std::memcpy(in.b, b, sizeof(in.b));
  std::memcpy(in.c, c, sizeof(in.c));
  const unsigned char* s = exchange(kFullMask, &in, sizeof(in));
  auto bf = [](uint32_t reg, int half) {
    const uint32_t bits = (half ? (reg >> 16) : (reg & 0xFFFFu)) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return static_cast<double>(f);
  };
  double A[16][16], B[16][8];
  for (int l = 0; l < kWarpSize; ++l) {
    Payload p;
    std::memcpy(&p, s + kSlotBytes * l, sizeof(p));
    for (int i = 0; i < 8; ++i) A[frag_a_row(l, i)][frag_a_col(l, i)] = bf(p.a[i / 2], i & 1);
    for (int i = 0; i < 4; ++i) B[frag_b_row(l, i)][frag_b_col(l, i)] = bf(p.b[i / 2], i & 1);
  }
  const int me = lane();
  for (int i = 0; i < 4; ++i) {
    const int r = frag_c_row(me, i), col = frag_c_col(me, i);
    double acc = 0.0;  // products of two bf16 are exact in double; one fp32 rounding at the end
    for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][col];
    d[i] = static_cast<float>(acc + static_cast<double>(c[i]));
  }
}

// Runs the grid (CTAs x fastest); nullptr or the first error.
template <class F>
const char* launch(int64_t grid_x, int64_t grid_y, int threads, size_t smem_bytes, F&& body) {
  if (threads <= 0 || threads % kWarpSize != 0) return "emulator: block size must be a positive multiple of 32";
  for (int64_t by = 0; by < grid_y; ++by)
    for (int64_t bx = 0; bx < grid_x; ++bx) {
      Cta cta(threads, smem_bytes, bx, by, grid_x, grid_y);
      if (const char* e = cta.run(body)) return e;
    }
  return nullptr;
}

}  // namespace emu
}  // namespace unweight
