// Self-test bodies of the warp emulator (declared in selftest.h).  Each body is written
// once against the context interface; the host entry points run it through emu::launch,
// selftest_mma_device runs the mma body on a GPU.
#include <cuda_runtime.h>

#include <type_traits>

#include "../device_util.cuh"
#include "global_bounds.h"
#include "host_buffer.h"
#include "selftest.h"
#include "warp_emu.h"

namespace unweight {
namespace emu {
namespace {

struct MmaArgs {
  const uint16_t* A;
  const uint16_t* B;
  const float* C;
  float* D;
};

// The PTX ISA formulas spelled out here on purpose (not frag_*): a layout slip in either the
// emulator or the helpers shows up as a mismatch.
template <class Ctx>
UW_HD void mma_body(Ctx& c, const MmaArgs& a) {
  const int lane = c.lane(), group = lane >> 2, tig = lane % 4;
  uint32_t ra[4], rb[2];
  float rc[4], rd[4];
  for (int r = 0; r < 4; ++r) {  // A register r holds a[2r], a[2r+1]
    uint32_t w = 0;
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * r + h;
      const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
      const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      w |= static_cast<uint32_t>(a.A[row * 16 + col]) << (16 * h);
    }
    ra[r] = w;
  }
  for (int r = 0; r < 2; ++r) {
    uint32_t w = 0;
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * r + h;
      const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      w |= static_cast<uint32_t>(a.B[row * 8 + group]) << (16 * h);
    }
    rb[r] = w;
  }
  for (int i = 0; i < 4; ++i) rc[i] = a.C[((i < 2) ? group : group + 8) * 8 + tig * 2 + (i & 1)];
  c.mma_bf16_16816(rd, ra, rb, rc);
  for (int i = 0; i < 4; ++i) a.D[((i < 2) ? group : group + 8) * 8 + tig * 2 + (i & 1)] = rd[i];
}

__global__ void mma_kernel(MmaArgs a) {
  DeviceCtx c;
  mma_body(c, a);
}

// One warpgroup: D[64][N] = A[64][16] @ B[16][N] through one wgmma m64nNk16 (N in 8, 16, 32,
// 64, 128), A loaded into registers and B stored into shared memory by the PTX ISA's formulas,
// spelled out here (not the emulator's): A's fragments per warp are the mma.sync m16n8k16 A
// layout of rows 16w..16w+15; B is K-major and unswizzled, core matrices of 8 columns x 8 k,
// with the k chunks apart by lbo = 128 N / 8 bytes and the column groups by sbo = 128 (the
// transposed choice of the fused GEMM's, so both strides are exercised); D's registers d[j][e]
// are row 16w + g (+8 for e >= 2), column 8j + 2t + (e & 1).  kind 0 by the rules; 1: no
// fence.proxy.async after the stores of B; 2: no wgmma.fence before the wgmma; 3: a thread
// rewrites a word of B between the commit and the wait; 4: a descriptor asking for the 128-byte
// swizzle; 5: the issuing warp's lane 0 itself rewrites a word of B before the wait (each must
// make the emulator report an error).
struct WgArgs {
  const uint16_t* A;
  const uint16_t* B;
  float* D;
  int kind;
};

template <int N, class Ctx>
UW_HD void wgmma_body(Ctx& c, const WgArgs& a) {
  const int tid = c.tid(), lane = c.lane(), w = c.warp(), g = lane >> 2, t = lane & 3;
  constexpr uint32_t lbo = 128 * N / 8, sbo = 128;
  unsigned char* sb = c.smem();
  for (int i = tid; i < N * 8; i += 128) {  // word i: column i / 8, k pair i % 8
    const int col = i / 8, kp = i % 8, k = 2 * kp;
    const uint32_t v = static_cast<uint32_t>(a.B[k * N + col]) | static_cast<uint32_t>(a.B[(k + 1) * N + col]) << 16;
    const uint32_t at = (col % 8) * 16 + (col / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
    c.sts(reinterpret_cast<uint32_t*>(sb + at), v);
  }
  if (a.kind != 1) c.fence_proxy_async();
  c.syncthreads();
  uint32_t ra[4];
  for (int r = 0; r < 4; ++r) {
    uint32_t v = 0;
    for (int h = 0; h < 2; ++h) {
      const int i = 2 * r + h;
      const int row = 16 * w + ((i < 2 || (i >= 4 && i < 6)) ? g : g + 8);
      const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      v |= static_cast<uint32_t>(a.A[row * 16 + col]) << (16 * h);
    }
    ra[r] = v;
  }
  float d[N / 8][4];
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) d[j][e] = 1e30f;  // scale_d = 0: not added
  uint64_t desc = wgmma_desc(c.smem_addr(sb), lbo, sbo);
  if (a.kind == 4) desc |= uint64_t{1} << 62;
  if (a.kind != 2) c.wgmma_fence();
  c.template wgmma<N>(d, ra, desc, false);
  c.wgmma_commit();
  if (a.kind == 3 && tid == 127) c.sts(reinterpret_cast<uint32_t*>(sb), 0u);
  if (a.kind == 5 && tid == 0) c.sts(reinterpret_cast<uint32_t*>(sb), 0u);
  c.template wgmma_wait<0>(d);
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) a.D[(16 * w + g + (e >= 2 ? 8 : 0)) * N + 8 * j + 2 * t + (e & 1)] = d[j][e];
}

