// CRC-32 of byte ranges on the device: the load-time check that the weights a GPU holds
// decode to the bits the checkpoint's crc32 vouches for (runtime/verify.py), without a host
// decode.  zlib's CRC is a serial recurrence; it is cut into independent pieces through its
// linearity (../decode_primitives.h, "CRC-32"): the raw state of a range is the xor of its
// pieces' raw states, each moved on to the range's end, and zlib's crc32 is that xor with the
// crc32 of as many zero bytes.
//
// A warp takes a piece of CRC_STEPS 512-byte strides.  Lane i reads the 16-byte word i of each
// stride (one coalesced 512-byte load per step, read once: no L1 allocation), so its raw state
// covers its own words with every other byte taken as zero.  One step moves that state over its
// word and the 496 other lanes' bytes that follow it: 16 lookups of tables U[k][b] = (byte b
// at position k of a word) moved on 511 - k bytes, the state folded into the word's first four
// bytes as in any table-driven CRC.  At the piece's end each lane moves its state to the
// range's end (a shift of -511 bytes or more: back over the zeros its last step took past
// the range, or on over the pieces after it), the warp xors its lanes, and lane 0 xors the
// result into the range's checksum (an atomic: pieces end in any order).  Words need not lie
// inside the range: bytes outside it are masked to zero, which a zero-start raw state ignores,
// so ranges of any length and alignment take aligned 16-byte loads.
//
// The body is written once over the thread context of emu/ctx.cuh: crc32.cu runs it as the
// kernel and emulate.cu through the warp emulator.
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct Crc32Args {
  const uint8_t* p;         // first byte of range 0; range r starts at p + r * bytes
  int64_t bytes;            // bytes per range
  int64_t ranges;
  int64_t pieces;           // per range (plan::crc_pieces)
  const uint32_t* table;    // uint32 [16][256]: U (crc32_stride_table), in global memory
  uint32_t* out;            // uint32 [ranges], zero before the launch: each range's crc32
  uint32_t zeros_crc;       // crc32 of `bytes` zero bytes
  uint32_t pow[plan::CRC_POW_TERMS];
  uint32_t inv[plan::CRC_INV_TERMS];
};

// U[k][b]: byte b at position k of a 16-byte word, moved on over the word's other 15 - k bytes
// and the 496 bytes of the stride after it (host; the launch copies it to the device).
inline void crc32_stride_table(uint32_t* u) {
  for (int k = 0; k < 16; ++k) {
    const int64_t n = plan::CRC_STRIDE_BYTES - 1 - k;
    uint32_t pow[plan::CRC_POW_TERMS];
    for (int j = 0; j < plan::CRC_POW_TERMS; ++j) pow[j] = crc32_pow8(j);
    const uint32_t m = crc32_shift(CRC32_ONE, n, pow, nullptr);
    for (int b = 0; b < 256; ++b) u[k * 256 + b] = crc32_multmod(crc32_byte_state(static_cast<uint32_t>(b)), m);
  }
}

// One step: the raw state s before the word (v: its 16 bytes, little-endian words) to the
// state one stride later, through the shared tables u.
template <class Ctx>
UW_HD uint32_t crc32_stride_step(Ctx& c, const uint32_t* u, uint32_t s, const uint32_t (&v)[4]) {
  uint32_t r = 0;
  UW_UNROLL()
  for (int j = 0; j < 4; ++j) {
    const uint32_t w = j == 0 ? v[0] ^ s : v[j];
    UW_UNROLL()
    for (int b = 0; b < 4; ++b) r ^= c.lds(u + (4 * j + b) * 256 + ((w >> (8 * b)) & 0xFFu));
  }
  return r;
}

// The word at address w with its bytes outside [s, e) set to zero (a range's first and last).
UW_HD void crc32_mask_word(uint32_t (&v)[4], uintptr_t w, uintptr_t s, uintptr_t e) {
  for (int i = 0; i < 16; ++i)
    if (w + i < s || w + i >= e) v[i / 4] &= ~(0xFFu << (8 * (i % 4)));
}

template <class Ctx>
UW_HD void crc32_body(Ctx& c, const Crc32Args& a) {
  uint32_t* u = reinterpret_cast<uint32_t*>(c.smem());
  for (int i = c.tid(); i < plan::CRC_TABLE_WORDS / 4; i += plan::CRC_THREADS) {
    uint32_t v[4];
    ld_stream_v4(reinterpret_cast<const uint8_t*>(a.table + 4 * i), v);
    c.sts(reinterpret_cast<uint4*>(u) + i, make_uint4(v[0], v[1], v[2], v[3]));  // one 16-byte store: no conflicts
  }
  c.syncthreads();
  constexpr int kWarps = plan::CRC_THREADS / 32;
  const int lane = c.lane();
  const uintptr_t base = reinterpret_cast<uintptr_t>(a.p);
  const int64_t total = a.ranges * a.pieces;
  for (int64_t g = c.block_x() * kWarps + c.warp(); g < total; g += c.grid_x() * kWarps) {
    const int64_t r = g / a.pieces, j = g % a.pieces;
    const uintptr_t s = base + static_cast<uintptr_t>(r * a.bytes), e = s + static_cast<uintptr_t>(a.bytes);
    const uintptr_t w0 = (s & ~uintptr_t{15}) + static_cast<uintptr_t>(j * plan::CRC_PIECE_BYTES) + 16u * lane;
    uint32_t st = 0;
    int steps = 0;
    for (int k = 0; k < plan::CRC_STEPS; ++k) {
      const uintptr_t w = w0 + static_cast<uintptr_t>(k * plan::CRC_STRIDE_BYTES);
      if (w >= e) break;
      uint32_t v[4];
      ld_stream_v4(reinterpret_cast<const uint8_t*>(w), v);
      if (w < s || w + 16 > e) crc32_mask_word(v, w, s, e);
      st = crc32_stride_step(c, u, st, v);
      steps = k + 1;
    }
    // The state stands one stride past the lane's last word: move it to the range's end.
    uint32_t part = steps == 0 ? 0u
        : crc32_shift(st, static_cast<int64_t>(e) - static_cast<int64_t>(w0) - steps * plan::CRC_STRIDE_BYTES,
                      a.pow, a.inv);
    for (int o = 16; o > 0; o >>= 1) part ^= c.shfl_xor(part, o);
    if (lane == 0) {
      if (j == 0) part ^= a.zeros_crc;
      if (part != 0) c.atomic_xor(a.out + r, part);
    }
  }
}

// The arguments for `ranges` ranges of `bytes` bytes from p, or the error (launch.cu).
const char* crc32_plan(const uint8_t* p, int64_t bytes, int64_t ranges, const uint32_t* table, uint32_t* out,
                       Crc32Args* a);

// The launch alone (crc32.cu), after crc32_plan and with out zeroed.
void launch_crc32(const Crc32Args& a, int64_t ctas, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
