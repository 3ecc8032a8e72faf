// Huffman -> BF16 / exponent bytes and the Huffman row gather: the argument blocks, the
// per-chain bodies and the CTA bodies over a thread context (emu/ctx.cuh) that run them, by
// the kernels of huffman_decode.cu (design notes there) and, through the warp emulator, by
// that file's emulation.
//
// Unit of work: a *chain* (FORMAT.md "Checkpoint index"), the weights of one segment from
// one checkpoint to the next: S weights (the last chain of a segment fewer), or the whole
// segment when the tensor has no index.  Chains start at a bit position the index gives, so
// they decode independently of each other; each one checks that it ends where the index says
// the next one starts (or, for a segment's last chain, that the segment's bits fill its
// bytes), which makes decoding by chains exactly equal to decoding each segment from its start.
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"  // prmt, funnel_l

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

// Where the chain from checkpoint j of segment s starts: *bit in the stream, *start from the
// segment's first bit, *seg_bytes the segment's length.  False when the offsets are out of
// range or the checkpoint lies past the segment (every weight has >= 1 bit).  Checked per
// chain (not in a host pre-pass as on the CPU) so a corrupt table never makes a thread read
// outside the stream allocation.
UW_HD bool chain_start(const uint32_t* off, int64_t stream_bytes, const uint16_t* chk, int64_t S, int64_t P,
                       int64_t s, int64_t j, uint64_t* bit, uint64_t* start, uint32_t* seg_bytes) {
  const uint32_t b0 = off[s], b1 = off[s + 1];
  // The checkpoint entries' addresses are the job's, not the offsets': their loads go out with
  // the offsets' (one round trip to memory; a check between them would make two).
  const uint64_t st = S ? checkpoint_bit(chk, P, s, j) : 0;
  if (b1 < b0 || static_cast<int64_t>(b1) + STREAM_SLACK_BYTES > stream_bytes) return false;
  *start = st;
  *seg_bytes = b1 - b0;
  *bit = static_cast<uint64_t>(b0) * 8 + *start;
  return *start < static_cast<uint64_t>(b1 - b0) * 8;
}

// The index entry the end check reads when `end` < n (the chain's own bit count), else 0: its
// address is the job's, so it can be loaded before the chain's start is known.
UW_HD uint32_t chain_end_entry(const uint16_t* chk, int64_t P, int64_t S, int64_t s, int64_t end, int64_t n) {
  return end < n ? chk[s * P + end / S - 1] : 0u;
}
// The bit counts [*lo, *hi] a chain that decodes weights up to `end` of a segment of n
// weights, from bit `start` of it, may consume: exactly the next checkpoint (`entry`,
// chain_end_entry) when `end` is one, else (the segment's end) what rounds up to the segment's
// byte length, start + used in (8 seg_bytes - 8, 8 seg_bytes].  start < 8 seg_bytes
// (chain_start).
UW_HD void chain_end_range_of(uint32_t entry, int64_t end, int64_t n, uint64_t start, uint32_t seg_bytes,
                              uint64_t* lo, uint64_t* hi) {
  if (end < n) {
    *lo = *hi = entry;
    return;
  }
  *hi = static_cast<uint64_t>(seg_bytes) * 8 - start;
  *lo = *hi > 7 ? *hi - 7 : 0;
}
UW_HD void chain_end_range(const uint16_t* chk, int64_t P, int64_t S, int64_t s, int64_t end, int64_t n,
                           uint64_t start, uint32_t seg_bytes, uint64_t* lo, uint64_t* hi) {
  chain_end_range_of(chain_end_entry(chk, P, S, s, end, n), end, n, start, seg_bytes, lo, hi);
}