template <int N>
__global__ void __launch_bounds__(128) wgmma_kernel(WgArgs a) {
  DeviceCtx c;
  wgmma_body<N>(c, a);
}

// f(std::integral_constant<int, N>) for the runtime n (false: no such wgmma n here).
template <class F>
bool with_wg_n(int n, F&& f) {
  switch (n) {
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

struct CollArgs {
  const uint32_t* src;  // [64 * 4 * 2] words: two 16-byte rows per thread
  int32_t* out;
};

template <class Ctx>
UW_HD void collectives_body(Ctx& c, const CollArgs& a) {
  const int tid = c.tid(), lane = c.lane();
  int32_t* o = a.out + tid * kCollectiveFields;
  int s = lane;
  for (int m = 16; m > 0; m >>= 1) s += c.shfl_xor(s, m);
  o[0] = s;
  o[1] = static_cast<int32_t>(c.ballot(lane % 3 == 0));
  o[2] = c.shfl(lane, (lane + 5) % 32);
  uint32_t* sq = reinterpret_cast<uint32_t*>(c.smem());  // [64], [64], then stages
  c.sts(sq + tid, static_cast<uint32_t>(tid * tid));
  c.syncthreads();
  o[3] = static_cast<int32_t>(c.lds(sq + 63 - tid));
  uint32_t* sw = sq + 64;  // a word per thread, exchanged inside the warp across a syncwarp
  c.sts(sw + tid, static_cast<uint32_t>(3 * tid));
  c.syncwarp();
  o[4] = static_cast<int32_t>(c.lds(sw + (tid & ~31) + (lane + 1) % 32));
  uint32_t* stage = sq + 128 + tid * 8;  // two 16-byte stages per thread
  c.cp_async16(stage, a.src + tid * 8, 16);
  c.cp_async_commit();
  c.template cp_async_wait<0>();
  o[5] = static_cast<int32_t>(c.lds(stage));
  c.cp_async16(stage, a.src + tid * 8 + 4, 16);
  c.cp_async_commit();
  c.cp_async16(stage + 4, a.src + tid * 8, 16);
  c.cp_async_commit();
  c.template cp_async_wait<1>();
  o[6] = static_cast<int32_t>(c.lds(stage));
  c.template cp_async_wait<0>();
  o[7] = static_cast<int32_t>(c.lds(stage + 4));
  o[8] = lane < 16 ? c.shfl(lane * 7, 3, 0x0000FFFFu) : -1;
}

template <class Ctx>
UW_HD void error_body(Ctx& c, int kind, const uint32_t* src) {
  uint32_t* sq = reinterpret_cast<uint32_t*>(c.smem());  // [64] words, then a 16-byte stage per thread
  const int tid = c.tid(), lane = c.lane();
  if (kind >= 3) c.sts(sq + tid, static_cast<uint32_t>(tid));
  if (kind == 3) {  // read of the other warp's word: a syncwarp orders nothing across warps
    c.syncwarp();
    (void)c.lds(sq + (tid + 32) % 64);
    return;
  }
  if (kind == 4) {  // read of a neighbour lane's word with only a ballot in between
    (void)c.ballot(true);
    (void)c.lds(sq + (tid & ~31) + (lane + 1) % 32);
    return;
  }
  if (kind == 5) {  // rewrite of a word that lane 0 read, in the same warp, without a syncwarp
    c.syncthreads();
    if (lane == 0) (void)c.lds(sq + tid + 1);
    (void)c.ballot(true);
    c.sts(sq + tid, 7u);
    return;
  }
  if (kind == 6 || kind == 7) {  // a stage read before its wait: by its thread, or by a neighbour after a syncwarp
    uint32_t* stage = sq + 64 + 4 * tid;
    c.cp_async16(stage, src + 4 * tid, 16);
    c.cp_async_commit();
    if (kind == 7) c.syncwarp();
    (void)c.lds(kind == 6 ? stage : sq + 64 + 4 * (tid ^ 1));
    c.template cp_async_wait<0>();
    return;
  }
  if (kind == 8) {  // one word past the launch's shared memory
    (void)c.lds(sq + 64 + 4 * 64);
    return;
  }
  if (kind == 9) {  // an 8-byte load at a 4-byte offset
    uint32_t v[2];
    c.syncthreads();
    c.lds_v2(reinterpret_cast<const unsigned char*>(sq + 1), v);
    return;
  }
  if (kind == 10) {  // a read of shared memory nobody wrote
    (void)c.lds(sq + 64 + 4 * tid);
    return;
  }
  if (kind == 11) {  // atomics on one word (fine among themselves), then a plain read with no barrier
    c.syncthreads();
    c.atomic_add(sq, 1u);
    (void)c.lds(sq);
    return;
  }
  if (kind == 12) {  // a 2-byte read of the upper half of the other warp's word, no barrier between
    (void)c.lds(reinterpret_cast<const uint16_t*>(sq + (tid + 32) % 64) + 1);
    return;
  }
  if (kind == 13) {  // a 2-byte store: the race check models whole words only
    c.syncthreads();
    c.sts(reinterpret_cast<uint16_t*>(sq + tid), static_cast<uint16_t>(1));
    return;
  }
  if (kind == 0) {
    if (c.lane() != 0) c.syncwarp();
  } else if (kind == 1) {
    (void)c.ballot(true, c.lane() == 5 ? 0x0000FFFFu : kFullMask);
  } else if (c.tid() == 32) {
    c.syncthreads();  // the rest of its warp waits for it in a syncwarp: a hang on the GPU
  } else if (c.warp() == 1) {
    c.syncwarp();
  } else {
    c.syncthreads();
  }
}

// Two CTAs of 32 threads hand each other one fp32 word per thread the way the split-K fix-up
// does: store, threadfence, barrier, thread 0 counts the CTA in, barrier; the CTA that counted
// last fences and sums both CTAs' words into out.  kind 1 leaves out the storing threads'
// fence, kind 2 the summing threads' fence, kind 3 fences only after the arrival.
template <class Ctx>
UW_HD void grid_body(Ctx& c, int kind, float* data, int* counter, float* out) {
  const int b = static_cast<int>(c.block_x()), t = c.tid();
  c.st_grid(data + b * 32 + t, static_cast<float>(b * 100 + t));
  if (kind == 0 || kind == 2) c.threadfence();
  c.syncthreads();
  int* last = reinterpret_cast<int*>(c.smem());
  if (t == 0) c.sts(last, c.atomic_add(counter, 1) == 1 ? 1 : 0);
  if (kind == 3) c.threadfence();
  c.syncthreads();
  if (!c.lds(last)) return;
  if (kind != 2) c.threadfence();
  out[t] = c.ld_grid(data + t) + c.ld_grid(data + 32 + t);
}

// Programmatic dependent launch (selftest.h, selftest_grid_dep_host): a warp streams `w`
// (which no launch writes), waits on the launches ahead, reads x, counts itself on `counter`
// and writes y -- x, y and the counter being what an earlier launch may still use -- and only
// then lets the next launch start.  kind 1 reads x before the wait, kind 2 counts itself before
// it, kind 3 stores to y before it, kind 4 lets the next launch start before it.
template <class Ctx>
UW_HD void grid_dep_body(Ctx& c, int kind, const uint8_t* w, const uint16_t* x, int32_t* counter, uint16_t* y) {
  using cuda::detail::ld_reuse_v4, cuda::detail::ld_stream_v4, cuda::detail::st_v4;
  const int lane = c.lane();
  uint32_t wv[4], xv[4];
  ld_stream_v4(w + 16 * lane, wv);
  if (kind == 3) st_v4(y + 8 * lane, wv);
  if (kind == 1) ld_reuse_v4(x + 8 * lane, xv);
  if (kind == 2 && lane == 0) c.atomic_add(counter, int32_t{1});
  if (kind == 4) c.grid_dep_launch();
  c.grid_dep_wait();
  c.grid_dep_launch();
  ld_reuse_v4(x + 8 * lane, xv);
  if (kind != 2 && lane == 0) c.atomic_add(counter, int32_t{1});
  for (int i = 0; i < 4; ++i) wv[i] ^= xv[i];
  st_v4(y + 8 * lane, wv);
}

// Access patterns for the profile's model (selftest.h, selftest_access_host).
template <class Ctx>
UW_HD void access_body(Ctx& c, int op, int bytes, int stride, uint32_t lanes, unsigned char* gbuf, int region) {
  const int lane = c.lane();
  unsigned char* sm = c.smem();
  if (op == 0) {  // every word of the region written first (4-byte stores, one word per lane and round)
    for (int w = lane; w < region / 4; w += kWarpSize) c.sts(reinterpret_cast<uint32_t*>(sm) + w, 0u);
    c.syncwarp();
  }
  if (((lanes >> lane) & 1u) == 0) return;
  unsigned char* s = sm + lane * stride;
  const uint8_t* g = gbuf + lane * stride;
  if (op == 0) {
    if (bytes == 1) (void)c.lds(s);
    if (bytes == 2) (void)c.lds(reinterpret_cast<const uint16_t*>(s));
    if (bytes == 4) (void)c.lds(reinterpret_cast<const uint32_t*>(s));
    uint32_t v[4];
    if (bytes == 8) c.lds_v2(s, reinterpret_cast<uint32_t(&)[2]>(v));
    if (bytes == 16) c.lds_v4(s, v);
  } else if (op == 1) {
    if (bytes == 4) c.sts(reinterpret_cast<uint32_t*>(s), 1u);
    if (bytes == 8) c.sts(reinterpret_cast<uint64_t*>(s), uint64_t{1});
    if (bytes == 16) c.sts(reinterpret_cast<uint4*>(s), make_uint4(1u, 2u, 3u, 4u));
  } else if (op == 2) {
    c.cp_async16(s, g);
    c.cp_async_commit();
    c.template cp_async_wait<0>();
  } else if (op == 3) {
    uint32_t v[4];
    if (bytes == 4) v[0] = cuda::detail::ld_stream_u32(g);
    if (bytes == 8) cuda::detail::ld_stream_v2(g, v[0], v[1]);
    if (bytes == 16) cuda::detail::ld_stream_v4(g, v);
    (void)v;
  } else {
    const uint32_t v[4] = {1u, 2u, 3u, 4u};
    cuda::detail::st_v4(reinterpret_cast<uint16_t*>(gbuf + lane * stride), v);
  }
}

// selftest.h, selftest_bulk_host.  Shared memory: two 512-byte slots, then two mbarriers.
template <class Ctx>
UW_HD void bulk_body(Ctx& c, int kind, const uint32_t* src, uint32_t* out) {
  constexpr int kSlot = 512, kSteps = 4;
  unsigned char* ring = c.smem();
  uint64_t* bars = reinterpret_cast<uint64_t*>(c.smem() + 2 * kSlot);
  const int lane = c.lane();
  if (lane == 0) {
    for (int j = 0; j < 2; ++j) c.mbar_init(bars + j, 1);
    if (kind != 3) c.mbar_init_fence();
  }
  c.syncwarp();
  auto issue = [&](int q) {
    if (lane == 0 && q < kSteps) {
      const unsigned bytes = kind == 6 ? 8u : static_cast<unsigned>(kSlot);
      c.mbar_arrive_expect_tx(bars + q % 2, kind == 5 && q == 1 ? bytes + 16 : bytes);
      if (kind == 7 && q == 0) c.mbar_arrive_expect_tx(bars, 0);
      c.bulk_copy(ring + (q % 2) * kSlot, src + q * (kSlot / 4), bytes, bars + q % 2);
    }
  };
  issue(0);
  issue(1);
  uint32_t acc[4] = {0, 0, 0, 0};
  const int last = kind == 4 ? kSteps - 1 : kSteps;
  for (int q = 0; q < last; ++q) {
    if (!(kind == 1 && q == 1)) c.mbar_wait(bars + q % 2, static_cast<unsigned>(q / 2) & 1u);
    uint32_t v[4];
    c.lds_v4(ring + (q % 2) * kSlot + 16 * lane, v);
    for (int i = 0; i < 4; ++i) acc[i] += v[i];
    if (kind != 2) {
      c.syncwarp();  // every lane has read the slot before lane 0 refills it
    } else {
      (void)c.ballot(true);  // in step, but a ballot orders no memory
    }
    issue(q + 2);
  }
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = acc[i];
}

}  // namespace

const char* selftest_bulk_host(int kind, uint32_t* out) {
  const HostBuffer buf(4 * 512);
  uint32_t* s = reinterpret_cast<uint32_t*>(buf.data());
  for (uint32_t i = 0; i < 4 * 128; ++i) s[i] = i * 2654435761u;
  const GlobalBounds scope{{s, 4 * 512}};
  return launch(1, 1, kWarpSize, 2 * 512 + 16, [&](ThreadCtx& c) { bulk_body(c, kind, s, out); });
}

const char* selftest_access_host(int op, int bytes, int stride, uint32_t lanes, int64_t bound) {
  const bool ok = (op == 0 && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8 || bytes == 16)) ||
                  (op == 1 && (bytes == 4 || bytes == 8 || bytes == 16)) || ((op == 2 || op == 4) && bytes == 16) ||
                  (op == 3 && (bytes == 4 || bytes == 8 || bytes == 16));
  if (!ok || stride < 0 || stride > 512 || stride % bytes != 0) return "selftest_access: bad op, size or stride";
  const int region = (kWarpSize * stride + 16 + 127) / 128 * 128;
  const HostBuffer gbuf(static_cast<size_t>(region));  // sectors fall as on the device
  unsigned char* g = gbuf.data();
  if (bound > region) return "selftest_access: bound past the buffer";
  const GlobalBounds scope{{g, bound >= 0 ? static_cast<size_t>(bound) : static_cast<size_t>(region)}};
  return launch(1, 1, kWarpSize, static_cast<size_t>(region),
                [&](ThreadCtx& c) { access_body(c, op, bytes, stride, lanes, g, region); });
}

