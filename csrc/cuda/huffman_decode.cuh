// Huffman -> BF16 / exponent bytes and the Huffman row gather: the argument blocks and the
// per-thread bodies, run by the kernels of huffman_decode.cu (design notes there) and,
// serially on the host, by that file's emulation.
//
// Unit of work: a *chain* (FORMAT.md "Checkpoint index"), the weights of one segment from
// one checkpoint to the next: S weights (the last chain of a segment fewer), or the whole
// segment when the tensor has no index.  Chains start at a bit position the index gives, so
// they decode independently of each other; each one checks that it ends where the index says
// the next one starts (or, for a segment's last chain, that the segment's bits fill its
// bytes), which makes decoding by chains exactly equal to decoding each segment from its start.
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
  const uint16_t* chk;  // checkpoint index uint16 [n_seg, P], or null
  int64_t S, P;         // checkpoint interval (0 = no index) and entries per segment
};

// One chain of a decode: where its segment is, and which of the segment's weights it covers.
struct ChainJob {
  int64_t s;           // segment id, chunk-major over the whole matrix (FORMAT.md "The segment grid")
  int64_t lr, lk;      // the segment's first weight relative to the selection's origin (sm / out)
  int64_t w, n;        // the segment's width and weight count
  int64_t j;           // checkpoint the chain starts from (0: the segment's start)
  int64_t first, end;  // weights [first, end) of the segment, row-major
};

// Chain t of the selection [g0, g1) x [c0, c1): segment i = t / cps in group-fastest order,
// checkpoint j = t % cps.  False for a checkpoint past a short (partial) segment's end, which
// has no work: P is sized for the largest segment.
UW_HD bool chain_job(int64_t t, const HuffArgs& a, ChainJob* J) {
  int64_t i, g, c;
  plan::huffman_chain(t, plan::huffman_chains_per_segment(a.S, a.P), &i, &J->j);
  plan::huffman_unit(i, a.g0, a.c0, a.g1 - a.g0, &g, &c);
  J->s = c * cdiv(a.rows, a.R) + g;
  const int64_t r0 = g * a.R, k0 = c * a.C;
  J->w = std::min(a.cols, k0 + a.C) - k0;
  J->n = (std::min(a.rows, r0 + a.R) - r0) * J->w;
  J->lr = r0 - a.g0 * a.R;
  J->lk = k0 - a.c0 * a.C;
  J->first = a.S ? J->j * a.S : 0;
  J->end = a.S ? std::min(J->n, J->first + a.S) : J->n;
  return J->first < J->n;
}

// Bit, counted from the segment's first bit, at which checkpoint j starts: the sum of the
// segment's first j index entries (at most P of them, read once per chain).
UW_HD uint64_t checkpoint_bit(const uint16_t* chk, int64_t P, int64_t s, int64_t j) {
  uint64_t b = 0;
  for (int64_t m = 0; m < j; ++m) b += chk[s * P + m];
  return b;
}

// The end check of a chain that decoded weights up to `end` of a segment of n weights, from
// bit `start` of the segment, consuming `used` bits: exactly the next checkpoint when `end`
// is one, else (the segment's end) the bits must round up to the segment's byte length.
UW_HD bool chain_end_ok(const uint16_t* chk, int64_t P, int64_t S, int64_t s, int64_t end, int64_t n,
                        uint64_t start, uint64_t used, uint32_t seg_bytes) {
  if (end < n) return used == chk[s * P + end / S - 1];
  return (start + used + 7) / 8 == seg_bytes;
}

// ---------------------------------------------------------------------------------------
// Vector path: the stream in 16-byte blocks held in registers.
// ---------------------------------------------------------------------------------------
UW_HD uint32_t bswap32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, 0, 0x0123);
#else
  return __builtin_bswap32(x);
#endif
}

UW_HD void st_v4_bytes(uint8_t* p, const uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(v[0], v[1], v[2], v[3]);
#else
  std::memcpy(p, v, 16);
#endif
}

