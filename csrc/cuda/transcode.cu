// Huffman -> palette transcode kernels: each runs its body from transcode.cuh (the design
// notes are there) over the device thread context.
#include "transcode.cuh"

namespace unweight {
namespace cuda {
namespace detail {
namespace {

__global__ void __launch_bounds__(plan::HIST_THREADS) exp_hist_kernel(const uint8_t* __restrict__ e, int64_t n,
                                                                      unsigned long long* hist) {
  emu::DeviceCtx c;
  hist_body(c, e, n, hist);
}

__global__ void __launch_bounds__(plan::ENC_THREADS) palette_encode_kernel(EncArgs a, Palette pal) {
  emu::DeviceCtx c;
  enc_body(c, a, pal);
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
row_count_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr, uint32_t* counts) {
  emu::DeviceCtx c;
  row_count_body(c, flags, rows, bpr, counts);
}

__global__ void __launch_bounds__(plan::SCAN_THREADS)
scan_kernel(const uint32_t* __restrict__ counts, int64_t rows, uint32_t* offsets) {
  emu::DeviceCtx c;
  scan_body(c, counts, rows, offsets);
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
compact_kernel(const uint8_t* __restrict__ flags, int64_t rows, int64_t bpr,
               const uint32_t* __restrict__ offsets, uint32_t* vpos) {
  emu::DeviceCtx c;
  compact_body(c, flags, rows, bpr, offsets, vpos);
}

__global__ void __launch_bounds__(plan::WARP_KERNEL_THREADS)
gather_vexp_kernel(const uint8_t* __restrict__ exps, int64_t cols, const uint32_t* __restrict__ vpos,
                   int64_t nv, uint8_t* vexp) {
  emu::DeviceCtx c;
  gather_vexp_body(c, exps, cols, vpos, nv, vexp);
}

}  // namespace

void launch_exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, cudaStream_t s) {
  exp_hist_kernel<<<static_cast<unsigned>(plan::hist_grid(n)), plan::HIST_THREADS, kHistSmemBytes, s>>>(exps, n,
                                                                                                        hist);
}

void launch_palette_encode_pass1(const EncArgs& a, Palette pal, uint32_t* row_counts, uint32_t* row_offsets,
                                 cudaStream_t s) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  palette_encode_kernel<<<static_cast<unsigned>(plan::enc_grid(a.rows, a.cols)), plan::ENC_THREADS, kEncSmemBytes,
                          s>>>(a, pal);
  row_count_kernel<<<static_cast<unsigned>(plan::warp_grid(a.rows)), plan::WARP_KERNEL_THREADS, 0, s>>>(
      a.flags, a.rows, bpr, row_counts);
  scan_kernel<<<1, plan::SCAN_THREADS, kScanSmemBytes, s>>>(row_counts, a.rows, row_offsets);
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
