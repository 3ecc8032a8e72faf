// Huffman -> BF16 / exponent bytes: the argument block and the per-thread segment body, run
// by the kernel of huffman_decode.cu (design notes there) and, serially on the host, by
// emulate.cu.
#pragma once
#include "device_util.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct HuffArgs {
  const uint8_t* stream;
  int64_t stream_bytes;
  const uint32_t* off;
  int64_t rows, cols, R, C, g0, g1, c0, c1;
  const uint8_t* sm;
  int64_t sm_stride;
  uint16_t* out16;
  uint8_t* out8;
  int64_t out_stride;
};

// Decodes the i-th selected segment; false when it is corrupt (bad offsets, invalid code,
// or a consumed bit count that does not round up to the segment's byte length).
template <bool kExp>
UW_HD bool huff_segment_body(int64_t i, const HuffArgs& a, const uint16_t* lut) {
  const int64_t ng = cdiv(a.rows, a.R);
  int64_t g, c;
  plan::huffman_unit(i, a.g0, a.c0, a.g1 - a.g0, &g, &c);
  const int64_t s = c * ng + g;
  const uint32_t b0 = a.off[s], b1 = a.off[s + 1];
  // Offsets are checked per segment (not in a host pre-pass as on the CPU) so a corrupt
  // table never makes a thread read outside the stream allocation.
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const int64_t r0 = g * a.R, r1 = std::min(a.rows, r0 + a.R);
  const int64_t k0 = c * a.C, k1 = std::min(a.cols, k0 + a.C);
  const int64_t lr = r0 - a.g0 * a.R, lk = k0 - a.c0 * a.C;
  const int64_t o = lr * a.out_stride + lk;
  const uint64_t used = decode_segment_bounded<kExp>(
      a.stream + b0, a.stream + a.stream_bytes, lut, a.sm + lr * a.sm_stride + lk, a.sm_stride,
      kExp ? nullptr : a.out16 + o, kExp ? a.out8 + o : nullptr, a.out_stride,
      static_cast<int>(r1 - r0), static_cast<int>(k1 - k0));
  return used != ~static_cast<uint64_t>(0) && (used + 7) / 8 == static_cast<uint64_t>(b1 - b0);
}

// ---------------------------------------------------------------------------------------
// Launchers (huffman_decode.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
void launch_build_lut(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err, cudaStream_t s);
// The exponent-only kernel when a.out8 is set, else the BF16 one.
void launch_huffman_decode(const HuffArgs& a, int64_t grid, const uint16_t* lut, int32_t* err, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
