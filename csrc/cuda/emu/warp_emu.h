// Host emulator of CUDA thread-block semantics, for kernel bodies written against the
// context interface of ctx.cuh.  Lets CPU-only CI run a cooperative kernel (shuffles,
// ballots, shared memory with barriers, cp.async pipelines, mma.sync, wgmma) exactly as written.
//
//     const char* err = emu::launch(grid_x, grid_y, threads, smem_bytes,
//                                   [&](emu::ThreadCtx& c) { body(c, args); });
//
// Model.  Every thread is a fiber (fiber.h) on the calling OS thread; a fiber runs until it
// reaches a collective (a warp op, a barrier, an mma) and yields there until every
// participant has arrived, so all lanes see each other's values exactly as on the GPU.  By
// default CTAs run one after another, x fastest, and a CTA's warps take turns in index order;
// cta_order() (at the end of this file) sets other schedules -- CTAs reversed or shuffled,
// several in flight at once -- under which a kernel's bits must not change.  What it checks, beyond running
// the body:
//   * a barrier or warp collective that some participant never reaches (a hang on the GPU)
//     ends the launch with an error instead of hanging;
//   * lanes of one warp calling a collective with different masks (undefined on the GPU) is
//     an error;
//   * cp.async is deferred: the source is read when the copy is issued but the bytes land in
//     shared memory only when a cp_async_wait<N> retires its group (and reading them before
//     that is an error, below);
//   * bulk copies (cp.async.bulk counted on an mbarrier) are deferred too: the source is read
//     at the copy, the bytes land only when a thread waiting on the barrier finds its phase
//     complete (every arrival made and every expected byte copied), and a thread may read
//     them only after its own wait saw that phase (or a syncthreads since); a barrier handed
//     to a copy before its initialising thread's fence, more arrivals than its count in a
//     phase, and a CTA that ends with copies no thread waited for are errors;
//   * shared memory starts filled with 0xA5, not zeros;
//   * shared-memory races, by happens-before rather than by the order the fibers happen to
//     run in (the hazards racecheck reports on a GPU).  Every shared-memory access of a
//     body goes through the context (lds / sts / lds_v2 / lds_v4 / atomic_add / cp_async16),
//     and a shadow word per 4 bytes records its last writer and its readers with the
//     barrier generation and the warp's syncwarp generation of each access.  Two accesses
//     of one word by different threads, one of them a write, must be ordered by a
//     syncthreads both passed after the first, or, within a warp, by a syncwarp whose mask
//     held both (shuffles, ballots and mma order no memory, as in CUDA; atomics of one
//     shared word need no order among themselves, only against plain accesses).  A
//     cp.async may write its word at any time until the wait that retires it: the copy is
//     checked as a write against earlier reads when it starts, the word stays in flight
//     until the issuing thread's wait, and any access of a word in flight is an error.
//     Also errors: an access outside the launch's shared memory or not aligned to its size,
//     a store of less than a word, and a read of a word no thread has written (a 1- or
//     2-byte load is checked as a read of its whole word);
//   * warpgroup MMA (wgmma, h_wgmma below): a wgmma with no wgmma.fence since the thread's
//     last commit, B operand words written through the generic proxy with no fence.proxy.async
//     by their writer since, a swizzled descriptor (not modelled), a write of a word a wgmma in
//     flight reads (by any thread, until the wait that retires it), and a CTA that ends with a
//     wgmma not waited for are errors;
//   * global memory one CTA hands another (st_grid / ld_grid, GridShadow): the storing
//     thread must threadfence between its store and its CTA's arrival atomic (release), the
//     loading thread between learning of that arrival and its load (acquire).
//   * global accesses outside the caller's buffers, while a GlobalBounds scope names them:
//     every load, store and prefetch (L1 or L2) through device_util.cuh's helpers
//     (ld_stream_*, ld_reuse_v4, st_v4, prefetch_l2, prefetch_line) and every cp.async source
//     must lie inside one of its ranges (plain array reads of a body are not seen; the
//     kernels' streams and copies all go through the helpers).
// It can also count what a profiler's memory counters would for the launch -- shared-memory
// wavefronts per bank-conflicted request, global sectors per request -- so CPU-only CI sees a
// bank conflict or an uncoalesced load (profile(), below).
// What it does not model: other races in global memory (plain loads and stores are
// sequentially consistent here; the schedules of cta_order() expose some), timing, occupancy,
// and the exact rounding
// of the tensor cores (mma_bf16_16816 returns the exactly rounded fp32 value of c + sum of
// the 16 exact products; hardware adds in its own order and may differ in the last bits, so
// tests compare against references with bounds).  The race check keeps one read record per
// warp and word (the lanes that read it and the newest generations among their reads), so
// within a warp it may report a write as unordered against a lane whose read an earlier
// syncwarp did order; no kernel here reads one word across syncwarps before rewriting it.
// Restrictions: 1-D blocks whose size is a multiple of 32, at most one warp collective in
// flight per warp (divergent halves of a warp may not run two collectives at once).
// Errors are strings that stay valid until the next failing launch on the same OS thread;
// every other call returns nullptr.
//
// Cost: a collective is a fiber switch per lane (fiber.h: ~12 ns on x86-64 Linux, ~0.25 us
// through the ucontext fallback, on a 2-vCPU EPYC VM), so the emulator is for small shapes (thousands of
// collectives per test, not millions).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ctx.cuh"
#include "fiber.h"
#include "global_bounds.h"

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
#define UW_EMU_NOINLINE __attribute__((noinline))
#define UW_EMU_CALL_SITE() reinterpret_cast<uintptr_t>(__builtin_return_address(0))

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
  template <class T>
  UW_HD T lds(const T* p) {
    UW_EMU_HOST_ONLY(T v; h_load(p, &v, sizeof(T)); return v;)
  }
  template <class T>
  UW_HD void sts(T* p, T v) { UW_EMU_HOST_ONLY(h_store(p, &v, sizeof(T));) }
  UW_HD void lds_v4(const unsigned char* p, uint32_t (&v)[4]) { UW_EMU_HOST_ONLY(h_load(p, v, 16);) }
  UW_HD void lds_v2(const unsigned char* p, uint32_t (&v)[2]) { UW_EMU_HOST_ONLY(h_load(p, v, 8);) }

  UW_HD void syncthreads() { UW_EMU_HOST_ONLY(h_syncthreads();) }
  UW_HD bool syncthreads_or(bool p) { UW_EMU_HOST_ONLY(return h_syncthreads_or(p);) }
  UW_HD void syncwarp(unsigned mask = kFullMask) { UW_EMU_HOST_ONLY(exchange(mask, nullptr, 0, true);) }
  UW_HD void threadfence() { UW_EMU_HOST_ONLY(h_threadfence();) }
  // Programmatic dependent launch: after the wait the thread may touch what earlier launches
  // use (GlobalBounds::after_wait checks it did); the trigger only lets a dependent launch start.
  UW_HD void grid_dep_wait() { UW_EMU_HOST_ONLY(grid_waited_ = true;) }
  UW_HD void grid_dep_launch() { UW_EMU_HOST_ONLY(h_grid_dep_launch();) }
  UW_HD void st_grid(float* p, float v) { UW_EMU_HOST_ONLY(h_st_grid(p); *p = v;) }
  UW_HD float ld_grid(const float* p) { UW_EMU_HOST_ONLY(h_ld_grid(p); return *p;) }
  template <class T>
  UW_HD T atomic_add(T* p, T v) {  // fibers never run concurrently: a plain add is atomic
    UW_EMU_HOST_ONLY(h_atomic(p, sizeof(T)); const T old = *p; *p = old + v; return old;)
  }
  UW_HD unsigned atomic_xor(unsigned* p, unsigned v) {
    UW_EMU_HOST_ONLY(h_atomic(p, sizeof(unsigned)); const unsigned old = *p; *p = old ^ v; return old;)
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
    UW_EMU_HOST_ONLY(h_cp_async(smem_dst, gmem_src, src_bytes, 16);)
  }
  UW_HD void cp_async_commit() { UW_EMU_HOST_ONLY(h_commit();) }
  template <int N>
  UW_HD void cp_async_wait() { UW_EMU_HOST_ONLY(h_wait(N);) }
  UW_HD void mbar_init(uint64_t* bar, unsigned count) { UW_EMU_HOST_ONLY(h_mbar_init(bar, count);) }
  UW_HD void mbar_init_fence() { UW_EMU_HOST_ONLY(h_mbar_init_fence();) }
  UW_HD void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) { UW_EMU_HOST_ONLY(h_mbar_arrive(bar, bytes);) }
  UW_HD void bulk_copy(void* smem_dst, const void* gmem_src, unsigned bytes, uint64_t* bar) {
    UW_EMU_HOST_ONLY(h_bulk_copy(smem_dst, gmem_src, bytes, bar);)
  }
  UW_HD void mbar_wait(uint64_t* bar, unsigned parity) { UW_EMU_HOST_ONLY(h_mbar_wait(bar, parity);) }
  // Warpgroup MMA (see h_wgmma).  smem_addr: the offset into the launch's shared memory,
  // which stands for the shared-window address in a descriptor.
  UW_HD uint32_t smem_addr(const void* p) const { UW_EMU_HOST_ONLY(return h_smem_addr(p);) }
  UW_HD void fence_proxy_async() { UW_EMU_HOST_ONLY(h_fence_proxy_async();) }
  UW_HD void wgmma_fence() { UW_EMU_HOST_ONLY(wg_fenced_ = true;) }
  template <int N>
  UW_HD void wgmma(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t desc, bool scale_d) {
    UW_EMU_HOST_ONLY(h_wgmma(&d[0][0], N, a, desc, scale_d);)
  }
  UW_HD void wgmma_commit() { UW_EMU_HOST_ONLY(h_wgmma_commit();) }
  template <int N, int R>
  UW_HD void wgmma_wait(float (&)[R][4]) { UW_EMU_HOST_ONLY(h_wgmma_wait(N);) }

  static constexpr int kSlotBytes = 48;  // largest per-lane payload: an mma's a, b, c

 private:
  friend class Cta;
  struct Copy {
    unsigned char* dst;
    unsigned char bytes[16];
    int size;  // 4 or 16
  };
  // A wgmma's B operand: the words it reads, which stay read (in flight) until the wait that
  // retires its group.
  struct WgRead {
    uint32_t start, lbo, sbo;
    int n;
  };
  inline int h_nthreads() const;
  inline int64_t h_block(int which) const;
  inline unsigned char* h_smem() const;
  inline void h_syncthreads();
  inline bool h_syncthreads_or(bool p);
  inline void h_threadfence();
  inline void h_grid_dep_launch();
  inline void h_st_grid(const float* p);
  inline void h_ld_grid(const float* p);
  inline const unsigned char* exchange(unsigned mask, const void* in, size_t n, bool sync = false);
  // Out of line, so that the return address names the body's call site (the access profile
  // groups a warp's accesses into instructions by it); the context's methods above are
  // forced inline into the body.
  UW_EMU_NOINLINE void h_load(const void* p, void* out, size_t n);
  UW_EMU_NOINLINE void h_store(void* p, const void* in, size_t n);
  inline void h_atomic(void* p, size_t n);
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
  UW_EMU_NOINLINE void h_cp_async(void* smem_dst, const void* gmem_src, int src_bytes, int size);
  inline uint32_t h_smem_addr(const void* p) const;
  inline void h_fence_proxy_async();
  inline void h_wgmma(float* d, int n, const uint32_t (&a)[4], uint64_t desc, bool scale_d);
  inline void h_wgmma_commit();
  inline void h_wgmma_wait(int n);
  void h_commit() {
    groups_.push_back(std::move(open_));
    open_.clear();
  }
  inline void h_wait(int n);
  inline void h_mbar_init(uint64_t* bar, unsigned count);
  inline void h_mbar_init_fence();
  inline void h_mbar_arrive(uint64_t* bar, unsigned bytes);
  inline void h_bulk_copy(void* smem_dst, const void* gmem_src, unsigned bytes, uint64_t* bar);
  inline void h_mbar_wait(uint64_t* bar, unsigned parity);

  Cta* cta_ = nullptr;
  int tid_ = 0;
  std::vector<const float*> unfenced_;  // st_grid words not yet followed by a threadfence
  bool fenced_since_sync_ = false;      // a threadfence since the last barrier or global atomic
  bool grid_waited_ = false;            // passed grid_dep_wait()
  std::vector<Copy> open_;
  std::vector<std::vector<Copy>> groups_;
  bool wg_fenced_ = false;  // a wgmma_fence since the thread's last wgmma_commit
  std::vector<WgRead> wg_open_;
  std::vector<std::vector<WgRead>> wg_groups_;
};

