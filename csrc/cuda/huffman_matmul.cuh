// Fused Huffman GEMV/GEMM: the argument block and the per-thread bodies (x staging, segment
// decode + FMA, chunk reduction), run by the kernels of huffman_matmul.cu (design notes
// there) and, serially on the host, by emulate.cu.
#pragma once
#include "device_util.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct HGemmArgs {
  const uint16_t* x;
  int64_t ldx;
  int M;
  const uint8_t* sm;
  const uint8_t* stream;
  int64_t stream_bytes;
  const uint32_t* off;
  int64_t N, K, R, C;
  float* part;
  uint16_t* y;
  int64_t ldy;
};

UW_HD int64_t hgemm_chunk_width(int64_t c, const HGemmArgs& a) {
  return std::min(a.K, (c + 1) * a.C) - c * a.C;
}

// Staging element e (< width * MT) of chunk c: (m = e / width, col = e % width), so
// consecutive threads read consecutive columns of one x row (coalesced global loads); the
// transposed shared stores conflict on banks, but they are a one-off per CTA.
template <int MT>
UW_HD void hgemm_stage_x(int64_t e, int64_t c, const HGemmArgs& a, uint16_t* xs) {
  const int64_t w = hgemm_chunk_width(c, a);
  const int64_t m = e / w, col = e % w;
  xs[col * MT + m] = m < a.M ? a.x[m * a.ldx + c * a.C + col] : static_cast<uint16_t>(0);
}

// The MT staged batch values of column `col` as fp32 (bf16 bits in the top half).
template <int MT>
UW_HD void hgemm_load_x(const uint16_t* xs, int col, float (&xf)[MT]) {
  const uint16_t* p = xs + static_cast<int64_t>(col) * MT;
  if constexpr (MT == 1) {
    xf[0] = f32_from_bits(static_cast<uint32_t>(p[0]) << 16);
  } else {
    uint32_t v[MT / 2];
#if defined(__CUDA_ARCH__)
    // Widest shared load the tile allows (column stride MT * 2 bytes keeps it aligned).
    if constexpr (MT >= 8) {
UW_UNROLL()
      for (int q = 0; q < MT / 8; ++q) {
        const uint4 t = reinterpret_cast<const uint4*>(p)[q];
        v[4 * q] = t.x; v[4 * q + 1] = t.y; v[4 * q + 2] = t.z; v[4 * q + 3] = t.w;
      }
    } else if constexpr (MT == 4) {
      const uint2 t = *reinterpret_cast<const uint2*>(p);
      v[0] = t.x; v[1] = t.y;
    } else {
      v[0] = *reinterpret_cast<const uint32_t*>(p);
    }
#else
    std::memcpy(v, p, MT * 2);
#endif
UW_UNROLL()
    for (int q = 0; q < MT / 2; ++q) {
      xf[2 * q] = f32_from_bits(v[q] << 16);  // little-endian: even row in the low half
      xf[2 * q + 1] = f32_from_bits(v[q] & 0xFFFF0000u);
    }
  }
}

// 16 sign+mantissa bytes of one row (kVec path): read-only, L1-allocating (see
// huffman_matmul.cu, "Loads").
UW_HD void ld_rowbytes_v4(const uint8_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
      : "l"(p));
#else
  std::memcpy(v, p, 16);
#endif
}

// One thread's segment (row group g, chunk c): decode every weight, multiply with the staged
// x column, write the rows' partial sums.  False when the segment is corrupt (bad offsets,
// invalid code, or consumed bits that do not round up to its byte length).
template <int MT, bool kVec>
UW_HD bool hgemm_segment_body(int64_t g, int64_t c, const HGemmArgs& a, const uint16_t* lut,
                              const uint16_t* xs) {
  const int64_t ng = cdiv(a.N, a.R);
  const int64_t s = c * ng + g;
  const uint32_t b0 = a.off[s], b1 = a.off[s + 1];
  // Checked per segment so a corrupt offset table never sends a thread outside the stream.
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const int64_t r0 = g * a.R, r1 = std::min(a.N, r0 + a.R);
  const int64_t k0 = c * a.C;
  const int w = static_cast<int>(hgemm_chunk_width(c, a));
  const uint8_t* seg = a.stream + b0;
  const uint8_t* limit = a.stream + a.stream_bytes;
  BitReader br;
  init_bounded(br, seg, limit);
  uint32_t bad = 0;
  constexpr int kV = kVec ? 16 : 1;  // weights per sign+mantissa load
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* smr = a.sm + r * a.K + k0;
    float acc[MT];
UW_UNROLL()
    for (int m = 0; m < MT; ++m) acc[m] = 0.f;
    for (int col0 = 0; col0 < w; col0 += kV) {
      uint32_t sv[4] = {0u, 0u, 0u, 0u};
      if (kVec) ld_rowbytes_v4(smr + col0, sv); else sv[0] = smr[col0];
UW_UNROLL()
      for (int j = 0; j < kV; ++j) {
        // The bounded refill tops the window up to >= 57 bits; one symbol takes <= 12.
        if (br.nbits < HUFF_MAX_CODE_LEN) refill_bounded(br, limit);
        const uint8_t sb = static_cast<uint8_t>(sv[j / 4] >> (8 * (j % 4)));
        const uint16_t e = lut[(ctx_of(sb) << HUFF_MAX_CODE_LEN) | br.peek()];
        bad |= (e == 0);
        br.consume(lut_len(e));
        const float wf = f32_from_bits(f32_bits_from_parts(sb, lut_sym(e)));
        float xf[MT];
        hgemm_load_x<MT>(xs, col0 + j, xf);
UW_UNROLL()
        for (int m = 0; m < MT; ++m) acc[m] = fmaf(wf, xf[m], acc[m]);
      }
    }
    // Once per W row: MT scattered 4-byte stores, nothing next to the row's w weights.
UW_UNROLL()
    for (int m = 0; m < MT; ++m)
      if (m < a.M) a.part[(c * a.M + m) * a.N + r] = acc[m];
  }
  const uint64_t used = br.consumed(seg);
  return bad == 0 && (used + 7) / 8 == static_cast<uint64_t>(b1 - b0);
}

// Output t = m * N + n: the chunks' partial sums in ascending chunk order, one rounding.
UW_HD void hgemm_reduce_body(int64_t t, const HGemmArgs& a) {
  const int64_t m = t / a.N, n = t % a.N;
  const int64_t nc = cdiv(a.K, a.C);
  float acc = 0.f;
  for (int64_t c = 0; c < nc; ++c) acc += a.part[(c * a.M + m) * a.N + n];
  a.y[m * a.ldy + n] = bf16_round_bits(bits_from_f32(acc));
}

// ---------------------------------------------------------------------------------------
// Launchers (huffman_matmul.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
// Opts the kernel in to its dynamic shared memory, then launches it and the chunk reduction;
// nullptr or an error string.  Instantiated for the batch tiles MT in {1, 2, 4, 8, 16}
// (plan::hgemm_mtile) and both kVec.
template <int MT, bool kVec>
const char* launch_huffman_gemm(const HGemmArgs& a, const uint16_t* lut, int32_t* err, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