// The exponent stream as aligned 16-byte blocks: the block holding the read position (c0:c1)
// and the one after it (n0:n1), each as two 64-bit words whose most significant bit is the
// first stream bit (FORMAT.md: bits are read MSB first).  A 64-bit window at any position of
// the current block is then two shifts and a select, with no branch and no memory access;
// the only loads are whole 16-byte blocks in stream order, one per 128 bits consumed, whose
// addresses do not depend on the decode, so the load of the next block is issued a block
// ahead of its use.  Blocks at or past the end of the stream allocation are not loaded: their
// bytes read as zeros (a corrupt chain then fails its end check instead of faulting).
struct StreamBlocks {
  const uint8_t* base;
  int64_t nbytes;
  int64_t blk, blk0;
  uint32_t pos, pos0;  // bits consumed of block blk (< 128 between rounds)
  uint64_t c0, c1, n0, n1;

  UW_HD void load(int64_t b, uint64_t& hi, uint64_t& lo) const {
    const int64_t at = b * 16;
    uint32_t v[4];
    if (at + 16 <= nbytes) {
      ld_stream_v4(base + at, v);
    } else {
      uint8_t q[16];
      for (int i = 0; i < 16; ++i) q[i] = at + i < nbytes ? base[at + i] : static_cast<uint8_t>(0);
      std::memcpy(v, q, 16);
    }
    hi = (static_cast<uint64_t>(bswap32(v[0])) << 32) | bswap32(v[1]);
    lo = (static_cast<uint64_t>(bswap32(v[2])) << 32) | bswap32(v[3]);
  }
  UW_HD void init(const uint8_t* p, int64_t n, uint64_t bit) {
    base = p;
    nbytes = n;
    blk = blk0 = static_cast<int64_t>(bit >> 7);
    pos = pos0 = static_cast<uint32_t>(bit & 127);
    load(blk, c0, c1);
    load(blk + 1, n0, n1);
  }
  // The 64 stream bits from the read position on (pos < 128: they lie in c0..n0).  The
  // low word comes in shifted right by 64 - sh as (y >> 1) >> (63 - sh), which is 0, not
  // undefined, for sh = 0.
  UW_HD uint64_t window() const {
    const bool hi = pos >= 64;
    const uint32_t sh = pos & 63u;
    const uint64_t x = hi ? c1 : c0, y = hi ? n0 : c1;
    return (x << sh) | ((y >> 1) >> (63 - sh));
  }
  // A round consumes at most 4 * 12 = 48 bits, so one block step is always enough.
  UW_HD void advance(uint32_t bits) {
    pos += bits;
    if (pos >= 128) {
      pos -= 128;
      c0 = n0;
      c1 = n1;
      ++blk;
      load(blk + 1, n0, n1);
    }
  }
  UW_HD uint64_t consumed() const { return static_cast<uint64_t>(blk - blk0) * 128 + pos - pos0; }
};

// Weights per vector step: 32 sign+mantissa bytes (two 16-byte loads, one 32-byte sector)
// and 64 bytes of BF16 out (four 16-byte stores), assembled in registers.
constexpr int kChainStep = 32;
// Symbols decoded from one 64-bit window: 4 codes of at most 12 bits.
constexpr int kRound = 4;