// Global memory that CTAs of one launch hand each other (ctx.cuh st_grid / ld_grid: the split
// fix-up's partial sums), checked as the CUDA memory model orders it.  A word one CTA stores
// and another loads must be released -- a threadfence of the storing thread between the store
// and its CTA's next global atomic (the arrival the other CTA counts) -- and acquired -- a
// threadfence of the loading thread after its last barrier or global atomic (after it learned
// of the arrival) and before the load.  Kept per launch; sequence numbers order the events.
class GridShadow {
 public:
  explicit GridShadow(int64_t n_ctas) : last_atomic_(static_cast<size_t>(n_ctas), 0) {}
  struct Store {
    int64_t cta;
    int tid;
    uint64_t fenced;  // sequence number of the storing thread's threadfence; 0: none yet
  };
  uint64_t next() { return ++seq_; }
  void store(const float* p, int64_t cta, int tid) { words_[key(p)] = Store{cta, tid, 0}; }
  void fence(const float* p, int64_t cta, int tid, uint64_t seq) {
    auto it = words_.find(key(p));
    if (it != words_.end() && it->second.cta == cta && it->second.tid == tid && it->second.fenced == 0)
      it->second.fenced = seq;
  }
  void atomic(int64_t cta) { last_atomic_[static_cast<size_t>(cta)] = next(); }
  // The store another CTA made to p, or nullptr when none did.
  const Store* foreign(const float* p, int64_t cta) const {
    auto it = words_.find(key(p));
    return it == words_.end() || it->second.cta == cta ? nullptr : &it->second;
  }
  bool released(const Store& s) const { return s.fenced != 0 && s.fenced < last_atomic_[static_cast<size_t>(s.cta)]; }

 private:
  static uintptr_t key(const float* p) { return reinterpret_cast<uintptr_t>(p); }
  uint64_t seq_ = 0;
  std::unordered_map<uintptr_t, Store> words_;
  std::vector<uint64_t> last_atomic_;
};

// ---- memory-access profile ------------------------------------------------------------
// What a profiler's memory counters (Nsight Compute's shared-memory wavefronts and global
// sectors per request) would count for the accesses of emulated launches, so that a CPU-only
// run tells a bank conflict or an uncoalesced load from the access pattern alone.  Off unless
// profile().on; a launch reads the switch when it starts, and each CTA adds its counts to the
// totals when it ends.
//   * Requests.  An instruction is a call site of the body (the context's methods and the
//     load helpers are inlined into the body; the emulator reads the return address).
//     Between two of a warp's collectives or CTA barriers, the lanes' k-th passes through a
//     site every lane passes equally often are one request; passes through a site only some
//     lanes take (a predicated copy, a data-dependent refill) are grouped by the pass of the
//     nearest such uniform site before them, i.e. by loop iteration, with the lanes that
//     skip it absent, as on the GPU (Cta::flush).  Approximate where no site is uniform (lanes
//     whose loops run different trip counts) or lanes diverge around a collective.
//   * Shared memory: 32 banks of 4 bytes.  An access of 8 or 16 bytes per lane runs in 2 or 4
//     phases of 16 or 8 consecutive lanes; a phase with any lane in it takes as many
//     wavefronts as the most distinct words one bank holds among its lanes' bytes (lanes
//     reading one word share it), ideally one.  A cp.async counts its 16-byte shared write
//     so; shared atomics are not counted.
//   * Global memory: 32-byte sectors.  A request touches the distinct sectors of its lanes'
//     bytes, ideally ceil(distinct bytes / 32).  Seen: the load and store helpers of
//     device_util.cuh (through trace_global) and cp.async sources; a body's other plain
//     loads and stores are not.  No cache: a sector two requests share counts twice.
enum AccessKind { kSharedLoad, kSharedStore, kSharedAsync, kGlobalLoad, kGlobalStore, kGlobalAsync, kAccessKinds };
struct AccessTotals {
  uint64_t requests = 0;  // warp-wide instructions
  uint64_t units = 0;     // shared: wavefronts; global: sectors
  uint64_t ideal = 0;     // the fewest units the same bytes could take
  uint64_t bytes = 0;     // bytes the lanes asked for
  uint64_t worse = 0;     // requests that took more units than their ideal
  uint64_t max_degree = 0;  // shared: most distinct words on one bank in one phase
};
struct ProfileTotals {
  AccessTotals kind[kAccessKinds];
  uint64_t worst_degree = 0;
  std::string worst;  // the first shared phase of the largest degree: kind, lanes, byte offsets
  void add(const ProfileTotals& o) {
    for (int k = 0; k < kAccessKinds; ++k) {
      AccessTotals& a = kind[k];
      const AccessTotals& b = o.kind[k];
      a.requests += b.requests;
      a.units += b.units;
      a.ideal += b.ideal;
      a.bytes += b.bytes;
      a.worse += b.worse;
      a.max_degree = std::max(a.max_degree, b.max_degree);
    }
    if (o.worst_degree > worst_degree) {
      worst_degree = o.worst_degree;
      worst = o.worst;
    }
  }
};
struct ProfileSetting {
  bool on = false;
  std::mutex mu;  // guards totals: emulations may run on several OS threads
  ProfileTotals totals;
};
inline ProfileSetting& profile() {
  static ProfileSetting setting;
  return setting;
}
// Whether launches starting now are profiled.
inline bool profiling() {
  std::lock_guard<std::mutex> lock(profile().mu);
  return profile().on;
}

