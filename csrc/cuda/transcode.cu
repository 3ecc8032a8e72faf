// =======================================================================================
// Huffman -> palette transcode (from the exponent plane the Huffman kernel wrote with
// kExp = true): histogram -> (host picks the palette) -> nibbles + verbatim flags ->
// per-row counts -> exclusive scan -> ordered compaction -> verbatim exponents.  The
// count/scan/compaction (rather than an atomic append + sort) makes vpos come out ascending
// and bit-identical to the CPU encoder with no sort and no nondeterminism.
// =======================================================================================
#include "transcode.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

__global__ void __launch_bounds__(plan::HIST_THREADS) exp_hist_kernel(const uint8_t* __restrict__ e,
                                                                      int64_t n,
                                                                      unsigned long long* hist) {
  // One 256-bin sub-histogram per warp: exponents concentrate on ~10 bins, so a single
  // per-CTA histogram would serialize all 8 warps on the same few shared atomics.
  __shared__ uint32_t h[plan::HIST_THREADS / plan::WARP][256];
  for (int j = threadIdx.x; j < (plan::HIST_THREADS / plan::WARP) * 256; j += plan::HIST_THREADS)
    (&h[0][0])[j] = 0;
  __syncthreads();
  uint32_t* mine = h[threadIdx.x / plan::WARP];
  const int64_t nvec = n / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * plan::HIST_THREADS;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * plan::HIST_THREADS + threadIdx.x; v < nvec;
       v += stride) {
    uint32_t q[4];
    ld_stream_v4(e + 16 * v, q);
UW_UNROLL()
    for (int j = 0; j < 16; ++j) atomicAdd(&mine[(q[j / 4] >> (8 * (j % 4))) & 0xFFu], 1u);
  }
  if (blockIdx.x == 0)
    for (int64_t j = nvec * 16 + threadIdx.x; j < n; j += plan::HIST_THREADS) atomicAdd(&mine[e[j]], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += plan::HIST_THREADS) {
    unsigned long long s = 0;
    for (int w = 0; w < plan::HIST_THREADS / plan::WARP; ++w) s += h[w][b];
    if (s) atomicAdd(&hist[b], s);
  }
}

static_assert(plan::ENC_THREADS == 256, "palette_encode_kernel fills its 256-entry map one per thread");

__global__ void __launch_bounds__(plan::ENC_THREADS) palette_encode_kernel(EncArgs a, Palette pal) {
  // Exponent -> nibble map (kMiss when absent), rebuilt per CTA from the 16 register-resident
  // palette entries: 256 bytes of shared memory, cheaper than passing a device table.
  __shared__ uint8_t pmap[256];
  pmap[threadIdx.x] = kMiss;
  __syncthreads();
  if (threadIdx.x < static_cast<unsigned>(pal.size))
    pmap[pal_exp(pal, threadIdx.x)] = static_cast<uint8_t>(threadIdx.x);
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * plan::ENC_THREADS + threadIdx.x;
  if (t >= a.rows * plan::blocks_per_row(a.cols)) return;
  enc_block_body(t, a, pmap);
}

// Warp per row: verbatim blocks of the row.
__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
row_count_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr, uint32_t* counts) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (r >= rows) return;
  const int lane = threadIdx.x % plan::WARP;
  uint32_t s = 0;
  for (int64_t b = lane; b < bpr; b += plan::WARP) s += flags[r * bpr + b];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  if (lane == 0) counts[r] = s;
}

// Single CTA: exclusive scan of counts[rows] into offsets[rows+1].  Each thread owns a
// contiguous run of rows (serial sums), then a Hillis-Steele scan over the 1024 run totals.
// rows is at most a few hundred thousand, so one CTA is far below a microsecond per 1K rows.
__global__ void __launch_bounds__(plan::SCAN_THREADS)
scan_kernel(const uint32_t* __restrict__ counts, int64_t rows, uint32_t* offsets) {
  __shared__ uint32_t s[plan::SCAN_THREADS];
  const int tid = threadIdx.x;
  const int64_t chunk = cdiv(rows, plan::SCAN_THREADS);
  const int64_t t0 = std::min(rows, tid * chunk), t1 = std::min(rows, t0 + chunk);
  uint32_t local = 0;
  for (int64_t r = t0; r < t1; ++r) local += counts[r];
  s[tid] = local;
  __syncthreads();
  for (int off = 1; off < plan::SCAN_THREADS; off <<= 1) {
    const uint32_t v = tid >= off ? s[tid - off] : 0u;
    __syncthreads();
    s[tid] += v;
    __syncthreads();
  }
  uint32_t run = s[tid] - local;
  for (int64_t r = t0; r < t1; ++r) {
    offsets[r] = run;
    run += counts[r];
  }
  if (tid == plan::SCAN_THREADS - 1) offsets[rows] = s[tid];
}

// Warp per row: ballot over 32 blocks at a time, each flagged lane writes its id at
// base + (flagged lanes below it), so ids land in ascending order.
__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
compact_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr,
               const uint32_t* __restrict__ offsets, uint32_t* vpos) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (r >= rows) return;  // uniform per warp, so the full-mask ballot below is legal
  const int lane = threadIdx.x % plan::WARP;
  uint32_t base = offsets[r];
  for (int64_t b0 = 0; b0 < bpr; b0 += plan::WARP) {
    const int64_t b = b0 + lane;
    const bool f = b < bpr && flags[r * bpr + b];
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, f);
    if (f) vpos[base + __popc(ballot & ((1u << lane) - 1u))] = static_cast<uint32_t>(r * bpr + b);
    base += __popc(ballot);
  }
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
gather_vexp_kernel(const uint8_t* __restrict__ exps, int64_t cols, const uint32_t* __restrict__ vpos,
                   int64_t nv, uint8_t* vexp) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * plan::WARPS_PER_CTA + threadIdx.x / plan::WARP;
  if (v >= nv) return;
  gather_lane_body(v, threadIdx.x % plan::WARP, exps, cols, vpos, vexp);
}

}  // namespace

void launch_exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, cudaStream_t s) {
  exp_hist_kernel<<<static_cast<unsigned>(plan::hist_grid(n)), plan::HIST_THREADS, 0, s>>>(exps, n, hist);
}

void launch_palette_encode_pass1(const EncArgs& a, Palette pal, uint32_t* row_counts, uint32_t* row_offsets,
                                 cudaStream_t s) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  palette_encode_kernel<<<static_cast<unsigned>(plan::enc_grid(a.rows, a.cols)), plan::ENC_THREADS, 0, s>>>(a, pal);
  row_count_kernel<<<static_cast<unsigned>(plan::warp_grid(a.rows)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      a.flags, a.rows, bpr, row_counts);
  scan_kernel<<<1, plan::SCAN_THREADS, 0, s>>>(row_counts, a.rows, row_offsets);
}

void launch_palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                                 const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp,
                                 cudaStream_t s) {
  const int64_t bpr = plan::blocks_per_row(cols);
  compact_kernel<<<static_cast<unsigned>(plan::warp_grid(rows)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      flags, rows, bpr, row_offsets, vpos);
  gather_vexp_kernel<<<static_cast<unsigned>(plan::warp_grid(nv)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      exps, cols, vpos, nv, vexp);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