// Decodes the chain's weights [first, end) (multiples of kChainStep inside rows that are
// multiples of kChainStep wide: the launcher's vector conditions) from stream bit `bit`.
// Per symbol: one shared-memory LUT load indexed by the context and the window's top 12 bits,
// a shift of the window by the code length; every 4 symbols a fresh window.  Sets *used to
// the bits consumed; false when a bit pattern is no code (a LUT entry of length 0).
template <bool kExp>
UW_HD bool decode_chain_vec(const HuffArgs& a, const ChainJob& J, uint64_t bit, const uint8_t* sm,
                            uint16_t* o16, uint8_t* o8, const uint16_t* lut, uint64_t* used) {
  StreamBlocks sb;
  sb.init(a.stream, a.stream_bytes, bit);
  int64_t r = J.first / J.w, c = J.first % J.w;
  uint32_t minlen = 15;
  for (int64_t i = J.first; i < J.end; i += kChainStep) {
    uint32_t s_lo[4], s_hi[4];  // the step's 32 sign+mantissa bytes: one full 32-byte sector
    const uint8_t* sp = sm + r * a.sm_stride + c;
    ld_stream_v4(sp, s_lo);
    ld_stream_v4(sp + 16, s_hi);
    uint32_t ow[kExp ? 8 : 16];
UW_UNROLL()
    for (int q = 0; q < (kExp ? 8 : 16); ++q) ow[q] = 0;
UW_UNROLL()
    for (int q = 0; q < kChainStep / kRound; ++q) {
      const uint32_t sw = q < 4 ? s_lo[q & 3] : s_hi[q & 3];  // round q's 4 weights: sm word q
      uint64_t win = sb.window();
      uint32_t round_bits = 0;
UW_UNROLL()
      for (int k = 0; k < kRound; ++k) {
        const int idx = q * kRound + k;
        const uint32_t sb8 = (sw >> (8 * k)) & 0xFFu;
        const uint32_t e = lut[(ctx_of(static_cast<uint8_t>(sb8)) << HUFF_MAX_CODE_LEN) |
                               static_cast<uint32_t>(win >> (64 - HUFF_MAX_CODE_LEN))];
        const uint32_t len = e & 0xFu;
        win <<= len;
        round_bits += len;
        minlen = len < minlen ? len : minlen;
        if (kExp)
          ow[idx >> 2] |= (e >> 4) << (8 * (idx & 3));
        else  // entry [15:4] symbol, [3:0] length: (e << 3) & 0x7F80 is the symbol at bits 14..7
          ow[idx >> 1] |= (((sb8 & 0x80u) << 8) | ((e << 3) & 0x7F80u) | (sb8 & 0x7Fu)) << (16 * (idx & 1));
      }
      sb.advance(round_bits);
    }
    if (kExp) {
      uint8_t* op = o8 + r * a.out_stride + c;
      st_v4_bytes(op, {ow[0], ow[1], ow[2], ow[3]});
      st_v4_bytes(op + 16, {ow[4], ow[5], ow[6], ow[7]});
    } else {
      uint16_t* op = o16 + r * a.out_stride + c;
UW_UNROLL()
      for (int v = 0; v < 4; ++v) st_v4(op + 8 * v, {ow[4 * v], ow[4 * v + 1], ow[4 * v + 2], ow[4 * v + 3]});
    }
    c += kChainStep;
    if (c == J.w) {
      c = 0;
      ++r;
    }
  }
  *used = sb.consumed();
  return minlen > 0;
}

// Decodes chain t of the selection; false when it is corrupt (offsets out of range, a
// checkpoint outside its segment, an invalid code, or a chain that does not end where the
// index or the segment's byte length says).  kVec: the launcher proved the vector conditions
// (huffman_decode.cu, vec_ok).  Writes only inside its own chain's weights of the output.
template <bool kExp, bool kVec>
UW_HD bool huff_chain_body(int64_t t, const HuffArgs& a, const uint16_t* lut) {
  ChainJob J;
  if (!chain_job(t, a, &J)) return true;
  const uint32_t b0 = a.off[J.s], b1 = a.off[J.s + 1];
  // Offsets are checked per chain (not in a host pre-pass as on the CPU) so a corrupt table
  // never makes a thread read outside the stream allocation.
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const uint64_t start = a.S ? checkpoint_bit(a.chk, a.P, J.s, J.j) : 0;
  if (start >= static_cast<uint64_t>(b1 - b0) * 8) return false;  // every weight has >= 1 bit
  const uint64_t bit = static_cast<uint64_t>(b0) * 8 + start;
  const uint8_t* sm = a.sm + J.lr * a.sm_stride + J.lk;
  uint16_t* o16 = kExp ? nullptr : a.out16 + J.lr * a.out_stride + J.lk;
  uint8_t* o8 = kExp ? a.out8 + J.lr * a.out_stride + J.lk : nullptr;
  uint64_t used;
  bool ok;
  if (kVec) {
    ok = decode_chain_vec<kExp>(a, J, bit, sm, o16, o8, lut, &used);
  } else {
    BitReader br;
    init_bounded_at(br, a.stream, bit, a.stream + a.stream_bytes);
    ok = decode_run_bounded<kExp>(br, a.stream + a.stream_bytes, lut, sm, a.sm_stride, o16, o8, a.out_stride,
                                  J.w, J.first, J.end, J.first, J.end);
    used = br.consumed(a.stream + (bit >> 3)) - (bit & 7);
  }
  return ok && chain_end_ok(a.chk, a.P, a.S, J.s, J.end, J.n, start, used, b1 - b0);
}