// One CTA: its fibers, shared memory and rendezvous state.
class Cta {
 public:
  Cta(int nthreads, size_t smem_bytes, int64_t bx, int64_t by, int64_t gx, int64_t gy, GridShadow* grid)
      : grid(grid), n_(nthreads), bx_(bx), by_(by), gx_(gx), gy_(gy),
        smem_raw_(new unsigned char[smem_bytes + 128]), smem_bytes_(smem_bytes),
        warps_(static_cast<size_t>((nthreads + 31) / 32)), threads_(static_cast<size_t>(nthreads)) {
    uintptr_t p = reinterpret_cast<uintptr_t>(smem_raw_.get());
    smem_ = reinterpret_cast<unsigned char*>((p + 127) & ~uintptr_t(127));
    std::memset(smem_, 0xA5, smem_bytes);
    const size_t words = (smem_bytes + 3) / 4, nw = warps_.size();
    writer_.assign(words, kNobody);
    in_flight_.assign(words, kNobody);
    bulk_bar_.assign(words, 0);
    proxy_ok_.assign(words, 0);
    wg_inflight_.assign(words, 0);
    proxy_pending_.resize(static_cast<size_t>(nthreads));
    w_bar_.assign(words, 0);
    w_sync_.assign(words, 0);
    rd_lanes_.assign(words * nw, 0);
    rd_bar_.assign(words * nw, 0);
    rd_sync_.assign(words * nw, 0);
    for (int t = 0; t < n_; ++t) {
      threads_[t].ctx.cta_ = this;
      threads_[t].ctx.tid_ = t;
    }
    profiling_ = profiling();
    if (profiling_) traces_.resize(nw);
    bounds_ = global_ranges();
  }
  Cta(const Cta&) = delete;
  Cta& operator=(const Cta&) = delete;
  // Adds this CTA's access counts to the profile's totals (profiling launches only).
  ~Cta() {
    if (!profiling_) return;
    for (Trace& tr : traces_) flush(tr);
    std::lock_guard<std::mutex> lock(profile().mu);
    profile().totals.add(prof_);
  }

  // Sets every thread up to run body(ThreadCtx&); nothing runs before the first step().
  template <class F>
  void start(F& body) {
    body_ = &body;
    call_ = [](void* f, ThreadCtx& c) { (*static_cast<F*>(f))(c); };
    live_ = n_;
    for (int t = 0; t < n_; ++t) {
      Thread& th = threads_[t];
      th.stack.reset(new char[kStackBytes]);
      fiber_make(&th.fiber, th.stack.get(), kStackBytes, &Cta::entry, &th);
    }
  }

  // A turn of warp w: each of its unfinished lanes, in lane order, runs to its next collective
  // or to its end.
  void step_warp(int w) {
    for (int t = w * kWarpSize; t < (w + 1) * kWarpSize && t < n_ && error_ == nullptr; ++t) {
      if (threads_[t].done) continue;
      const bool traced = profiling_ || bounds_ != nullptr;
      if (traced) global_trace() = GlobalTrace{&Cta::on_global, &threads_[t].ctx};
      fiber_switch(&main_, &threads_[t].fiber);
      if (traced) global_trace() = GlobalTrace{};
    }
  }
  // Closes a round in which every warp had a turn: false once the CTA is over, finished or
  // failed (error() tells which).  A round in which no thread of the CTA moved is a deadlock:
  // what its threads wait for is inside the CTA.
  bool end_round(uint64_t progress_before) {
    if (error_ == nullptr && live_ > 0 && progress_ == progress_before)
      error_ = "emulated kernel deadlocked: a barrier or warp collective that not every participant reaches";
    if (error_ == nullptr && live_ == 0 && !unwritten_read_.empty()) error_ = keep(unwritten_read_);
    if (error_ == nullptr && live_ == 0)
      for (const auto& mb : mbars_)
        if (!mb.second.copies.empty()) error_ = "emulated kernel: the CTA ended with bulk copies no thread waited for";
    if (error_ == nullptr && live_ == 0 &&
        std::any_of(wg_inflight_.begin(), wg_inflight_.end(), [](uint16_t n) { return n != 0; }))
      error_ = "emulated kernel: the CTA ended with wgmmas no thread waited for";
    return error_ == nullptr && live_ > 0;
  }
  uint64_t progress() const { return progress_; }
  int64_t id() const { return by_ * gx_ + bx_; }
  GridShadow* const grid;
  // Fails the launch naming this thread, the other CTA's thread and what is missing.
  [[noreturn]] void fail_grid(int tid, const char* what, const GridShadow::Store& s) {
    char msg[256];
    std::snprintf(msg, sizeof(msg), "emulated kernel: %s (thread %d of CTA (%lld, %lld) read a word thread %d of CTA "
                  "(%lld, %lld) stored)", what, tid, static_cast<long long>(bx_), static_cast<long long>(by_),
                  s.tid, static_cast<long long>(s.cta % gx_), static_cast<long long>(s.cta / gx_));
    fail(tid, keep(msg));
  }
  // Set by a global atomic (the way a CTA tells others it is done with something); launch
  // holds such a CTA back while others can run.
  bool published = false;
  int nwarps() const { return static_cast<int>(warps_.size()); }
  const char* error() const { return error_; }

  int nthreads() const { return n_; }
  int64_t bx() const { return bx_; }
  int64_t by() const { return by_; }
  int64_t gx() const { return gx_; }
  int64_t gy() const { return gy_; }
  unsigned char* smem() const { return smem_; }