static_assert(kProfileKinds == kAccessKinds, "selftest.h lists the profile's kinds of warp_emu.h");

void take_profile(bool on, uint64_t* out, std::string* worst) {
  std::lock_guard<std::mutex> lock(profile().mu);
  const ProfileTotals& t = profile().totals;
  for (int k = 0; k < kAccessKinds; ++k) {
    const AccessTotals& a = t.kind[k];
    const uint64_t f[kProfileFields] = {a.requests, a.units, a.ideal, a.bytes, a.worse, a.max_degree};
    for (int i = 0; i < kProfileFields; ++i) out[k * kProfileFields + i] = f[i];
  }
  *worst = t.worst;
  profile().totals = ProfileTotals{};
  profile().on = on;
}

const char* selftest_grid_host(int kind, float* out) {
  std::vector<float> data(64, 0.f);
  int counter = 0;
  return launch(2, 1, kWarpSize, sizeof(int), [&](ThreadCtx& c) { grid_body(c, kind, data.data(), &counter, out); });
}

const char* selftest_grid_dep_host(int kind) {
  std::vector<uint8_t> w(16 * kWarpSize, 1);
  std::vector<uint16_t> x(8 * kWarpSize, 2), y(8 * kWarpSize, 0);
  int32_t counter = 0;
  GlobalBounds bounds{{w.data(), w.size()}};
  bounds.after_wait(x.data(), x.size() * sizeof(uint16_t));
  bounds.after_wait(y.data(), y.size() * sizeof(uint16_t));
  bounds.after_wait(&counter, sizeof(counter));
  return launch(1, 1, kWarpSize, 0,
                [&](ThreadCtx& c) { grid_dep_body(c, kind, w.data(), x.data(), &counter, y.data()); });
}