// ---------------------------------------------------------------------------------------
// Row gather (embeddings): out[i] = row ids[i] of the matrix, decoding only the chains that
// hold the row's weights in each column chunk.
// ---------------------------------------------------------------------------------------
struct HGatherArgs {
  const int64_t* ids;
  int64_t n_ids;
  const uint8_t* stream;
  int64_t stream_bytes;
  const uint32_t* off;
  int64_t rows, cols, R, C;
  const uint8_t* sm;  // the full plane [rows, cols]
  const uint16_t* chk;
  int64_t S, P;
  uint16_t* out;  // [n_ids, cols], row stride out_stride
  int64_t out_stride;
};

// Unit t = (id i, chunk c, part u): part u decodes the u-th chain touching row ids[i] in chunk
// c, from its checkpoint to the end of the chain or of the row, and writes the row's weights
// among them.  Without an index the only part decodes the segment from its start to the end
// of the row.  An id outside [0, rows) gives a zero row and one error (from its unit 0, 0).
UW_HD bool hgather_body(int64_t t, const HGatherArgs& a, const uint16_t* lut) {
  const int64_t nc = cdiv(a.cols, a.C);
  const int64_t units = plan::hgather_units(a.S, a.P, std::min(a.C, a.cols));
  int64_t id, c, u;
  plan::hgather_unit(t, nc, units, &id, &c, &u);
  const int64_t r = a.ids[id];
  const int64_t k0 = c * a.C, w = std::min(a.cols, k0 + a.C) - k0;
  uint16_t* o = a.out + id * a.out_stride + k0;
  if (r < 0 || r >= a.rows) {
    if (u == 0)
      for (int64_t k = 0; k < w; ++k) o[k] = 0;
    return !(u == 0 && c == 0);
  }
  const int64_t g = r / a.R, r0 = g * a.R;
  const int64_t s = c * cdiv(a.rows, a.R) + g;
  const int64_t n = (std::min(a.rows, r0 + a.R) - r0) * w;
  const int64_t rs = (r - r0) * w, re = rs + w;  // the row's weights in the segment
  int64_t j = 0, first = 0, end = re;
  if (a.S) {
    j = rs / a.S + u;
    first = j * a.S;
    if (first >= re) return true;
    end = std::min(re, first + a.S);
  } else if (u) {
    return true;
  }
  const uint32_t b0 = a.off[s], b1 = a.off[s + 1];
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > a.stream_bytes) return false;
  const uint64_t start = a.S ? checkpoint_bit(a.chk, a.P, s, j) : 0;
  if (start >= static_cast<uint64_t>(b1 - b0) * 8) return false;
  const uint64_t bit = static_cast<uint64_t>(b0) * 8 + start;
  BitReader br;
  init_bounded_at(br, a.stream, bit, a.stream + a.stream_bytes);
  // Output row stride 0: only the weights of one segment row (the id's) are written, and they
  // land at o[column in the chunk].
  if (!decode_run_bounded<false>(br, a.stream + a.stream_bytes, lut, a.sm + r0 * a.cols + k0, a.cols, o, nullptr, 0,
                                 w, first, end, rs, re))
    return false;
  // A part that decoded its whole chain checks where it ended; one stopped by the row's end
  // cannot (the next checkpoint lies further on).
  const int64_t chain_end = a.S ? std::min(n, first + a.S) : n;
  if (end != chain_end) return true;
  const uint64_t used = br.consumed(a.stream + (bit >> 3)) - (bit & 7);
  return chain_end_ok(a.chk, a.P, a.S, s, end, n, start, used, b1 - b0);
}

// ---------------------------------------------------------------------------------------
// Launchers (huffman_decode.cu): the launch alone; the host API beside them checks the
// arguments and sizes the grid first.
// ---------------------------------------------------------------------------------------
void launch_build_lut(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