  // Warp rendezvous: deposits n bytes for lane `tid % 32`, waits for every lane of `mask`,
  // returns this round's 32 slots (valid until the caller's next collective: a slot buffer
  // is reused two rounds later, after every lane has passed the round in between).
  const unsigned char* exchange(int tid, unsigned mask, const void* in, size_t n, bool sync) {
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
      if (sync) {  // a syncwarp orders the memory accesses of every pair of lanes in its mask
        ++w.sync_gen;
        for (int a = 0; a < kWarpSize; ++a)
          for (int b = 0; b < kWarpSize; ++b)
            if ((mask >> a) & (mask >> b) & 1u) w.joined[a][b] = w.sync_gen;
      }
    } else {
      while (w.gen == gen) yield(tid);
    }
    return w.slots[buf];
  }

  // A CTA barrier; returns whether any thread arrived with `vote` true (__syncthreads_or).  One
  // result slot serves: the next barrier cannot complete before every thread has left this one.
  bool barrier(int tid, bool vote = false) {
    ++progress_;
    const uint64_t gen = bar_gen_;
    bar_vote_ = bar_vote_ || vote;
    if (++bar_arrived_ == live_) {
      bar_arrived_ = 0;
      bar_voted_ = bar_vote_;
      bar_vote_ = false;
      ++bar_gen_;
    } else {
      while (bar_gen_ == gen) yield(tid);
    }
    return bar_voted_;
  }

  // ---- shared-memory race check (see the header comment) ----
  enum Access { kRead, kWrite, kAtomic, kAsyncIssue, kAsyncLand, kBulkLand };

  // ---- mbarriers and bulk copies (see the header comment) ----
  void mbar_init(int tid, uint64_t* bar, unsigned count) {
    const size_t off = bar_offset(tid, bar);
    if (count == 0) fail_at(tid, "mbarrier initialised with an arrival count of 0", smem_ + off, -1);
    shared_access(tid, bar, 8, kWrite);
    MBar& m = mbars_[off];
    m = MBar{};
    m.count = m.pending = count;
    m.init_tid = tid;
  }
  void mbar_init_fence(int tid) {
    for (auto& mb : mbars_)
      if (mb.second.init_tid == tid) mb.second.fenced = true;
  }
  void mbar_arrive(int tid, uint64_t* bar, unsigned bytes) {
    MBar& m = mbar_of(tid, bar);
    shared_access(tid, bar, 8, kAtomic);
    if (m.pending == 0) fail_at(tid, "more arrivals on an mbarrier than its count in one phase", raw(bar), -1);
    --m.pending;
    m.expect += bytes;
    ++progress_;
  }
  void bulk_copy(int tid, void* dst, const void* src, unsigned bytes, uint64_t* bar, bool waited) {
    MBar& m = mbar_of(tid, bar);
    unsigned char* d = static_cast<unsigned char*>(dst);
    if (!m.fenced) fail_at(tid, "mbarrier handed to a bulk copy before fence.mbarrier_init", raw(bar), -1);
    if (bytes == 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
      fail_at(tid, "bulk copy: size and source must be non-zero multiples of 16 bytes", in_shared(d) ? d : smem_, -1);
    if (d < smem_ || d + bytes > smem_ + smem_bytes_ || (d - smem_) % 16 != 0)
      fail_at(tid, "bulk copy destination outside the launch's shared memory or not 16-byte aligned", smem_, -1);
    check_global(tid, src, bytes, "bulk copy source", waited);
    const size_t w0 = static_cast<size_t>(d - smem_) / 4;
    for (size_t i = w0; i < w0 + bytes / 4; ++i) word_access(tid, i, kAsyncIssue);
    m.copies.push_back(BulkCopy{d, std::vector<unsigned char>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes)});
    m.issued += bytes;
    ++progress_;
  }
  void mbar_wait(int tid, uint64_t* bar, unsigned parity) {
    const size_t off = static_cast<size_t>(raw(bar) - smem_);
    for (;;) {
      MBar& m = mbar_of(tid, bar);
      shared_access(tid, bar, 8, kAtomic);
      if ((m.phase & 1u) != (parity & 1u)) {  // the phase of that parity has completed
        uint32_t& s = seen_[(static_cast<uint64_t>(tid) << 32) | off];
        s = std::max(s, m.phase);
        return;
      }
      if (m.pending == 0 && m.issued == m.expect) {  // the phase completes: its copies land
        const uint32_t key = static_cast<uint32_t>(off);
        for (const BulkCopy& cp : m.copies) {
          std::memcpy(cp.dst, cp.bytes.data(), cp.bytes.size());
          const size_t w0 = static_cast<size_t>(cp.dst - smem_) / 4;
          for (size_t i = w0; i < w0 + cp.bytes.size() / 4; ++i) {
            bulk_bar_[i] = key;
            word_access(tid, i, kBulkLand, m.phase + 1);
          }
        }
        m.copies.clear();
        ++m.phase;
        m.pending = m.count;
        m.expect = m.issued = 0;
        ++progress_;
        continue;
      }
      yield(tid);
    }
  }

  bool in_shared(const void* p) const {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    return b >= smem_ && b < smem_ + smem_bytes_;
  }

  // ---- the async proxy (wgmma's operand reads) ----
  // A word written through the generic proxy (a store, an atomic, a landed cp.async) is seen
  // by wgmma only after its writer's fence.proxy.async; a bulk copy writes through the async
  // proxy itself.
  void fence_proxy_async(int tid) {
    std::vector<size_t>& mine = proxy_pending_[tid];
    for (size_t i : mine)
      if (writer_[i] == tid) proxy_ok_[i] = 1;
    mine.clear();
  }
  // The words of a K-major unswizzled [16, n] operand at shared offset `start` (lbo, sbo as the
  // descriptor's): each 16-byte core-matrix row is checked as a read of thread tid (race check;
  // `issue`: also that the async proxy may see it, and that it lies in shared memory).  From
  // its issue to the wait that retires it, each of its words counts one wgmma in flight
  // (wg_inflight_), and a write of such a word by any thread, the issuing one included, fails.
  void wgmma_read(int tid, uint32_t start, uint32_t lbo, uint32_t sbo, int n, bool issue) {
    for (int kc = 0; kc < 2; ++kc)
      for (int r = 0; r < n; ++r) {
        const size_t off = static_cast<size_t>(start) + static_cast<size_t>(kc) * lbo +
                           static_cast<size_t>(r / 8) * sbo + static_cast<size_t>(r % 8) * 16;
        if (issue && off + 16 > smem_bytes_)
          fail_at(tid, "wgmma operand outside the launch's shared memory", smem_, -1);
        shared_access(tid, smem_ + off, 16, kRead);
        for (size_t i = off / 4; i < off / 4 + 4; ++i) {
          if (issue && !proxy_ok_[i] && writer_[i] != kNobody)
            fail_at(tid, "wgmma read of a shared-memory word written without a fence.proxy.async since",
                    smem_ + 4 * i, writer_[i]);
          if (issue) ++wg_inflight_[i];
          else --wg_inflight_[i];
        }
      }
  }

  // Fails the launch when a GlobalBounds scope is open and [p, p + n) lies outside its buffers,
  // or inside one an earlier launch uses while the thread has not passed its grid-dependency
  // wait (waited: it has).
  void check_global(int tid, const void* p, size_t n, const char* what, bool waited = true) {
    check_wait(tid, p, n, what, waited);
    if (bounds_ == nullptr || bounds_->contains(p, n)) return;
    char msg[192];
    std::snprintf(msg, sizeof(msg), "emulated kernel: %s of %zu bytes at %p outside every buffer of the launch "
                  "(thread %d of CTA (%lld, %lld))", what, n, p, tid, static_cast<long long>(bx_),
                  static_cast<long long>(by_));
    fail(tid, keep(msg));
  }
  // Fails the launch: a thread let the next launch start before its grid-dependency wait.
  void fail_early_trigger(int tid) {
    fail(tid, "emulated kernel: griddepcontrol.launch_dependents before the thread's grid-dependency wait");
  }
  // Fails the launch when [p, p + n) lies in a buffer an earlier launch uses
  // (GlobalBounds::after_wait) and the thread has not passed its grid-dependency wait.
  void check_wait(int tid, const void* p, size_t n, const char* what, bool waited) {
    if (bounds_ == nullptr || waited || !bounds_->needs_wait(p, n)) return;
    char msg[224];
    std::snprintf(msg, sizeof(msg), "emulated kernel: %s of %zu bytes at %p, a buffer an earlier launch uses, "
                  "before the grid-dependency wait (thread %d of CTA (%lld, %lld))", what, n, p, tid,
                  static_cast<long long>(bx_), static_cast<long long>(by_));
    fail(tid, keep(msg));
  }
  [[noreturn]] void fail_access(int tid, const char* what, const void* smem_at) {
    fail_at(tid, what, static_cast<const unsigned char*>(smem_at), -1);
  }

  // Checks and records an access of n bytes at p by thread tid; fails the launch on a
  // violation.  The check works on 4-byte words: a 1- or 2-byte load counts as a read of its
  // whole word (so a write of the word's other bytes by another thread, unordered, is
  // reported although the hardware would not conflict; no kernel here does that), and stores
  // must cover whole words (a sub-word store would leave the word's other bytes looking
  // written).
  void shared_access(int tid, const void* p, size_t n, Access kind, uintptr_t site = 0) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    if (b < smem_ || b + n > smem_ + smem_bytes_ || n == 0)
      fail_at(tid, "shared-memory access outside the launch's dynamic shared memory", b, -1);
    const size_t off = static_cast<size_t>(b - smem_);
    if (off % (n < 16 ? n : 16) != 0 || (n % 4 != 0 && n > 2))
      fail_at(tid, "shared-memory access not aligned to its size", b, -1);
    if (n < 4 && kind != kRead)
      fail_at(tid, "sub-word shared-memory store (the race check models 4-byte words)", b, -1);
    for (size_t i = off / 4; i < (off + n + 3) / 4; ++i) word_access(tid, i, kind);
    if (profiling_ && (kind == kRead || kind == kWrite || kind == kAsyncIssue))
      record(tid, kind == kRead ? kSharedLoad : kind == kWrite ? kSharedStore : kSharedAsync, off, n, site);
  }

  // ---- access profile (see profile()) ----
  // Counts an access of n bytes at `at` (a shared-memory offset, or a global address) by
  // thread tid from the body's call site `site`; nothing unless this launch is profiled.
  void record(int tid, AccessKind kind, uintptr_t at, size_t n, uintptr_t site) {
    if (!profiling_) return;
    const uint64_t key = (bar_gen_ << 32) | (warps_[static_cast<size_t>(tid / kWarpSize)].gen & 0xFFFFFFFFu);
    Trace& tr = traces_[static_cast<size_t>(tid / kWarpSize)];
    // Every later access of the warp has a key at least the current one: a change of key
    // closes the group of the old one.
    if (tr.open && tr.key != key) flush(tr);
    tr.open = true;
    tr.key = key;
    tr.lanes[static_cast<size_t>(tid % kWarpSize)].push_back(Rec{at, site, static_cast<uint8_t>(kind),
                                                                 static_cast<uint8_t>(n)});
  }

 private:
  static constexpr int16_t kNobody = -1;
  static constexpr int16_t kAtomics = -2;  // last written by atomics (of any threads)
  static constexpr int16_t kBulk = -3;     // last written by a bulk copy (bulk_bar_, w_sync_: its phase)

  struct BulkCopy {
    unsigned char* dst;
    std::vector<unsigned char> bytes;  // the source as read at the copy
  };
  struct MBar {
    unsigned count = 0, pending = 0;  // arrivals per phase, and those still to come
    uint64_t expect = 0, issued = 0;  // bytes the phase waits for, and bytes copied
    uint32_t phase = 0;               // completed phases
    int init_tid = -1;
    bool fenced = false;              // the initialising thread's fence.mbarrier_init came since
    std::vector<BulkCopy> copies;     // issued, not landed
  };
  unsigned char* raw(const void* p) const { return const_cast<unsigned char*>(static_cast<const unsigned char*>(p)); }
  size_t bar_offset(int tid, const void* bar) const {
    const unsigned char* b = static_cast<const unsigned char*>(bar);
    if (!in_shared(b) || b + 8 > smem_ + smem_bytes_ || (b - smem_) % 8 != 0)
      const_cast<Cta*>(this)->fail_at(tid, "mbarrier outside the launch's shared memory or not 8-byte aligned",
                                      in_shared(b) ? b : smem_, -1);
    return static_cast<size_t>(b - smem_);
  }
  MBar& mbar_of(int tid, const void* bar) {
    const auto it = mbars_.find(bar_offset(tid, bar));
    if (it == mbars_.end()) fail_at(tid, "use of an mbarrier no thread initialised", raw(bar), -1);
    return it->second;
  }
  bool bulk_seen(int tid, size_t i) const {
    const auto it = seen_.find((static_cast<uint64_t>(tid) << 32) | bulk_bar_[i]);
    return it != seen_.end() && it->second >= w_sync_[i];
  }

  // Whether an access by thread `first` (kAtomics: by atomics whose newest ran at barrier
  // generation `bar`) at barrier generation `bar` and its warp's syncwarp generation `sync`
  // is ordered before anything thread `then` does now.
  bool ordered(int first, int then, uint32_t bar, uint32_t sync) const {
    if (bar_gen_ > bar) return true;
    if (first < 0 || first / kWarpSize != then / kWarpSize) return false;
    return warps_[static_cast<size_t>(first / kWarpSize)].joined[first % kWarpSize][then % kWarpSize] > sync;
  }

  void word_access(int tid, size_t i, Access kind, uint32_t phase = 0) {
    const size_t nw = warps_.size();
    const int wp = tid / kWarpSize, lane = tid % kWarpSize;
    const uint32_t bar = static_cast<uint32_t>(bar_gen_), sync = warps_[static_cast<size_t>(wp)].sync_gen;
    unsigned char* at = smem_ + 4 * i;
    if (kind == kBulkLand) {  // a bulk copy's word, visible to the threads whose wait sees `phase`
      proxy_ok_[i] = 1;
      in_flight_[i] = kNobody;
      writer_[i] = kBulk;
      w_bar_[i] = bar;
      w_sync_[i] = phase;
      return;
    }
    if (kind == kAsyncLand) {  // the issuing thread's wait retired its copy
      proxy_ok_[i] = 0;
      proxy_pending_[static_cast<size_t>(tid)].push_back(i);
      in_flight_[i] = kNobody;
      writer_[i] = static_cast<int16_t>(tid);
      w_bar_[i] = bar;
      w_sync_[i] = sync;
      return;
    }
    if (in_flight_[i] != kNobody)
      fail_at(tid, kind == kRead ? "read of a shared-memory word whose cp.async or bulk copy has not been waited for"
                                 : "write to a shared-memory word with a cp.async or bulk copy in flight",
              at, in_flight_[i]);
    const int w = writer_[i];
    // Whether the last write is ordered before this access (a bulk copy's: the thread's own
    // wait saw its phase, or a syncthreads came since).
    const bool w_ordered = w == kBulk ? bar_gen_ > w_bar_[i] || bulk_seen(tid, i) : ordered(w, tid, w_bar_[i], w_sync_[i]);
    if (kind == kRead) {
      // A word no thread has written yet may be written later by another thread with no
      // barrier between (then that write fails as a race); only a read that stays unwritten
      // to the end of the CTA is reported as such.
      if (w == kNobody && unwritten_read_.empty())
        unwritten_read_ = describe(tid, "read of a shared-memory word no thread had written", at, -1);
      if (w != kNobody && w != tid && !w_ordered)
        fail_at(tid, w == kBulk ? "read of a bulk copy's word before a wait on its mbarrier saw the copy complete"
                                : "shared-memory race: read of a word another thread wrote, with no barrier between",
                at, w);
      const size_t r = i * nw + static_cast<size_t>(wp);
      if (rd_bar_[r] < bar) rd_lanes_[r] = 0;  // earlier reads are ordered before any later access
      rd_lanes_[r] |= 1u << lane;
      rd_bar_[r] = bar;
      rd_sync_[r] = sync;
      return;
    }
    // A write (or a cp.async being started, which may write at any time from now on, or an
    // atomic: atomics of one word need no order among themselves, only against plain accesses).
    if (wg_inflight_[i] != 0)
      fail_at(tid, "write to a shared-memory word a wgmma in flight reads (before the wait that retires it)", at, -1);
    if (w != kNobody && w != tid && !(kind == kAtomic && w == kAtomics) && !w_ordered)
      fail_at(tid, "shared-memory race: two threads wrote one word with no barrier between", at, w);
    for (size_t q = 0; q < nw; ++q) {
      const size_t r = i * nw + q;
      unsigned lanes = rd_lanes_[r];
      if (static_cast<int>(q) == wp) lanes &= ~(1u << lane);
      if (lanes == 0 || rd_bar_[r] < bar) continue;
      for (int l = 0; l < kWarpSize; ++l) {
        const int reader = static_cast<int>(q) * kWarpSize + l;
        if (((lanes >> l) & 1u) && !ordered(reader, tid, rd_bar_[r], rd_sync_[r]))
          fail_at(tid, "shared-memory race: write to a word another thread read, with no barrier between", at,
                  reader);
      }
    }
    for (size_t q = 0; q < nw; ++q) rd_lanes_[i * nw + q] = 0;
    if (kind == kAsyncIssue) {
      in_flight_[i] = static_cast<int16_t>(tid);
    } else if (kind == kAtomic) {
      writer_[i] = kAtomics;
      w_bar_[i] = bar;
      proxy_ok_[i] = 0;
    } else {
      proxy_ok_[i] = 0;
      proxy_pending_[static_cast<size_t>(tid)].push_back(i);
      writer_[i] = static_cast<int16_t>(tid);
      w_bar_[i] = bar;
      w_sync_[i] = sync;
    }
  }

  struct Rec {
    uintptr_t at;    // shared: offset into the launch's shared memory; global: address
    uintptr_t site;  // the body's call site (a return address)
    uint8_t kind;    // AccessKind
    uint8_t bytes;
  };
  // One warp's accesses since its last collective or barrier, per lane in program order.
  struct Trace {
    bool open = false;
    uint64_t key = 0;  // barrier generation << 32 | the warp's collective generation
    std::array<std::vector<Rec>, kWarpSize> lanes;
  };

  UW_EMU_NOINLINE static void on_global(void* thread, const void* p, unsigned bytes, GlobalKind kind) {
    ThreadCtx* c = static_cast<ThreadCtx*>(thread);
    const bool store = kind == GlobalKind::kStore;
    c->cta_->check_global(c->tid_, p, bytes,
                          store ? "global store" : kind == GlobalKind::kLoad ? "global load" : "prefetch",
                          c->grid_waited_);
    if (kind == GlobalKind::kPrefetch) return;  // (no data moved: not in the access profile)
    c->cta_->record(c->tid_, store ? kGlobalStore : kGlobalLoad, reinterpret_cast<uintptr_t>(p), bytes,
                    UW_EMU_CALL_SITE());
  }

  // Counts the group's requests.  An instruction of the warp is a call site of the body; which
  // passes of the lanes through a site are one execution of it:
  //   * a site every lane passes equally often (a uniform site: converged code): the k-th
  //     pass of each lane;
  //   * a site some lanes pass less often (an access predicated off, a data-dependent
  //     refill): the passes that follow the same pass of the nearest uniform site before them
  //     (the same loop iteration), in order -- the lanes that skip it there are absent.
  // Lanes that disagree on kind or size at one execution make separate requests.
  void flush(Trace& tr) {
    std::unordered_map<uintptr_t, std::array<uint32_t, kWarpSize>> passes;  // per site, per lane
    unsigned present = 0;
    for (int l = 0; l < kWarpSize; ++l)
      for (const Rec& r : tr.lanes[static_cast<size_t>(l)]) {
        ++passes[r.site][static_cast<size_t>(l)];
        present |= 1u << l;
      }
    if (present == 0) return;
    const size_t first = static_cast<size_t>(__builtin_ctz(present));
    std::unordered_map<uintptr_t, bool> uniform;
    for (const auto& sp : passes) {
      bool u = true;
      for (int l = 0; l < kWarpSize; ++l)
        u = u && (((present >> l) & 1u) == 0 || sp.second[static_cast<size_t>(l)] == sp.second[first]);
      uniform[sp.first] = u;
    }
    // Key: (site, anchor site, anchor pass, pass since the anchor); uniform sites anchor themselves.
    using Key = std::array<uintptr_t, 4>;
    std::map<Key, std::array<const Rec*, kWarpSize>> insns;
    for (int l = 0; l < kWarpSize; ++l) {
      std::unordered_map<uintptr_t, uintptr_t> seen, since;
      uintptr_t anchor = 0, anchor_pass = 0;
      for (const Rec& r : tr.lanes[static_cast<size_t>(l)]) {
        const uintptr_t k = seen[r.site]++;
        Key key;
        if (uniform[r.site]) {
          anchor = r.site;
          anchor_pass = k;
          since.clear();
          key = Key{r.site, r.site, k, 0};
        } else {
          key = Key{r.site, anchor, anchor_pass, since[r.site]++};
        }
        insns.emplace(key, std::array<const Rec*, kWarpSize>{}).first->second[static_cast<size_t>(l)] = &r;
      }
    }
    for (const auto& insn : insns) {
      unsigned left = 0;
      for (int l = 0; l < kWarpSize; ++l)
        if (insn.second[static_cast<size_t>(l)] != nullptr) left |= 1u << l;
      while (left != 0) {
        const Rec& f = *insn.second[static_cast<size_t>(__builtin_ctz(left))];
        const Rec* recs[kWarpSize] = {};
        for (int l = 0; l < kWarpSize; ++l) {
          const Rec* r = insn.second[static_cast<size_t>(l)];
          if (((left >> l) & 1u) == 0 || r->kind != f.kind || r->bytes != f.bytes) continue;
          recs[l] = r;
          left &= ~(1u << l);
        }
        if (f.kind <= kSharedAsync) {
          count_shared(static_cast<AccessKind>(f.kind), f.bytes, recs);
        } else {
          count_global(static_cast<AccessKind>(f.kind), f.bytes, recs);
        }
      }
    }
    for (auto& v : tr.lanes) v.clear();
    tr.open = false;
  }

  void count_shared(AccessKind kind, unsigned bytes, const Rec* const (&recs)[kWarpSize]) {
    AccessTotals& t = prof_.kind[kind];
    const int phases = bytes <= 4 ? 1 : static_cast<int>(bytes / 4), per = kWarpSize / phases;
    uint64_t units = 0, ideal = 0, lanes = 0;
    for (int p = 0; p < phases; ++p) {
      uintptr_t words[kWarpSize * 4];
      int n = 0;
      for (int l = p * per; l < (p + 1) * per; ++l) {
        if (recs[l] == nullptr) continue;
        ++lanes;
        for (uintptr_t w = recs[l]->at / 4; w <= (recs[l]->at + bytes - 1) / 4; ++w) words[n++] = w;
      }
      if (n == 0) continue;
      std::sort(words, words + n);
      n = static_cast<int>(std::unique(words, words + n) - words);
      int on_bank[kWarpSize] = {};
      uint64_t degree = 0;
      for (int i = 0; i < n; ++i) degree = std::max(degree, static_cast<uint64_t>(++on_bank[words[i] % kWarpSize]));
      units += degree;
      ideal += 1;
      t.max_degree = std::max(t.max_degree, degree);
      if (degree > prof_.worst_degree) {
        prof_.worst_degree = degree;
        static const char* const names[] = {"load", "store", "cp.async write"};
        std::string msg = "shared " + std::string(names[kind]) + " of " + std::to_string(bytes) +
                          " bytes per lane, " + std::to_string(degree) + " words on one bank; lane:offset";
        for (int l = p * per; l < (p + 1) * per; ++l)
          if (recs[l] != nullptr) msg += " " + std::to_string(l) + ":" + std::to_string(recs[l]->at);
        prof_.worst = msg;
      }
    }
    ++t.requests;
    t.units += units;
    t.ideal += ideal;
    t.bytes += lanes * bytes;
    if (units > ideal) ++t.worse;
  }

  void count_global(AccessKind kind, unsigned bytes, const Rec* const (&recs)[kWarpSize]) {
    AccessTotals& t = prof_.kind[kind];
    std::pair<uintptr_t, uintptr_t> spans[kWarpSize];
    uintptr_t sectors[kWarpSize * 2];
    int n = 0, ns = 0;
    for (int l = 0; l < kWarpSize; ++l) {
      if (recs[l] == nullptr) continue;
      spans[n++] = {recs[l]->at, recs[l]->at + bytes};
      for (uintptr_t s = recs[l]->at / 32; s <= (recs[l]->at + bytes - 1) / 32 && ns < kWarpSize * 2; ++s)
        sectors[ns++] = s;
    }
    std::sort(sectors, sectors + ns);
    ns = static_cast<int>(std::unique(sectors, sectors + ns) - sectors);
    std::sort(spans, spans + n);
    uint64_t distinct = 0;
    uintptr_t end = 0;
    for (int i = 0; i < n; ++i) {  // the union of the lanes' byte ranges
      const uintptr_t from = std::max(spans[i].first, end);
      if (spans[i].second > from) distinct += spans[i].second - from;
      end = std::max(end, spans[i].second);
    }
    const uint64_t ideal = (distinct + 31) / 32;
    ++t.requests;
    t.units += static_cast<uint64_t>(ns);
    t.ideal += ideal;
    t.bytes += static_cast<uint64_t>(n) * bytes;
    if (static_cast<uint64_t>(ns) > ideal) ++t.worse;
  }

  std::string describe(int tid, const char* what, const unsigned char* at, int other) const {
    char where[160];
    std::snprintf(where, sizeof(where), " (thread %d of CTA (%lld, %lld), shared byte %lld%s", tid,
                  static_cast<long long>(bx_), static_cast<long long>(by_),
                  static_cast<long long>(at - smem_),
                  other >= 0 ? ", other thread " : other == kAtomics ? ", written by atomics)" : ")");
    std::string msg = std::string("emulated kernel: ") + what + where;
    if (other >= 0) msg += std::to_string(other) + ")";
    return msg;
  }
  // One message per OS thread, alive until its next failing launch (launch returns it).
  static const char* keep(const std::string& msg) {
    static thread_local std::string kept;
    kept = msg;
    return kept.c_str();
  }
  [[noreturn]] void fail_at(int tid, const char* what, const unsigned char* at, int other) {
    fail(tid, keep(describe(tid, what, at, other)));
  }

  static constexpr size_t kStackBytes = 256 * 1024;
  struct Warp {
    unsigned mask = 0;
    int arrived = 0;
    uint64_t gen = 0;
    uint32_t sync_gen = 0;                   // completed syncwarp rounds
    uint32_t joined[kWarpSize][kWarpSize] = {};  // the last round whose mask held both lanes
    unsigned char slots[2][ThreadCtx::kSlotBytes * kWarpSize];
  };
  struct Thread {
    ThreadCtx ctx;
    Fiber fiber;
    std::unique_ptr<char[]> stack;
    bool done = false;
  };

  static void entry(void* arg) {
    Thread& th = *static_cast<Thread*>(arg);
    Cta* self = th.ctx.cta_;
    self->call_(self->body_, th.ctx);
    th.done = true;
    --self->live_;
    ++self->progress_;
    // An exited thread no longer holds up a CTA barrier (as on sm_70+).
    if (self->bar_arrived_ > 0 && self->bar_arrived_ == self->live_) {
      self->bar_arrived_ = 0;
      self->bar_voted_ = self->bar_vote_;
      self->bar_vote_ = false;
      ++self->bar_gen_;
    }
    for (;;) self->yield(th.ctx.tid_);  // back to the scheduler, which resumes no finished thread
  }

  void yield(int tid) {
    fiber_switch(&threads_[static_cast<size_t>(tid)].fiber, &main_);
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
  size_t smem_bytes_ = 0;
  // Race-check shadow, one entry per 4-byte word (rd_*: [word][warp]).
  std::vector<int16_t> writer_, in_flight_;
  std::vector<uint32_t> w_bar_, w_sync_;
  std::vector<uint32_t> rd_lanes_, rd_bar_, rd_sync_;
  std::vector<uint32_t> bulk_bar_;  // a bulk copy's word: its mbarrier's shared-memory offset
  std::vector<uint8_t> proxy_ok_;   // the word's last write is visible to the async proxy
  std::vector<uint16_t> wg_inflight_;  // wgmmas issued and not yet waited for that read the word
  std::vector<std::vector<size_t>> proxy_pending_;  // per thread: words it wrote since its last proxy fence
  std::unordered_map<size_t, MBar> mbars_;          // by shared-memory offset
  std::unordered_map<uint64_t, uint32_t> seen_;     // (thread << 32 | barrier offset) -> phases its waits saw
  std::string unwritten_read_;  // the first read of a word no thread had written
  bool profiling_ = false;      // profile().on when the launch started
  const GlobalRanges* bounds_ = nullptr;  // global_ranges() when the CTA started
  std::vector<Trace> traces_;   // per warp, when profiling
  ProfileTotals prof_;
  std::vector<Warp> warps_;
  std::vector<Thread> threads_;
  Fiber main_;  // the scheduler's context while a fiber runs
  void* body_ = nullptr;
  void (*call_)(void*, ThreadCtx&) = nullptr;
  int live_ = 0, bar_arrived_ = 0;
  bool bar_vote_ = false, bar_voted_ = false;  // (barrier's vote)
  uint64_t bar_gen_ = 0, progress_ = 0;
  const char* error_ = nullptr;
};