const char* selftest_mma_host(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const MmaArgs a{A, B, C, D};
  return launch(1, 1, kWarpSize, 0, [&](ThreadCtx& c) { mma_body(c, a); });
}

const char* selftest_mma_device(const uint16_t* A, const uint16_t* B, const float* C, float* D, void* stream) {
  mma_kernel<<<1, kWarpSize, 0, static_cast<cudaStream_t>(stream)>>>(MmaArgs{A, B, C, D});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* selftest_wgmma_host(int kind, int n, const uint16_t* A, const uint16_t* B, float* D) {
  const WgArgs a{A, B, D, kind};
  const char* err = "wgmma self-test: n must be 8, 16, 32, 64 or 128";
  with_wg_n(n, [&](auto nn) {
    constexpr int N = decltype(nn)::value;
    err = launch(1, 1, 128, N * 32, [&](ThreadCtx& c) { wgmma_body<N>(c, a); });
  });
  return err;
}

const char* selftest_wgmma_device(int n, const uint16_t* A, const uint16_t* B, float* D, void* stream) {
  const WgArgs a{A, B, D, 0};
  bool ok = with_wg_n(n, [&](auto nn) {
    constexpr int N = decltype(nn)::value;
    wgmma_kernel<N><<<1, 128, N * 32, static_cast<cudaStream_t>(stream)>>>(a);
  });
  if (!ok) return "wgmma self-test: n must be 8, 16, 32, 64 or 128";
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* selftest_collectives_host(const uint32_t* src, int32_t* out) {
  const CollArgs a{src, out};
  return launch(1, 1, 64, (128 + 64 * 8) * sizeof(uint32_t), [&](ThreadCtx& c) { collectives_body(c, a); });
}

const char* selftest_error_host(int kind) {
  std::vector<uint32_t> src(4 * 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i);
  return launch(1, 1, 64, (64 + 4 * 64) * sizeof(uint32_t),
                [&](ThreadCtx& c) { error_body(c, kind, src.data()); });
}

bool set_cta_order(int order, uint64_t seed, int resident) {
  if (order < 0 || order > 2 || resident < 1) return false;
  cta_order().order = static_cast<CtaOrder>(order);
  cta_order().seed = seed;
  cta_order().resident = resident;
  return true;
}

}  // namespace emu
}  // namespace unweight
