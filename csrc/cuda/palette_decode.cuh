// Palette -> BF16 and the verbatim-block patch: the argument blocks and the per-thread /
// per-lane bodies, run by the kernels of palette_decode.cu (design notes there) and,
// serially on the host, by emulate.cu.
#pragma once
#include "device_util.cuh"
#include "pal_regs.cuh"

namespace unweight {
namespace cuda {
namespace detail {

struct PalArgs {
  const uint8_t* sm;
  const uint8_t* idx;
  int64_t rows, cols, r0, r1, k0, k1;
  Palette pal;
  uint16_t* out;
  int64_t out_stride;
  PalTables pt;  // the wide variant's register tables (pal_tables), filled by its launcher
  bool tiled;    // the planes tile-major (kernel_plan.h pal_offset), else in file order
};

// Weights [k, k + n) of rectangle row r, one by one (any alignment): the tail of a rectangle
// whose width is not a multiple of a thread's vector.  False on an index past the palette.
UW_HD bool pal_decode_scalar(const PalArgs& a, int64_t r, int64_t k, int n) {
  const int64_t row = a.r0 + r, col = a.k0 + k;
  uint16_t* o = a.out + r * a.out_stride + k;
  uint32_t bad = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t c = col + j;
    const uint32_t nb = pal_nibble(a.idx + plan::pal_idx_index(row, c, a.cols, a.tiled), c & 1);
    bad |= nb >= static_cast<uint32_t>(a.pal.size);
    o[j] = bf16_from_parts(a.sm[plan::pal_sm_index(row, c, a.cols, a.tiled)], pal_exp(a.pal, nb));
  }
  return bad == 0;
}

// kVec: the launcher proved 8-byte alignment of sm rows, 4-byte of idx rows and 16-byte of
// output chunks (cols, k0, out_stride multiples of 8); a tail chunk (< 8 weights) of a
// rectangle whose width is not a multiple of 8 takes the scalar path (one branch per thread).
// A chunk's 8 weights lie in one 64-column tile row, so they are 8 contiguous sign+mantissa
// bytes and 4 index bytes in either plane order.
template <bool kVec>
UW_HD bool pal_decode_body(int64_t t, const PalArgs& a) {
  int64_t r, k;
  int n;
  plan::pal_unit(t, a.k1 - a.k0, &r, &k, &n);
  const int64_t row = a.r0 + r, col = a.k0 + k;
  uint16_t* o = a.out + r * a.out_stride + k;
  const uint32_t size = static_cast<uint32_t>(a.pal.size);
  uint32_t bad = 0;
  if (kVec && n == plan::PAL_VEC) {
    const int64_t at = plan::pal_sm_index(row, col, a.cols, a.tiled);
    const uint32_t nib = ld_stream_u32(a.idx + at / 2);  // 8 nibbles, column j at bits 4j
    uint32_t s0, s1;
    ld_stream_v2(a.sm + at, s0, s1);
    uint32_t w[4];
UW_UNROLL()
    for (int j = 0; j < 8; j += 2) {
      const uint32_t sw = j < 4 ? s0 : s1;
      const uint32_t na = (nib >> (4 * j)) & 0xFu, nb = (nib >> (4 * j + 4)) & 0xFu;
      bad |= (na >= size) | (nb >= size);
      const uint16_t ha = bf16_from_parts(static_cast<uint8_t>(sw >> (8 * (j & 3))), pal_exp(a.pal, na));
      const uint16_t hb = bf16_from_parts(static_cast<uint8_t>(sw >> (8 * ((j & 3) + 1))), pal_exp(a.pal, nb));
      w[j / 2] = static_cast<uint32_t>(ha) | (static_cast<uint32_t>(hb) << 16);
    }
    st_v4(o, w);
    return bad == 0;
  }
  return pal_decode_scalar(a, r, k, n);
}

// Wide variant: PAL_WIDE_STEPS 8-weight chunks per thread (plan::pal_wide_units; at each step
// the warp's lanes take consecutive chunks, so every load and store instruction covers whole
// sectors, as VEC8's do).  All steps' loads are issued before any use (48 bytes in flight per
// thread), decoded by byte permutes on the register tables (pal_decode4: 8 or 11 operations
// per 4 weights) and written with one 16-byte store per chunk.  An index past the palette is
// found for 8 weights at once: the nibbles, spread into bytes, plus 0x80 - size set a byte's
// top bit exactly when they are >= size.  The launcher proved VEC8's alignment (pal_decode_body
// with kVec) and a width of whole chunks, so every chunk has PAL_VEC weights.
template <bool kPaired>
UW_HD bool pal_decode_wide_body(int64_t t, const PalArgs& a) {
  constexpr int S = plan::PAL_WIDE_STEPS;
  int64_t r[S], k[S];
  int n[S];
  plan::pal_wide_units(t, a.k1 - a.k0, r, k, n);
  const int64_t rows = a.r1 - a.r0;
  uint32_t nib[S], s0[S], s1[S];
UW_UNROLL()
  for (int s = 0; s < S; ++s) {
    nib[s] = s0[s] = s1[s] = 0;
    if (r[s] < rows) {
      const int64_t at = plan::pal_sm_index(a.r0 + r[s], a.k0 + k[s], a.cols, a.tiled);  // (cols even)
      nib[s] = ld_stream_u32(a.idx + at / 2);  // 8 nibbles, column j at bits 4j
      ld_stream_v2(a.sm + at, s0[s], s1[s]);
    }
  }
  const uint32_t c = (0x80u - static_cast<uint32_t>(a.pal.size)) * 0x01010101u;
  uint32_t top = 0;
UW_UNROLL()
  for (int s = 0; s < S; ++s) {
    if (r[s] >= rows) continue;
    top |= ((nib[s] & 0x0F0F0F0Fu) + c) | (((nib[s] >> 4) & 0x0F0F0F0Fu) + c);
    uint32_t w[4];
    pal_decode4<kPaired>(s0[s], nib[s], a.pt, w[0], w[1]);
    pal_decode4<kPaired>(s1[s], nib[s] >> 16, a.pt, w[2], w[3]);
    st_v4(a.out + r[s] * a.out_stride + k[s], w);
  }
  return (top & 0x80808080u) == 0;
}

struct PatchArgs {
  const uint8_t* sm;
  int64_t rows, cols, r0, r1, k0, k1;
  const uint32_t* vpos;
  int64_t nv;
  const uint8_t* vexp;
  uint16_t* out;
  int64_t out_stride;
  bool tiled;  // sm tile-major (PalArgs::tiled)
};

// Lane `lane` of the warp for verbatim block v writes its columns lane, lane+32, ... of the
// block when they fall inside the decoded rectangle.  Returns false (lane 0 only) on an id
// that is out of range or not strictly ascending.
UW_HD bool patch_lane_body(int64_t v, int lane, const PatchArgs& a) {
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const uint32_t id = a.vpos[v];
  if (static_cast<int64_t>(id) >= a.rows * bpr || (v > 0 && a.vpos[v - 1] >= id)) return lane != 0;
  const int64_t r = id / bpr, b = id % bpr;
  if (r < a.r0 || r >= a.r1) return true;
  for (int64_t jb = lane; jb < PAL_BLOCK; jb += plan::WARP) {  // lane-strided: coalesced
    const int64_t c = b * PAL_BLOCK + jb;
    if (c < a.k0 || c >= a.k1) continue;
    a.out[(r - a.r0) * a.out_stride + (c - a.k0)] =
        bf16_from_parts(a.sm[plan::pal_sm_index(r, c, a.cols, a.tiled)], a.vexp[v * PAL_BLOCK + jb]);
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Row gather (embeddings): out[i] = row ids[i], decoded from the full planes.
// ---------------------------------------------------------------------------------------
struct PGatherArgs {
  const int64_t* ids;
  int64_t n_ids;
  const uint8_t* sm;
  const uint8_t* idx;
  int64_t rows, cols;
  Palette pal;
  const uint32_t* vpos;
  int64_t nv;
  const uint8_t* vexp;
  uint16_t* out;  // [n_ids, cols], row stride out_stride
  int64_t out_stride;
  const uint32_t* vrow;  // the verbatim list's row index [rows + 1] (palette_matmul.cuh PalProduct), or nullptr
};

// Thread t: PAL_VEC weights of one id's row (pal_unit over n_ids rows).  All of them lie in one
// PAL_BLOCK-wide block, whose verbatim entry (if any) a binary search of the ascending vpos
// finds (of the row's entries alone, with the row index), so the row needs no patch pass.  An id
// outside [0, rows) gives zeros and one error (from its first thread); a nibble >= the palette
// size is an error too.
UW_HD bool pgather_body(int64_t t, const PGatherArgs& a) {
  int64_t i, k;
  int n;
  plan::pal_unit(t, a.cols, &i, &k, &n);
  const int64_t r = a.ids[i];
  uint16_t* o = a.out + i * a.out_stride + k;
  if (r < 0 || r >= a.rows) {
    for (int j = 0; j < n; ++j) o[j] = 0;
    return k != 0;
  }
  const int64_t bpr = plan::blocks_per_row(a.cols);
  const uint64_t key = static_cast<uint64_t>(r * bpr + k / PAL_BLOCK);
  // The row's entries from the row index (two loads, then a search of the few in the row), or
  // a search of the whole list.
  int64_t lo = 0, hi = a.nv;
  if (a.vrow != nullptr) vrow_bounds(a.vrow, r, a.nv, &lo, &hi);
  const int64_t v = lo + lower_bound_u32(a.vpos + lo, hi - lo, key);
  const bool verbatim = v < a.nv && a.vpos[v] == key;
  const uint8_t* smr = a.sm + r * a.cols;
  const uint8_t* ir = a.idx + r * ((a.cols + 1) / 2);
  const uint32_t size = static_cast<uint32_t>(a.pal.size);
  uint32_t bad = 0;
  for (int j = 0; j < n; ++j) {
    const uint32_t nb = pal_nibble(ir, k + j);
    bad |= nb >= size;
    const uint32_t e = verbatim ? a.vexp[v * PAL_BLOCK + (k % PAL_BLOCK) + j] : pal_exp(a.pal, nb);
    o[j] = bf16_from_parts(smr[k + j], e);
  }
  return bad == 0;
}

// ---------------------------------------------------------------------------------------
// Slots: a stack of n palette matrices [n, rows, cols] (one palette; each matrix's verbatim
// list of one length nv_per, ascending block ids within the matrix: runtime/expert_slots.py
// pads them) decoded by matrix ids that stay on the device: output slot s is matrix ids[s].
// The kernels run the whole-matrix bodies above with the slot's pointers (grid y = slot).
// ---------------------------------------------------------------------------------------
struct SlotArgs {
  const int64_t* ids;  // [slots] on the device
  int64_t n;           // matrices in the stack
  const uint8_t* sm;   // the stack's planes, and the output of slot 0
  const uint8_t* idx;
  uint16_t* out;
  int64_t sm_stride, idx_stride, out_stride;  // elements from one matrix (or output slot) to the next
  const uint32_t* vpos;  // [n, nv_per]
  const uint8_t* vexp;   // [n, nv_per, PAL_BLOCK]
  int64_t nv_per;
};

// Points the whole-matrix decode (a) and verbatim patch (p) arguments, either may be null, at
// slot `slot`: its matrix's planes and list, and its output.  False for an id outside
// [0, n): the slot is not written.
UW_HD bool slot_args(const SlotArgs& s, int64_t slot, PalArgs* a, PatchArgs* p) {
  const int64_t e = s.ids[slot];
  if (e < 0 || e >= s.n) return false;
  const uint8_t* sm = s.sm + e * s.sm_stride;
  uint16_t* out = s.out + slot * s.out_stride;
  if (a) {
    a->sm = sm;
    a->idx = s.idx + e * s.idx_stride;
    a->out = out;
  }
  if (p) {
    p->sm = sm;
    p->out = out;
    p->vpos = s.vpos + e * s.nv_per;
    p->vexp = s.vexp + e * s.nv_per * PAL_BLOCK;
    p->nv = s.nv_per;
  }
  return true;
}

// Thread t's whole-matrix decode by the slot kernel's body `kind` (SlotPlan::kind: 0 / 1 VEC8
// without / with vector access, 2 / 3 wide with general / paired tables); the kernels pass it
// as a template constant, so the choice folds away there.
UW_HD bool slot_decode_body(int kind, int64_t t, const PalArgs& a) {
  return kind == 0   ? pal_decode_body<false>(t, a)
         : kind == 1 ? pal_decode_body<true>(t, a)
         : kind == 2 ? pal_decode_wide_body<false>(t, a)
                     : pal_decode_wide_body<true>(t, a);
}

// A slots decode ready to launch (slots_plan in launch.cu, which checks the arguments): slot
// 0's decode and patch arguments, the stack, the slot kernel's body (kind: slot_decode_body's)
// and one slot's threads and CTAs.
struct SlotPlan {
  PalArgs a;
  PatchArgs p;
  SlotArgs sa;
  int kind;
  int64_t total, grid;
};
const char* slots_plan(const int64_t* ids, int64_t slots, int64_t n, const uint8_t* sm, const uint8_t* idx,
                       int64_t rows, int64_t cols, const Palette& pal, const uint32_t* vpos, int64_t nv_per,
                       const uint8_t* vexp, uint16_t* out, int variant, SlotPlan* plan);

// ---------------------------------------------------------------------------------------
// Launchers (palette_decode.cu): the launch alone; launch.cu checks the arguments and
// sizes the grid first.
// ---------------------------------------------------------------------------------------
// kVec: see pal_decode_body.  `total` threads of work over `grid` CTAs.
void launch_palette_decode(const PalArgs& a, bool vec, int64_t grid, int64_t total, int32_t* err, cudaStream_t s);
// The wide variant (pal_decode_wide_body), PAL_WIDE weights per thread.
void launch_palette_decode_wide(const PalArgs& a, bool paired, int64_t grid, int64_t total, int32_t* err,
                                cudaStream_t s);
// One warp per verbatim block (p.nv > 0).
void launch_verbatim_patch(const PatchArgs& p, int32_t* err, cudaStream_t s);
// Slots (SlotPlan), grid y = slot: the decode, then (nv_per > 0) one warp per verbatim entry
// of each slot's list.  An id out of range adds 1 to *err (once per slot).
void launch_palette_decode_slots(const SlotPlan& pl, int64_t slots, int32_t* err, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