inline int ThreadCtx::h_nthreads() const { return cta_->nthreads(); }
inline int64_t ThreadCtx::h_block(int which) const {
  return which == 0 ? cta_->bx() : which == 1 ? cta_->by() : which == 2 ? cta_->gx() : cta_->gy();
}
inline unsigned char* ThreadCtx::h_smem() const { return cta_->smem(); }
inline void ThreadCtx::h_syncthreads() {
  fenced_since_sync_ = false;
  cta_->barrier(tid_);
}
inline bool ThreadCtx::h_syncthreads_or(bool p) {
  fenced_since_sync_ = false;
  return cta_->barrier(tid_, p);
}
// The trigger lets the next launch start; before this thread's wait, that launch's early reads
// of its own planes could meet the writes of a launch still ahead of this one.
inline void ThreadCtx::h_grid_dep_launch() {
  if (!grid_waited_) cta_->fail_early_trigger(tid_);
}
inline void ThreadCtx::h_threadfence() {
  const uint64_t seq = cta_->grid->next();
  for (const float* p : unfenced_) cta_->grid->fence(p, cta_->id(), tid_, seq);
  unfenced_.clear();
  fenced_since_sync_ = true;
}
inline void ThreadCtx::h_st_grid(const float* p) {
  cta_->check_wait(tid_, p, sizeof(float), "grid store", grid_waited_);
  cta_->grid->store(p, cta_->id(), tid_);
  unfenced_.push_back(p);
}
inline void ThreadCtx::h_ld_grid(const float* p) {
  cta_->check_wait(tid_, p, sizeof(float), "grid load", grid_waited_);
  const GridShadow::Store* s = cta_->grid->foreign(p, cta_->id());
  if (s == nullptr) return;
  if (!cta_->grid->released(*s))
    cta_->fail_grid(tid_, "grid memory not released: no threadfence between another CTA's store and its arrival "
                          "atomic", *s);
  if (!fenced_since_sync_)
    cta_->fail_grid(tid_, "grid memory not acquired: no threadfence between learning of the other CTA's arrival "
                          "and the load", *s);
}
inline const unsigned char* ThreadCtx::exchange(unsigned mask, const void* in, size_t n, bool sync) {
  return cta_->exchange(tid_, mask, in, n, sync);
}
inline void ThreadCtx::h_load(const void* p, void* out, size_t n) {
  cta_->shared_access(tid_, p, n, Cta::kRead, UW_EMU_CALL_SITE());
  std::memcpy(out, p, n);
}
inline void ThreadCtx::h_store(void* p, const void* in, size_t n) {
  cta_->shared_access(tid_, p, n, Cta::kWrite, UW_EMU_CALL_SITE());
  std::memcpy(p, in, n);
}
inline void ThreadCtx::h_atomic(void* p, size_t n) {
  if (cta_->in_shared(p)) {
    cta_->shared_access(tid_, p, n, Cta::kAtomic);
  } else {  // a global atomic: other CTAs may act on it (see launch)
    cta_->check_wait(tid_, p, n, "global atomic", grid_waited_);
    cta_->published = true;
    cta_->grid->atomic(cta_->id());
    fenced_since_sync_ = false;
  }
}
inline void ThreadCtx::h_cp_async(void* smem_dst, const void* gmem_src, int src_bytes, int size) {
  if (reinterpret_cast<uintptr_t>(gmem_src) % static_cast<uintptr_t>(size) != 0)
    cta_->fail_access(tid_, size == 16 ? "cp.async source not 16-byte aligned" : "cp.async source not 4-byte aligned",
                      smem_dst);
  const uintptr_t site = UW_EMU_CALL_SITE();
  cta_->shared_access(tid_, smem_dst, static_cast<size_t>(size), Cta::kAsyncIssue, site);
  Copy cp;
  cp.dst = static_cast<unsigned char*>(smem_dst);
  cp.size = size;
  std::memset(cp.bytes, 0, 16);
  const int n = src_bytes < 0 ? 0 : (src_bytes > size ? size : src_bytes);
  if (n > 0) {
    cta_->check_global(tid_, gmem_src, static_cast<size_t>(n), "cp.async source", grid_waited_);
    cta_->record(tid_, kGlobalAsync, reinterpret_cast<uintptr_t>(gmem_src), static_cast<size_t>(n), site);
  }
  std::memcpy(cp.bytes, gmem_src, static_cast<size_t>(n));
  open_.push_back(cp);
}
inline void ThreadCtx::h_wait(int n) {
  while (groups_.size() > static_cast<size_t>(n)) {
    for (const Copy& cp : groups_.front()) {
      std::memcpy(cp.dst, cp.bytes, static_cast<size_t>(cp.size));
      cta_->shared_access(tid_, cp.dst, static_cast<size_t>(cp.size), Cta::kAsyncLand);
    }
    groups_.erase(groups_.begin());
  }
}