UW_HD bool chain_end_ok(const uint16_t* chk, int64_t P, int64_t S, int64_t s, int64_t end, int64_t n,
                        uint64_t start, uint64_t used, uint32_t seg_bytes) {
  uint64_t lo, hi;
  chain_end_range(chk, P, S, s, end, n, start, seg_bytes, &lo, &hi);
  return used >= lo && used <= hi;
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
template <bool kExp, class Lut>
UW_HD bool decode_chain_vec(const HuffArgs& a, const ChainJob& J, uint64_t bit, const uint8_t* sm,
                            uint16_t* o16, uint8_t* o8, Lut lut, uint64_t* used) {
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

// ---------------------------------------------------------------------------------------
// Look-ahead path (HUFF_VARIANT_AHEAD, _AHEAD2): kWays chains per thread, decoded in lockstep,
// every load issued a block or a step before anything reads it.  Why (the first H100 run,
// docs/design/gpu-kernels.md): the path above issues each chain's next stream block and
// byte-swaps it at once, and reads each step's sign+mantissa bytes right after loading them,
// so a chain waits out a full memory latency about every 40 symbols; a warp then issues once
// per ~9 cycles and a symbol costs ~300 cycles.  Here those waits are gone, the symbol's
// dependency chain is shorter (LUT load, one funnel shift, one shift-add, the address), and
// two chains per thread give the scheduler independent work between the links of each chain.
// The per-chain state is kept small (32-bit counters, the end check reduced to a range of bit
// counts at the start) so that two chains fit a thread without spilling.
// ---------------------------------------------------------------------------------------

// The shared-memory LUT entry of this path: [14:7] symbol, [4:0] code length (<= 12, so bit
// 4 is 0), bits 15, 6 and 5 zero.  A funnel shift by the whole entry is a shift by the code
// length (the shift count is taken mod 32), so no mask sits on the decode's dependency chain;
// and the symbol sits where a BF16 keeps its exponent, so a weight is its sign+mantissa byte
// and its entry under one mask (ahead_steps: two weights per byte permute and bit select).
// 0 still marks code space no symbol owns.
static_assert(HUFF_MAX_CODE_LEN < 16, "the look-ahead LUT entry keeps the length in bits 0..3");
constexpr uint32_t kAheadSymShift = 7;
UW_HD uint16_t lut_entry_ahead(uint16_t e) {
  return static_cast<uint16_t>(((e >> 4) << kAheadSymShift) | (e & 0xFu));
}

// The 16 bytes at `at` of a block that reaches past `end`: those before `end`, then zeros (a
// corrupt chain then fails its end check instead of faulting).  Out of line on the device:
// only the blocks at a stream's end take it, and inlined it would add ~100 instructions to
// every advance of the hot loop.
#if defined(__CUDA_ARCH__)
__device__ __noinline__
#else
inline
#endif
uint4 ahead_load_tail(const uint8_t* at, const uint8_t* end) {
  uint8_t q[16];
  for (int i = 0; i < 16; ++i) q[i] = at + i < end ? at[i] : static_cast<uint8_t>(0);
  uint4 v;
  std::memcpy(&v, q, 16);
  return v;
}

// 16 stream bytes at `at` (16-byte aligned) as loaded.
UW_HD void ahead_load(const uint8_t* at, const uint8_t* end, uint32_t (&v)[4]) {
  if (at + 16 <= end) {
    ld_stream_v4(at, v);
  } else {
    const uint4 t = ahead_load_tail(at, end);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  }
}

// One chain's exponent stream as three aligned 16-byte blocks: c (holding the read position)
// and n, byte-swapped into words whose msb is the first stream bit, and f, the block after n,
// as loaded.  Nothing reads f until the read position leaves c, one block (~40 symbols) after
// f's load was issued.
struct AheadBits {
  const uint8_t* next;  // the block after f
  uint32_t pos, pos0;   // bits consumed of block c (< 128 between rounds); pos at the start
  uint32_t adv;         // blocks left behind
  uint32_t c[4], n[4], f[4];

  UW_HD static void swap(const uint32_t (&s)[4], uint32_t (&d)[4]) {
UW_UNROLL()
    for (int i = 0; i < 4; ++i) d[i] = bswap32(s[i]);
  }
  UW_HD void init(const uint8_t* base, const uint8_t* end, uint64_t bit) {
    const uint8_t* b = base + (bit >> 7) * 16;
    pos = pos0 = static_cast<uint32_t>(bit & 127);
    adv = 0;
    uint32_t t[4];
    ahead_load(b, end, t);
    swap(t, c);
    ahead_load(b + 16, end, t);
    swap(t, n);
    ahead_load(b + 32, end, f);
    next = b + 48;
  }
  UW_HD void window(uint32_t& hi, uint32_t& lo) const { window_of(c, n, pos, hi, lo); }
  // The 64 stream bits from the read position on, as hi (first 32) and lo: words pos/32 ..
  // pos/32 + 2 of c, n by two selects (by bit 6, then bit 5 of pos) and two funnel shifts.
  UW_HD static void window_of(const uint32_t (&c)[4], const uint32_t (&n)[4], uint32_t pos, uint32_t& hi,
                              uint32_t& lo) {
    const bool h = pos >= 64, w = (pos & 32u) != 0;
    const uint32_t q0 = h ? c[2] : c[0], q1 = h ? c[3] : c[1], q2 = h ? n[0] : c[2], q3 = h ? n[1] : c[3];
    const uint32_t x = w ? q1 : q0, y = w ? q2 : q1, z = w ? q3 : q2;
    hi = emu::funnel_l(y, x, pos);
    lo = emu::funnel_l(z, y, pos);
  }
  // Leaving block c: n becomes c, and `raw` (the next block as loaded) the new n.
  UW_HD static void shift_in(uint32_t (&c)[4], uint32_t (&n)[4], const uint32_t (&raw)[4]) {
UW_UNROLL()
    for (int i = 0; i < 4; ++i) c[i] = n[i];
    swap(raw, n);
  }
  UW_HD void step_begin() {}  // (loads are issued as blocks are left behind)
  UW_HD void finish() {}
  // A round consumes at most 4 * 12 = 48 bits, so one block step is always enough.  A real
  // branch, not a select: a select would read f, and wait for its load, on every round.
  UW_HD void advance(uint32_t bits, const uint8_t* end) {
    pos += bits;
    if (pos >= 128) {
      pos -= 128;
      ++adv;
      shift_in(c, n, f);
      ahead_load(next, end, f);
      next += 16;
    }
  }
  UW_HD uint32_t consumed() const { return adv * 128u + pos - pos0; }
};

// RING (HUFF_VARIANT_RING): AheadBits' window over blocks c and n, with the blocks after them
// copied (cp.async) into this lane's HUFF_RING_SLOTS slots of shared memory rather than
// loaded into a register.  Why: AheadBits loads f when its lane leaves a block, and another
// lane of the warp reads its own f when *it* leaves a block, usually a round or two later;
// a register's pending load is tracked for the warp, not per lane, so that read waits for
// the other lane's load -- about once per round of 4 symbols, a global latency each (what the
// H200 profile of AHEAD suggests: 10.2 cycles per issued instruction, ~300 per symbol; see
// docs/design/gpu-kernels.md, RING).  Here every global access of the stream is a copy issued at a step's
// start, for blocks up to 7 past the current one, and waited for one step later (a step
// reads at most 3 blocks past its first: 32 symbols of at most 12 bits); leaving a block
// costs one shared-memory load.  Blocks past the stream allocation are zero-filled by the
// copy, none of their bytes read.
template <class Ctx>
struct RingBits {
  static constexpr uint32_t kSlots = plan::HUFF_RING_SLOTS;
  Ctx* cx;
  const uint8_t* base;  // block 0: the 16-byte block holding the chain's first bit
  unsigned char* ring;  // this lane's slots; block j sits in slot (j + lane) % kSlots (banks)
  uint32_t lane;
  uint32_t blk;         // block c, counted from base
  uint32_t issued;      // blocks [2, issued) copied or in flight
  uint32_t pos, pos0;   // bits consumed of block c (< 128 between rounds); pos at the start
  uint32_t whole, tail;  // blocks from base wholly inside the allocation; bytes of the next one
  uint32_t c[4], n[4];

  UW_HD unsigned char* slot(uint32_t j) const { return ring + 16 * ((j + lane) % kSlots); }
  // (32-bit block counts against the allocation's end, worked out once in init: a step's
  // copies are then a compare and a select each, not 64-bit pointer arithmetic)
  UW_HD void copy(uint32_t j) {
    const int bytes = j < whole ? 16 : j == whole ? static_cast<int>(tail) : 0;
    const uint8_t* at = bytes > 0 ? base + 16 * static_cast<uint64_t>(j) : base;
    cx->cp_async16(slot(j), at, bytes);  // (a copy of 0 bytes names a valid address)
  }
  UW_HD void init(Ctx& ctx, unsigned char* r, const uint8_t* stream, const uint8_t* e, uint64_t bit) {
    cx = &ctx;
    ring = r;
    lane = static_cast<uint32_t>(ctx.lane());
    base = stream + (bit >> 7) * 16;
    const int64_t left = e > base ? e - base : 0;  // (e: the stream allocation's end)
    const int64_t w = left / 16;
    whole = w < 0xFFFFFFFFll ? static_cast<uint32_t>(w) : 0xFFFFFFFFu;
    tail = w < 0xFFFFFFFFll ? static_cast<uint32_t>(left % 16) : 0u;
    pos = pos0 = static_cast<uint32_t>(bit & 127);
    blk = 0;
    uint32_t t[4];
    ahead_load(base, e, t);
    AheadBits::swap(t, c);
    ahead_load(base + 16, e, t);
    AheadBits::swap(t, n);
UW_UNROLL()
    for (uint32_t j = 2; j < kSlots; ++j) copy(j);
    issued = kSlots;
    cx->cp_async_commit();
  }
  UW_HD void window(uint32_t& hi, uint32_t& lo) const { AheadBits::window_of(c, n, pos, hi, lo); }
  // A step's start: copies of the blocks the lane left last step (at most 3, so that blocks up
  // to blk + kSlots - 1 are copied or in flight), then the wait for all but them.
  UW_HD void step_begin() {
UW_UNROLL()
    for (int k = 0; k < 3; ++k)
      if (issued < blk + kSlots) copy(issued++);
    cx->cp_async_commit();
    cx->template cp_async_wait<1>();
  }
  // As AheadBits::advance; the block after the new n comes from the ring.
  UW_HD void advance(uint32_t bits, const uint8_t*) {
    pos += bits;
    if (pos >= 128) {
      pos -= 128;
      ++blk;
      uint32_t t[4];
      cx->lds_v4(slot(blk + 1), t);
      AheadBits::shift_in(c, n, t);
    }
  }
  UW_HD uint32_t consumed() const { return blk * 128u + pos - pos0; }
  UW_HD void finish() { cx->template cp_async_wait<0>(); }  // the ring is free for the next chain
};

// PAIR (HUFF_VARIANT_PAIR): two symbols per shared-memory lookup.  Why: RING's dependency
// chain is one LUT load and three integer operations per symbol, and its step loop ~23
// instructions per symbol (docs/design/gpu-kernels.md, PAIR).  Codes average ~2.6 bits, so
// the next HUFF_PAIR_BITS = 9 stream bits hold two whole codes for ~98% of pairs of weights;
// a table indexed by the two weights' contexts (known from their sign+mantissa bytes before
// the lookup, so off the chain) and those 9 bits gives both symbols and their summed length in
// one load, already in place as the exponents of two BF16 words.  The step keeps RING's fixed
// positions (round q decodes weights 4q..4q+3 as two pairs), so the output is assembled as
// RING's is, with no per-lane variable step.  An entry the table cannot give whole (the pair
// is longer than 9 bits) takes the slow path: the first code from the entry where it fits in
// 9 bits, else by a 12-bit LUT lookup, then the second by another after it.
// ---------------------------------------------------------------------------------------
constexpr int kPairBits = plan::HUFF_PAIR_BITS;
constexpr int kPairEntries = (HUFF_NUM_CTX * HUFF_NUM_CTX) << kPairBits;
constexpr int kPairBytes = kPairEntries * 4;
// A pair entry: [14:7] and [30:23] the two symbols (the exponent fields of two BF16 words read
// as one 32-bit value), [4:0] their summed code length, every other bit 0.  kPairSlow marks an
// entry that is not two whole codes; with kPairFirst it holds the first code alone ([14:7],
// [4:0]), without it nothing (the first code is longer than 9 bits, or owns no code space
// under a zero-padded window).
constexpr uint32_t kPairSlow = 0x80000000u;
constexpr uint32_t kPairFirst = 0x8000u;
constexpr uint32_t kPairHalf = 0x7F80u | 31u;  // a shift-ready LUT entry's symbol and length
static_assert(HUFF_NUM_CTX == 4 && HUFF_CTX_SHIFT + 2 <= 8, "a pair's row is its two 2-bit contexts");
static_assert(2 * HUFF_MAX_CODE_LEN < 32, "a slow pair's summed length fits bits 0..4");

// The entry of context row (ca | cb << 2) at 9-bit window w, from `ea` = single9(ca, w), where
// single9(ctx, v) is the shift-ready LUT entry of context ctx at the 9 bits v padded with zeros
// to 12.  A code no longer than the bits the window has left matches the zero-padded index
// exactly when the window starts with it, so what the entry claims is what a 12-bit lookup of
// the real stream would give.
// The second lookup is made whatever the first gives (its index is in range either way), so
// the fill has selects where tests of the first code would put branches around it.
template <class Single9>
UW_HD uint32_t pair_entry(uint32_t ea, uint32_t cb, uint32_t w, Single9 single9) {
  constexpr uint32_t kMask = (1u << kPairBits) - 1, kBits = kPairBits;
  const uint32_t la = ea & 31u;
  const uint32_t eb = single9(cb, (w << la) & kMask);
  const uint32_t lb = eb & 31u;
  const bool first = ea != 0 && la <= kBits, both = first && eb != 0 && la + lb <= kBits;
  return both ? (ea + lb) | (eb & 0x7F80u) << 16 : first ? kPairSlow | kPairFirst | ea : kPairSlow;
}

// How PAIR's bodies read the two tables (shared memory; through the context's checked loads
// under the emulator, plain loads on the device).
template <class Ctx>
struct PairLut {
  Ctx* c;
  const uint16_t* single_s;  // the shift-ready LUT, [context][4096]
  const uint32_t* pair_s;    // the pair table, [ca | cb << 2][512]
  UW_HD uint32_t single(uint32_t i) const { return c->lds(single_s + i); }
  UW_HD uint32_t pair(uint32_t i) const { return c->lds(pair_s + i); }
};

// A slow entry e at window (hi, lo), contexts ca and cb: the pair as a whole entry of the same
// form (both codes' lengths summed in [4:0]; the second's length also lands in [20:16], which
// no reader of the symbols looks at).  mn takes the smaller LUT entry: 0 is a code no symbol
// owns.
template <class Lut>
UW_HD uint32_t pair_slow(uint32_t e, uint32_t hi, uint32_t lo, uint32_t ca, uint32_t cb, const Lut& lut,
                         uint32_t& mn) {
  constexpr uint32_t kPeek = 32 - HUFF_MAX_CODE_LEN;
  const uint32_t e0 = (e & kPairFirst) ? (e & kPairHalf) : lut.single(ca << HUFF_MAX_CODE_LEN | hi >> kPeek);
  const uint32_t h2 = emu::funnel_l(lo, hi, e0);
  const uint32_t e1 = lut.single(cb << HUFF_MAX_CODE_LEN | h2 >> kPeek);
  const uint32_t m = e0 < e1 ? e0 : e1;
  mn = m < mn ? m : mn;
  return (e0 + (e1 & 31u)) | (e1 << 16);
}

// Builds the pair table in shared memory from the CTA's shift-ready LUT (filled and behind a
// barrier), then the barrier every pair lookup waits on; 8,192 entries per CTA, once per launch
// (the grid holds the CTAs the device runs at once).  First the LUT's entries at 9-bit windows
// go to `scratch` (4 KiB of the rings, which no copy has touched yet), two per 32-bit store:
// read from the LUT itself the second code's lookups, 2^(len + 3) entries apart for lanes of
// consecutive windows, would meet on one bank (a 32-way conflict behind a 3-bit first code);
// from the 9-bit table they are 2^len entries apart.  Then a thread takes (ca, w) at a time,
// consecutive w across a warp: one read for the first code, one per cb for the second.
template <int kThreads, class Ctx>
UW_HD void pair_fill_body(Ctx& c, const uint16_t* single_s, uint32_t* pair_s, uint32_t* scratch) {
  constexpr int kFirsts = HUFF_NUM_CTX << kPairBits;
  constexpr uint32_t kPad = HUFF_MAX_CODE_LEN - kPairBits, kMask = (1u << kPairBits) - 1;
  static_assert(kFirsts % (2 * kThreads) == 0, "whole (context, window) pairs per thread");
  for (int i = c.tid(); i < kFirsts / 2; i += kThreads) {
    const uint32_t ctx = static_cast<uint32_t>(2 * i) >> kPairBits, w = static_cast<uint32_t>(2 * i) & kMask;
    const uint32_t at = ctx << HUFF_MAX_CODE_LEN | w << kPad;
    c.sts(scratch + i, static_cast<uint32_t>(c.lds(single_s + at)) |
                           static_cast<uint32_t>(c.lds(single_s + at + (1u << kPad))) << 16);
  }
  c.syncthreads();
  const uint16_t* t9 = reinterpret_cast<const uint16_t*>(scratch);
  const auto single9 = [&](uint32_t ctx, uint32_t v) -> uint32_t { return c.lds(t9 + (ctx << kPairBits | v)); };
  for (int i = c.tid(); i < kFirsts; i += kThreads) {
    const uint32_t ca = static_cast<uint32_t>(i) >> kPairBits, w = static_cast<uint32_t>(i) & kMask;
    const uint32_t ea = single9(ca, w);
UW_UNROLL()
    for (uint32_t cb = 0; cb < HUFF_NUM_CTX; ++cb)
      c.sts(pair_s + ((ca | cb << 2) << kPairBits | w), pair_entry(ea, cb, w, single9));
  }
  c.syncthreads();
}

// One chain of a look-ahead thread: its stream, where its next step lies, that step's 32
// sign+mantissa bytes (loaded one step ahead of their use), and what its end check accepts.
template <class Bits>
struct AheadWayT {
  Bits sb;
  const uint8_t* sp;  // the next step's sign+mantissa bytes
  uint8_t* op;        // ... and its output (bytes: 2 per weight for BF16, 1 for exponents)
  int32_t col;        // steps left in the current segment row
  int32_t row_steps;  // steps per segment row (its width / kChainStep)
  int32_t steps;      // steps left
  uint32_t used_lo, used_hi;  // the bit counts the end check accepts
  uint32_t mn;        // smallest LUT entry met: 0 means an invalid code
  uint32_t s_next[8];

  // Issues the loads of the next step's 32 bytes (one sector) into s_next.
  UW_HD void fetch() {
    uint32_t a4[4], b4[4];
    ld_stream_v4(sp, a4);
    ld_stream_v4(sp + 16, b4);
UW_UNROLL()
    for (int q = 0; q < 4; ++q) {
      s_next[q] = a4[q];
      s_next[q + 4] = b4[q];
    }
  }
};
using AheadWay = AheadWayT<AheadBits>;

// Weights 4q..4q+3 of a half step as BF16 into ow[2q], ow[2q + 1]: their sign+mantissa bytes
// (sw) doubled (s0 s0 s1 s1) give the sign (bit 15) and mantissa (bits 6..0) of each half, the
// entries packed in pairs (p01 = e0 | e1 << 16, p23) the exponents (bits 14..7): one bit select
// under 0x807F807F per two weights.
static_assert(kAheadSymShift == 7, "the entry's symbol is the BF16 exponent field");
UW_HD void bf16_round(uint32_t sw, uint32_t p01, uint32_t p23, uint32_t (&ow)[8], int q) {
  constexpr uint32_t kSignMant = 0x807F807Fu;
  const uint32_t s01 = emu::prmt(sw, 0u, 0x1100u), s23 = emu::prmt(sw, 0u, 0x3322u);
  ow[2 * q] = (s01 & kSignMant) | (p01 & ~kSignMant);
  ow[2 * q + 1] = (s23 & kSignMant) | (p23 & ~kSignMant);
}

// PAIR's round q of a half step: weights 4q..4q+3 as two pairs, each one pair-table load on
// the fast path.  Their rows come from the sign+mantissa bytes alone: t holds each byte's
// context in its low bits, t | t >> 6 the first pair's row (ca | cb << 2) in bits 3..0 and the
// second's in bits 19..16.  bits: what the round consumed (at most 4 x 12, as RING's round).
template <bool kExp, class Way, class Lut>
UW_HD void pair_round(Way& v, uint32_t sw, const Lut& lut, uint32_t& bits, uint32_t (&ow)[kExp ? 4 : 8], int q) {
  uint32_t hi, lo;
  v.sb.window(hi, lo);
  const uint32_t t = (sw >> HUFF_CTX_SHIFT) & 0x03030303u, rows = t | (t >> 6);
  uint32_t pe[2];
  bits = 0;
UW_UNROLL()
  for (int b = 0; b < 2; ++b) {
    const uint32_t row = (rows >> (16 * b)) & 15u;
    uint32_t e = lut.pair(row << kPairBits | hi >> (32 - kPairBits));
    if (e & kPairSlow) e = pair_slow(e, hi, lo, row & 3u, row >> 2, lut, v.mn);
    hi = emu::funnel_l(lo, hi, e);
    lo = emu::funnel_l(0u, lo, e);
    bits += e & 31u;
    pe[b] = e;
  }
  if constexpr (kExp) {
    ow[q] = emu::prmt(pe[0] >> kAheadSymShift, pe[1] >> kAheadSymShift, 0x6420u);
  } else {
    bf16_round(sw, pe[0], pe[1], ow, q);
  }
}

// Decodes `nsteps` steps of each of the kN chains ws[0..kN), round by round in lockstep (the
// chains are independent, so their instructions interleave).  Per step and chain: the next
// step's 32 bytes are loaded, then 2 halves of 16 weights, each 4 rounds of 4 symbols
// assembled in registers and stored with 16-byte stores.  sm_skip / out_skip: bytes from a
// segment row's end to the next row's start in each plane.  Way: AheadWayT over the chain's
// stream bits (AheadBits, or RING's RingBits, whose step_begin issues the step's copies).
template <bool kExp, int kN, bool kPair = false, class Way, class Lut>
UW_HD void ahead_steps(Way* ws, int32_t nsteps, const uint8_t* end, int64_t sm_stride, int64_t out_stride,
                       Lut lut) {
  constexpr int kOutBytes = kExp ? 1 : 2;
  static_assert(!kPair || kN == 1, "PAIR decodes one chain per thread");
  for (int32_t i = 0; i < nsteps; ++i) {
    uint32_t s[kN][8];
    uint8_t* at[kN];
UW_UNROLL()
    for (int k = 0; k < kN; ++k) {
      Way& v = ws[k];
      v.sb.step_begin();
UW_UNROLL()
      for (int q = 0; q < 8; ++q) s[k][q] = v.s_next[q];
      at[k] = v.op;
      v.sp += kChainStep;
      v.op += kChainStep * kOutBytes;
      if (--v.col == 0) {  // the next step starts the segment's next row
        v.col = v.row_steps;
        const int64_t w = static_cast<int64_t>(v.row_steps) * kChainStep;
        v.sp += sm_stride - w;
        v.op += (out_stride - w) * kOutBytes;
      }
      if (--v.steps > 0) v.fetch();
    }
UW_UNROLL()
    for (int h = 0; h < 2; ++h) {
      uint32_t ow[kN][kExp ? 4 : 8];
UW_UNROLL()
      for (int q = 0; q < 4; ++q) {
        // The chains' rounds first, as one straight run of code the compiler can interleave,
        // then their advances: an advance is a branch, which no instruction is moved across.
        uint32_t bits[kN];
        if constexpr (kPair) {
          pair_round<kExp>(ws[0], s[0][4 * h + q], lut, bits[0], ow[0], q);
        } else {
UW_UNROLL()
          for (int k = 0; k < kN; ++k) {
            Way& v = ws[k];
            const uint32_t sw = s[k][4 * h + q];
            uint32_t hi, lo;
            v.sb.window(hi, lo);
            bits[k] = 0;
            uint32_t e[kRound];
            if (kExp) ow[k][q] = 0;
UW_UNROLL()
            for (int b = 0; b < kRound; ++b) {
              const uint32_t cx = ((sw >> (8 * b + HUFF_CTX_SHIFT)) & (HUFF_NUM_CTX - 1)) << HUFF_MAX_CODE_LEN;
              e[b] = lut[cx | (hi >> (32 - HUFF_MAX_CODE_LEN))];
              hi = emu::funnel_l(lo, hi, e[b]);
              lo = emu::funnel_l(0u, lo, e[b]);
              bits[k] += e[b] & 31u;
              v.mn = e[b] < v.mn ? e[b] : v.mn;
              if (kExp) ow[k][q] |= (e[b] >> kAheadSymShift) << (8 * b);
            }
            if constexpr (!kExp)
              bf16_round(sw, emu::prmt(e[0], e[1], 0x5410u), emu::prmt(e[2], e[3], 0x5410u), ow[k], q);
          }
        }
UW_UNROLL()
        for (int k = 0; k < kN; ++k) ws[k].sb.advance(bits[k], end);
      }
UW_UNROLL()
      for (int k = 0; k < kN; ++k) {
        uint8_t* op = at[k] + 16 * h * kOutBytes;
        if (kExp) {
          st_v4_bytes(op, {ow[k][0], ow[k][1], ow[k][2], ow[k][3]});
        } else {
          st_v4_bytes(op, {ow[k][0], ow[k][1], ow[k][2], ow[k][3]});
          st_v4_bytes(op + 16, {ow[k][4], ow[k][5], ow[k][6], ow[k][7]});
        }
      }
    }
  }
}

// Sets up chain t of the selection on v, a zeroed way (false: corrupt offsets or checkpoint,
// nothing of the stream loaded and v.steps left 0), with its end check as the range of bit
// counts it accepts (chain_end_range; the launcher keeps chains whose counts could pass 32
// bits off this path).  begin(v.sb, bit) sets up the stream bits.  The first step's
// sign+mantissa bytes and the end check's index entry, whose addresses are the job's, are
// asked for first: in flight with the offsets and checkpoint entries, so a chain's setup
// waits on memory twice: those, then the stream blocks at the start bit they give.
template <bool kExp, class Way, class Begin>
UW_HD bool ahead_init(const HuffArgs& a, Way& v, const ChainJob& J, Begin begin) {
  const int64_t r = J.first / J.w, c = J.first % J.w;
  v.sp = a.sm + (J.lr + r) * a.sm_stride + J.lk + c;
  v.fetch();
  const uint32_t end_entry = chain_end_entry(a.chk, a.P, a.S, J.s, J.end, J.n);
  uint64_t bit, start, lo, hi;
  uint32_t seg_bytes;
  if (!chain_start(a.off, a.stream_bytes, a.chk, a.S, a.P, J.s, J.j, &bit, &start, &seg_bytes)) return false;
  chain_end_range_of(end_entry, J.end, J.n, start, seg_bytes, &lo, &hi);
  v.used_lo = static_cast<uint32_t>(lo);
  v.used_hi = static_cast<uint32_t>(hi);
  begin(v.sb, bit);
  v.op = kExp ? a.out8 + (J.lr + r) * a.out_stride + J.lk + c
              : reinterpret_cast<uint8_t*>(a.out16 + (J.lr + r) * a.out_stride + J.lk + c);
  v.row_steps = static_cast<int32_t>(J.w / kChainStep);
  v.col = static_cast<int32_t>((J.w - c) / kChainStep);
  v.steps = static_cast<int32_t>((J.end - J.first) / kChainStep);
  v.mn = 0xFFFFu;
  return true;
}

// Decodes chains u * kWays .. u * kWays + kWays - 1 (those below n_chains) of the selection
// (vector conditions proven by the launcher); returns how many are corrupt, by the checks of
// huff_chain_body.  The chains run in lockstep for as many steps as all have, then each alone
// for its rest (only a segment's last chain is shorter than S).  Bits: the chains' stream
// bits (AheadBits; RING's RingBits), set up by begin(bits, first bit).
template <bool kExp, int kWays, class Bits, bool kPair = false, class Lut, class Begin>
UW_HD int huff_ahead_body(int64_t u, int64_t n_chains, const HuffArgs& a, Lut lut, Begin begin) {
  AheadWayT<Bits> ws[kWays] = {};  // zeroed: a dead way is never read, but the host compiler cannot see that
  bool live[kWays];
  int bad = 0;
  int32_t common = INT32_MAX;
UW_UNROLL()
  for (int k = 0; k < kWays; ++k) {
    const int64_t t = u * kWays + k;
    ChainJob J;
    live[k] = false;
    if (t < n_chains && chain_job(t, a, &J)) {
      live[k] = ahead_init<kExp>(a, ws[k], J, begin);
      bad += !live[k];
    }
    common = ws[k].steps < common ? ws[k].steps : common;
  }
  const uint8_t* end = a.stream + a.stream_bytes;
  ahead_steps<kExp, kWays, kPair>(ws, common, end, a.sm_stride, a.out_stride, lut);
  if (kWays > 1) {
UW_UNROLL()
    for (int k = 0; k < kWays; ++k)
      if (ws[k].steps > 0) ahead_steps<kExp, 1, kPair>(&ws[k], ws[k].steps, end, a.sm_stride, a.out_stride, lut);
  }
UW_UNROLL()
  for (int k = 0; k < kWays; ++k) {
    const uint32_t used = ws[k].sb.consumed();
    if (live[k] && !(ws[k].mn > 0 && used >= ws[k].used_lo && used <= ws[k].used_hi)) ++bad;
    if (live[k]) ws[k].sb.finish();
  }
  return bad;
}

// Decodes chain t of the selection; false when it is corrupt (offsets out of range, a
// checkpoint outside its segment, an invalid code, or a chain that does not end where the
// index or the segment's byte length says).  kVec: the launcher proved the vector conditions
// (huffman_decode.cu, vec_ok).  Writes only inside its own chain's weights of the output.
template <bool kExp, bool kVec, class Lut>
UW_HD bool huff_chain_body(int64_t t, const HuffArgs& a, Lut lut) {
  ChainJob J;
  if (!chain_job(t, a, &J)) return true;
  uint64_t bit, start;
  uint32_t seg_bytes;
  if (!chain_start(a.off, a.stream_bytes, a.chk, a.S, a.P, J.s, J.j, &bit, &start, &seg_bytes)) return false;
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
  return ok && chain_end_ok(a.chk, a.P, a.S, J.s, J.end, J.n, start, used, seg_bytes);
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
template <class Lut>
UW_HD bool hgather_body(int64_t t, const HGatherArgs& a, Lut lut) {
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
  uint64_t bit, start;
  uint32_t seg_bytes;
  if (!chain_start(a.off, a.stream_bytes, a.chk, a.S, a.P, s, j, &bit, &start, &seg_bytes)) return false;
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
  return chain_end_ok(a.chk, a.P, a.S, s, end, n, start, used, seg_bytes);
}

// ---------------------------------------------------------------------------------------
// The kernels' bodies over a thread context (emu/ctx.cuh), run by the kernels of
// huffman_decode.cu and, through the warp emulator, by its host emulation.
// ---------------------------------------------------------------------------------------

// The LUT a CTA decodes with: 4 contexts x 4096 entries x 2 B = 32 KiB of shared memory, the
// whole code space of a <= 12-bit code, so a symbol is one shared load indexed by the next 12
// stream bits (no tree walk, no branch).  The CTA bodies take it as `lut_s`: on the device a
// static __shared__ array of the kernel, under the emulator the launch's dynamic shared
// memory (the only shared memory it checks).  Why not dynamic on the device too: nvcc then
// keeps the CHAIN kernels' parameters in constant memory rather than registers (7 more
// constant loads in the step loop, 7 fewer registers), a change to the measured default
// decoder that no GPU has timed.
constexpr int kLutBytes = HUFF_NUM_CTX * LUT_SIZE * 2;

// How a body reads that LUT.  Under the emulator every lookup is the context's checked
// shared-memory load (ordered after the fill's barrier, of a word the fill wrote); the device
// context gets the bare pointer, so the device code is the plain `lut[i]` load.
template <class Ctx>
struct CtxLut {
  Ctx* c;
  const uint16_t* p;
  UW_HD uint16_t operator[](uint32_t i) const { return c->lds(p + i); }
};
template <class Ctx>
UW_HD CtxLut<Ctx> lut_view(Ctx& c, const uint16_t* lut_s) {
  return {&c, lut_s};
}
UW_HD const uint16_t* lut_view(emu::DeviceCtx&, const uint16_t* lut_s) { return lut_s; }

// One thread per context: build_lut is the shared canonical-code constructor.  Runs once per
// tensor (the tables are cached by the caller), so its serial 4096-entry fill is irrelevant.
template <class Ctx>
UW_HD void build_lut_body(Ctx& c, const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err) {
  const int t = c.tid();
  if (t >= HUFF_NUM_CTX) return;
  if (!build_lut(table + t * n, n, lo, lut + t * LUT_SIZE, nullptr)) c.atomic_add(err, 1);
}

// Copies the global tables (built once per tensor by build_lut_body) into the CTA's shared
// memory with 16-byte loads and stores, then the barrier every lookup waits on.  They are
// read by every CTA, so the L1/L2-allocating read-only load.  kAhead: the look-ahead
// variants' LUT (huff_ahead_body), whose entries are made shift-ready (lut_entry_ahead) on the
// way in.
template <bool kAhead, int kThreads = plan::HUFF_THREADS, class Ctx>
UW_HD void lut_fill_body(Ctx& c, uint16_t* lut_s, const uint16_t* lut_g) {
  constexpr int kVecs = kLutBytes / 16, kPer = kVecs / kThreads;
  static_assert(kVecs % kThreads == 0, "the LUT is whole 16-byte pieces per thread");
  const uint4* src = reinterpret_cast<const uint4*>(lut_g);
  uint4* dst = reinterpret_cast<uint4*>(lut_s);
  // All of a thread's kPer loads go out before its first store: the fill waits one L2 round
  // trip, where a loop the compiler unrolls by four waits four.
  uint32_t w[kPer][4];
UW_UNROLL()
  for (int p = 0; p < kPer; ++p) ld_reuse_v4(reinterpret_cast<const uint16_t*>(src + c.tid() + p * kThreads), w[p]);
UW_UNROLL()
  for (int p = 0; p < kPer; ++p) {
    if (kAhead) {
UW_UNROLL()
      for (int i = 0; i < 4; ++i)
        w[p][i] = lut_entry_ahead(static_cast<uint16_t>(w[p][i] & 0xFFFFu)) |
                  static_cast<uint32_t>(lut_entry_ahead(static_cast<uint16_t>(w[p][i] >> 16))) << 16;
    }
    c.sts(dst + c.tid() + p * kThreads, make_uint4(w[p][0], w[p][1], w[p][2], w[p][3]));
  }
  c.syncthreads();
}

// The CTA of a decode: fill the LUT, then units of kPer of the n items (chains, gather units)
// in grid-stride order; unit(t, lut) returns how many of unit t's items are corrupt, added to
// *err.  The thread index is widened as an unsigned value, as threadIdx.x is: the device code
// then has no sign extension to do.
template <int kPer, int kThreads, class Ctx, class Lut, class Unit>
UW_HD void grid_stride_units(Ctx& c, const Lut& lut, int64_t n, int32_t* err, Unit unit) {
  const int64_t n_units = cdiv(n, kPer);
  const int64_t stride = c.grid_x() * kThreads;
  for (int64_t t = c.block_x() * kThreads + static_cast<unsigned>(c.tid()); t < n_units; t += stride)
    if (const int bad = unit(t, lut)) c.atomic_add(err, bad);
}
template <bool kAhead, int kPer, int kThreads = plan::HUFF_THREADS, class Ctx, class Unit>
UW_HD void lut_grid_stride(Ctx& c, uint16_t* lut_s, const uint16_t* lut_g, int64_t n, int32_t* err, Unit unit) {
  lut_fill_body<kAhead, kThreads>(c, lut_s, lut_g);
  grid_stride_units<kPer, kThreads>(c, lut_view(c, lut_s), n, err, unit);
}

template <bool kExp, bool kVec, class Ctx>
UW_HD void huff_chain_cta(Ctx& c, uint16_t* lut_s, const HuffArgs& a, int64_t n_chains, const uint16_t* lut_g,
                          int32_t* err) {
  lut_grid_stride<false, 1>(c, lut_s, lut_g, n_chains, err,
                            [&](int64_t t, auto lut) { return huff_chain_body<kExp, kVec>(t, a, lut) ? 0 : 1; });
}

template <bool kExp, int kWays, class Ctx>
UW_HD void huff_ahead_cta(Ctx& c, uint16_t* lut_s, const HuffArgs& a, int64_t n_chains, const uint16_t* lut_g,
                          int32_t* err) {
  lut_grid_stride<true, kWays>(c, lut_s, lut_g, n_chains, err,
                               [&](int64_t u, auto lut) {
                                 return huff_ahead_body<kExp, kWays, AheadBits>(
                                     u, n_chains, a, lut, [&](AheadBits& b, uint64_t bit) {
                                       b.init(a.stream, a.stream + a.stream_bytes, bit);
                                     });
                               });
}

// RING: AHEAD's CTA with a ring of HUFF_RING_SLOTS 16-byte slots per thread at ring_s
// (ring_bytes(kThreads) of shared memory beside the LUT).  kThreads: HUFF_THREADS (RING) or
// HUFF_RING_WIDE_THREADS (RING_WIDE: more warps share the LUT); the same chains, the same bits.
constexpr int ring_bytes(int threads) { return threads * plan::HUFF_RING_SLOTS * 16; }
constexpr int kRingBytes = ring_bytes(plan::HUFF_THREADS);
template <bool kExp, int kThreads = plan::HUFF_THREADS, class Ctx>
UW_HD void huff_ring_cta(Ctx& c, uint16_t* lut_s, unsigned char* ring_s, const HuffArgs& a, int64_t n_chains,
                         const uint16_t* lut_g, int32_t* err) {
  unsigned char* ring = ring_s + c.tid() * plan::HUFF_RING_SLOTS * 16;
  lut_grid_stride<true, 1, kThreads>(c, lut_s, lut_g, n_chains, err, [&](int64_t u, auto lut) {
    return huff_ahead_body<kExp, 1, RingBits<Ctx>>(u, n_chains, a, lut, [&](RingBits<Ctx>& b, uint64_t bit) {
      b.init(c, ring, a.stream, a.stream + a.stream_bytes, bit);
    });
  });
}

// PAIR: the shift-ready LUT, the pair table built from it and kThreads rings in `smem`
// (pair_smem_bytes), then RING's chains with pair rounds.
constexpr int pair_smem_bytes(int threads) { return kLutBytes + kPairBytes + ring_bytes(threads); }
template <bool kExp, int kThreads, class Ctx>
UW_HD void huff_pair_cta(Ctx& c, unsigned char* smem, const HuffArgs& a, int64_t n_chains, const uint16_t* lut_g,
                         int32_t* err) {
  uint16_t* lut_s = reinterpret_cast<uint16_t*>(smem);
  uint32_t* pair_s = reinterpret_cast<uint32_t*>(smem + kLutBytes);
  unsigned char* rings = smem + kLutBytes + kPairBytes;
  unsigned char* ring = rings + c.tid() * plan::HUFF_RING_SLOTS * 16;
  static_assert(ring_bytes(kThreads) >= (HUFF_NUM_CTX << kPairBits) * 2, "the pair fill's scratch fits the rings");
  lut_fill_body<true, kThreads>(c, lut_s, lut_g);
  pair_fill_body<kThreads>(c, lut_s, pair_s, reinterpret_cast<uint32_t*>(rings));
  const PairLut<Ctx> lut{&c, lut_s, pair_s};
  grid_stride_units<1, kThreads>(c, lut, n_chains, err, [&](int64_t u, const PairLut<Ctx>& l) {
    return huff_ahead_body<kExp, 1, RingBits<Ctx>, true>(u, n_chains, a, l, [&](RingBits<Ctx>& b, uint64_t bit) {
      b.init(c, ring, a.stream, a.stream + a.stream_bytes, bit);
    });
  });
}

template <class Ctx>
UW_HD void hgather_cta(Ctx& c, uint16_t* lut_s, const HGatherArgs& a, int64_t n_units, const uint16_t* lut_g,
                       int32_t* err) {
  lut_grid_stride<false, 1>(c, lut_s, lut_g, n_units, err,
                            [&](int64_t t, auto lut) { return hgather_body(t, a, lut) ? 0 : 1; });
}

// ---------------------------------------------------------------------------------------
// Launchers (huffman_decode.cu): the launch alone; the host API beside them checks the
// arguments and sizes the grid first.
// ---------------------------------------------------------------------------------------
void launch_build_lut(const uint8_t* table, int n, int lo, uint16_t* lut, int32_t* err, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
