// Huffman -> palette transcode: the argument block and the per-thread / per-lane bodies of
// the encode passes, run by the kernels of transcode.cu (design notes there) and, serially
// on the host, by emulate.cu.
#pragma once
#include "device_util.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct EncArgs {
  const uint8_t* exps;
  int64_t rows, cols;
  uint8_t* idx;
  uint8_t* flags;
};

// pmap value of an exponent outside the palette.
constexpr uint8_t kMiss = 0x10;

// One thread per (row, PAL_BLOCK-weight block): the verbatim decision is per block, so a thread that
// owns the whole block decides it with no inter-thread traffic.  Writes the block's index
// bytes (all 0 for a verbatim block, as the format requires) and its flag.
UW_HD void enc_block_body(int64_t t, const EncArgs& a, const uint8_t* pmap) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const int64_t r = t / bpr, b = t % bpr;
  const int64_t k0 = b * PAL_BLOCK, n = std::min<int64_t>(PAL_BLOCK, a.cols - k0);
  const uint8_t* er = a.exps + r * a.cols + k0;
  uint8_t* ir = a.idx + r * ((a.cols + 1) / 2) + k0 / 2;
  uint32_t miss = 0;
  for (int64_t c = 0; c < n; ++c) miss |= pmap[er[c]];
  miss &= kMiss;
  for (int64_t c = 0; c < n; c += 2) {
    const uint32_t lo = pmap[er[c]] & 0xFu;
    const uint32_t hi = c + 1 < n ? (pmap[er[c + 1]] & 0xFu) : 0u;
    ir[c / 2] = miss ? 0 : static_cast<uint8_t>(lo | (hi << 4));
  }
  a.flags[t] = miss ? 1 : 0;
}

// Lane `lane` of the warp for verbatim entry v copies exponents lane, lane+32, ... of the block
// (0 past the end of the row, as the CPU encoder pads).
UW_HD void gather_lane_body(int64_t v, int lane, const uint8_t* exps, int64_t cols,
                            const uint32_t* vpos, uint8_t* vexp) {
  const int64_t bpr = plan::blocks_per_row(cols);
  const int64_t r = vpos[v] / bpr, b = vpos[v] % bpr;
  for (int64_t jb = lane; jb < PAL_BLOCK; jb += plan::WARP) {  // lane-strided: coalesced
    const int64_t c = b * PAL_BLOCK + jb;
    vexp[v * PAL_BLOCK + jb] = c < cols ? exps[r * cols + c] : 0;
  }
}

// ---------------------------------------------------------------------------------------
// Launchers (transcode.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
void launch_exp_histogram(const uint8_t* exps, int64_t n, unsigned long long* hist, cudaStream_t s);
// Nibbles + flags, per-row verbatim counts, exclusive scan: three launches in stream order.
void launch_palette_encode_pass1(const EncArgs& a, Palette pal, uint32_t* row_counts, uint32_t* row_offsets,
                                 cudaStream_t s);
// Ordered compaction of the flags into vpos, then the verbatim exponents (nv > 0).
void launch_palette_encode_pass2(const uint8_t* exps, int64_t rows, int64_t cols, const uint8_t* flags,
                                 const uint32_t* row_offsets, int64_t nv, uint32_t* vpos, uint8_t* vexp,
                                 cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