inline void ThreadCtx::h_mbar_init(uint64_t* bar, unsigned count) { cta_->mbar_init(tid_, bar, count); }
inline void ThreadCtx::h_mbar_init_fence() { cta_->mbar_init_fence(tid_); }
inline void ThreadCtx::h_mbar_arrive(uint64_t* bar, unsigned bytes) { cta_->mbar_arrive(tid_, bar, bytes); }
inline void ThreadCtx::h_bulk_copy(void* smem_dst, const void* gmem_src, unsigned bytes, uint64_t* bar) {
  cta_->bulk_copy(tid_, smem_dst, gmem_src, bytes, bar, grid_waited_);
}
inline void ThreadCtx::h_mbar_wait(uint64_t* bar, unsigned parity) { cta_->mbar_wait(tid_, bar, parity); }

// The bf16 in half `half` (0 low, 1 high) of a register, exactly, as a double.
inline double bf16_half(uint32_t reg, int half) {
  const uint32_t bits = (half ? (reg >> 16) : (reg & 0xFFFFu)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return static_cast<double>(f);
}
// A [16][16] of an m16n8k16 A fragment, rebuilt from the 32 lanes' exchange slots, each of
// which holds the lane's four A registers first (the PTX layout functions of ctx.cuh).
inline void gather_frag_a(const unsigned char* slots, double (&A)[16][16]) {
  for (int l = 0; l < kWarpSize; ++l) {
    uint32_t r[4];
    std::memcpy(r, slots + ThreadCtx::kSlotBytes * l, sizeof(r));
    for (int i = 0; i < 8; ++i) A[frag_a_row(l, i)][frag_a_col(l, i)] = bf16_half(r[i / 2], i & 1);
  }
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
  double A[16][16], B[16][8];
  gather_frag_a(s, A);
  for (int l = 0; l < kWarpSize; ++l) {
    Payload p;
    std::memcpy(&p, s + kSlotBytes * l, sizeof(p));
    for (int i = 0; i < 4; ++i) B[frag_b_row(l, i)][frag_b_col(l, i)] = bf16_half(p.b[i / 2], i & 1);
  }
  const int me = lane();
  for (int i = 0; i < 4; ++i) {
    const int r = frag_c_row(me, i), col = frag_c_col(me, i);
    double acc = 0.0;  // products of two bf16 are exact in double; one fp32 rounding at the end
    for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][col];
    d[i] = static_cast<float>(acc + static_cast<double>(c[i]));
  }
}

inline uint32_t ThreadCtx::h_smem_addr(const void* p) const {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - cta_->smem());
}
inline void ThreadCtx::h_fence_proxy_async() { cta_->fence_proxy_async(tid_); }

// wgmma.mma_async m64nNk16 (bf16 -> fp32, A in registers, B K-major and unswizzled in shared
// memory), per the PTX ISA's "Register Fragments and Shared Memory Matrix Layouts": warp w of
// the warpgroup holds rows 16w..16w+15 of A in the mma.sync m16n8k16 A layout, and its
// accumulators d[j][e] are the m16n8 C fragment of columns 8j..8j+7; B element (k, n) is the
// bf16 at start + (n % 8) * 16 + (n / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo (the canonical
// K-major layout ((8, m), (8, 2)) : ((16 B, sbo), (2 B, lbo))).  A warp's outputs depend on
// its own rows alone, so the emulator exchanges A within the warp; each output is the exactly
// rounded fp32 value of its 16 products plus d (as mma_bf16_16816; hardware rounds in its own
// order).  Checked: a warpgroup-sized CTA, a wgmma_fence since the thread's last commit (the
// registers it reads were written by ordinary instructions), a descriptor with no swizzle and
// no base offset, B inside shared memory and written through the async proxy or fenced since
// (fence.proxy.async), and B's words stay read until the wait that retires the group.
inline void ThreadCtx::h_wgmma(float* d, int n, const uint32_t (&a)[4], uint64_t desc, bool scale_d) {
  if (cta_->nthreads() % 128 != 0) cta_->fail_access(tid_, "wgmma in a CTA that is not whole warpgroups", cta_->smem());
  if (!wg_fenced_)
    cta_->fail_access(tid_, "wgmma without a wgmma.fence since the last wgmma.commit_group", cta_->smem());
  if ((desc >> 49) & 0x7u || (desc >> 62) != 0)
    cta_->fail_access(tid_, "wgmma descriptor with a swizzle mode or base offset (the emulator models none)",
                      cta_->smem());
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
  if (lane() == 0) cta_->wgmma_read(tid_, start, lbo, sbo, n, true);
  const unsigned char* s = exchange(kFullMask, a, sizeof(a));
  double A[16][16];
  gather_frag_a(s, A);
  const unsigned char* sm = cta_->smem();
  const int me = lane();
  for (int j = 0; j < n / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = frag_c_row(me, e), col = 8 * j + frag_c_col(me, e);
      double acc = 0.0;  // exact products and sum; one fp32 rounding
      for (int k = 0; k < 16; ++k) {
        uint16_t b;
        std::memcpy(&b, sm + start + (col % 8) * 16 + (col / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo, 2);
        acc += A[row][k] * bf16_half(b, 0);
      }
      float& out = d[4 * j + e];
      out = static_cast<float>(acc + (scale_d ? static_cast<double>(out) : 0.0));
    }
  wg_open_.push_back(WgRead{start, lbo, sbo, n});
}
inline void ThreadCtx::h_wgmma_commit() {
  wg_groups_.push_back(std::move(wg_open_));
  wg_open_.clear();
  wg_fenced_ = false;
}
inline void ThreadCtx::h_wgmma_wait(int n) {
  while (wg_groups_.size() > static_cast<size_t>(n)) {
    if (lane() == 0)
      for (const WgRead& r : wg_groups_.front()) cta_->wgmma_read(tid_, r.start, r.lbo, r.sbo, r.n, false);
    wg_groups_.erase(wg_groups_.begin());
  }
}

// The order launch() runs a grid's CTAs in, and how many it keeps in flight.  A GPU runs a
// grid's CTAs in no order a kernel may rely on, many at once, and a CTA's warps in no fixed
// order either; the kernels here assume none (the split-K fix-up is done by whichever CTA of
// a row block arrives last), and tests check that by running one launch in several orders and
// comparing the bits.
//   * forward (the default): CTAs one after another, x fastest, then y; in a CTA the warps
//     take turns in index order (each turn runs a warp's lanes to their next collective);
//   * reverse: the CTAs the other way round;
//   * shuffle: the CTAs in a permutation drawn from `seed`, and in every round the turns in
//     an order drawn from it too.
// With `resident` > 1 that many CTAs are in flight together, their warps' turns mixed in one
// round, so one CTA's global-memory writes and atomics interleave with another's between its
// collectives, as on the device.  And a CTA whose turn did a global atomic (an arrival count,
// a histogram bin) gets no more turns while another CTA can run: whatever it does after
// announcing itself happens as late as possible, so a CTA that counts itself in before its
// partial results are written hands a stale workspace to the CTA that sums them.  (Plain
// global memory stays sequentially consistent; the fences of what CTAs hand each other are
// checked by GridShadow whatever the schedule.)  Process-wide; set it only while no emulation runs.
enum class CtaOrder { kForward, kReverse, kShuffle };
struct CtaOrderSetting {
  CtaOrder order = CtaOrder::kForward;
  uint64_t seed = 0;  // the shuffles' random stream
  int resident = 1;   // CTAs in flight at once
};
inline CtaOrderSetting& cta_order() {
  static CtaOrderSetting setting;
  return setting;
}

// Runs the grid as cta_order() says; nullptr or the first error.
template <class F>
const char* launch(int64_t grid_x, int64_t grid_y, int threads, size_t smem_bytes, F&& body) {
  if (threads <= 0 || threads % kWarpSize != 0) return "emulator: block size must be a positive multiple of 32";
  if (grid_x <= 0 || grid_y <= 0) return nullptr;  // an empty grid runs nothing
  std::vector<int64_t> order(static_cast<size_t>(grid_x * grid_y));
  std::iota(order.begin(), order.end(), int64_t{0});
  const CtaOrderSetting how = cta_order();
  std::mt19937_64 rng(how.seed);
  const bool shuffle = how.order == CtaOrder::kShuffle;
  if (how.order == CtaOrder::kReverse) std::reverse(order.begin(), order.end());
  if (shuffle) std::shuffle(order.begin(), order.end(), rng);
  const size_t resident = how.resident > 1 ? static_cast<size_t>(how.resident) : 1;
  std::vector<std::unique_ptr<Cta>> live;
  std::vector<std::pair<size_t, int>> turns;  // (CTA in `live`, warp)
  std::vector<uint64_t> before;
  std::vector<bool> ran;
  GridShadow grid(grid_x * grid_y);
  size_t next = 0;
  while (next < order.size() || !live.empty()) {
    while (live.size() < resident && next < order.size()) {  // CTAs start in `order`
      const int64_t i = order[next++];
      live.emplace_back(new Cta(threads, smem_bytes, i % grid_x, i / grid_x, grid_x, grid_y, &grid));
      live.back()->start(body);
    }
    // The CTAs held back after a global atomic wait while another can run.
    bool any_runnable = false;
    for (const auto& cta : live) any_runnable |= !cta->published;
    if (!any_runnable)
      for (const auto& cta : live) cta->published = false;
    turns.clear();
    before.assign(live.size(), 0);
    ran.assign(live.size(), false);
    for (size_t k = 0; k < live.size(); ++k) {
      if (live[k]->published) continue;
      before[k] = live[k]->progress();
      ran[k] = true;
      for (int w = 0; w < live[k]->nwarps(); ++w) turns.emplace_back(k, w);
    }
    if (shuffle || live.size() > 1) std::shuffle(turns.begin(), turns.end(), rng);
    for (const auto& kw : turns) {
      Cta& cta = *live[kw.first];
      if (live.size() > 1 && cta.published) continue;
      cta.step_warp(kw.second);
      if (const char* e = cta.error()) return e;
    }
    for (size_t k = live.size(); k-- > 0;) {
      if (!ran[k] || live[k]->end_round(before[k])) continue;
      if (const char* e = live[k]->error()) return e;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return nullptr;
}

}  // namespace emu
}  // namespace unweight
