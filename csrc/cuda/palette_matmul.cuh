// Fused palette GEMM on tensor cores: the argument block, the in-register decode and the
// CTA body, written once over the thread context of emu/ctx.cuh.  palette_matmul.cu runs
// the body as the kernel (emu::DeviceCtx) and, for CPU-only tests, through the warp
// emulator (emu::ThreadCtx).  Design and arithmetic: docs/design/gpu-kernels.md.
//
// The product is computed transposed, y^T[N, M] = W[N, K] x^T[K, M], so that W is the mma's
// A operand (16 rows of W per mma) and the batch is its n (8 columns per mma): every decoded
// weight is used by all batch rows of its n-tiles, and a batch of one wastes 7/8 of an mma
// that costs nothing next to the memory stream.
//
// Column order inside a 64-column tile.  An mma contracts over 16 k; which physical columns
// they are is free as long as A and B agree.  Lane (g = lane/4, t = lane%4) owns the 16
// physical columns [16t, 16t+16) of the tile, and mma step j (0..3) contracts over columns
// 16t + 4j + {0,1,2,3} of every lane t: the fragment's logical k = 2t, 2t+1 are the first two,
// k = 2t+8, 2t+9 the last two.  So a lane's weights of a tile row are 16 consecutive bytes of
// sign+mantissa and 8 consecutive bytes of index (one 16-byte and one 8-byte shared load),
// and its x values are 16 consecutive bf16 of one x row (two 16-byte loads): the fragments
// need no load-time permutation, and the same planes serve decode, row gather and this
// kernel.  The planes may be in file order or tile-major (kernel_plan.h pal_offset: each
// 16-row, 64-column tile contiguous), which changes only where the copies read from.
#pragma once
#include "device_util.cuh"
#include "emu/ctx.cuh"
#include "launch_util.h"  // check_plane_order
#include "pal_regs.cuh"

namespace unweight {
namespace cuda {
namespace detail {

// y = x W^T with W palette-coded: the operands the fused palette kernels share (this GEMM and
// the GEMV of palette_gemv.cuh).
struct PalProduct {
  const uint16_t* x;  // bf16 [M, ldx]
  int64_t ldx;
  int M;
  const uint8_t* sm;   // [N, K], in file order or tile-major (kernel_plan.h pal_offset)
  const uint8_t* idx;  // [N, K / 2], the same order
  int64_t N, K;
  int64_t ld_row, ld_tile;  // the planes' order (plan::pal_ld_row, pal_ld_tile), bytes of sm
  PalTables pt;  // the palette as byte-permute tables (pal_regs.cuh)
  const uint32_t* vpos;  // [nv] ascending block ids r * (K / 32) + b
  int64_t nv;
  const uint8_t* vexp;  // [nv, 32]
  // The row index of the verbatim list, or nullptr: vrow[r] (r <= N) the first entry of vpos
  // whose block is in row r or a later one (so row r's entries are [vrow[r], vrow[r + 1]) and
  // vrow[N] == nv).  With it a warp finds its rows' cursors in two dependent loads
  // (pmma_row_cursor); without it, by a search of the whole list (pmma_tile_cursors).
  const uint32_t* vrow;
  uint16_t* y;          // bf16 [M, ldy]
  int64_t ldy;

  // Offsets of sign+mantissa byte (r, k) and of index byte (r, k / 2) (k even) in the planes,
  // and the bytes of sm (of idx) a run of `cols` columns (a multiple of 64) advances.
  UW_HD int64_t sm_at(int64_t r, int64_t k) const { return plan::pal_offset(r, k, K, ld_row, ld_tile); }
  UW_HD int64_t idx_at(int64_t r, int64_t k) const {
    return static_cast<int64_t>(static_cast<uint64_t>(sm_at(r, k)) / 2);  // (unsigned: a shift)
  }
  UW_HD int64_t sm_cols(int64_t cols) const { return cols / plan::PAL_TILE_COLS * ld_tile; }
  UW_HD int64_t idx_cols(int64_t cols) const { return sm_cols(cols) / 2; }
  // Sets the planes' order (tiled: tile-major, which the launcher checked N and K allow).
  void set_order(bool tiled) {
    ld_row = plan::pal_ld_row(K, tiled);
    ld_tile = plan::pal_ld_tile(tiled);
  }
};

// Host checks of the operands both fused palette kernels share, after their own M and
// K % 64 checks: nullptr when the strides, palette, verbatim blocks and plane order are
// valid, else the error the launcher returns.
inline const char* check_pal_product(int64_t N, int64_t K, int64_t ldx, int64_t ldy, int pal_size, int64_t nv,
                                     int tiled) {
  if (const char* e = check_plane_order(N, K, tiled)) return e;
  if (ldx < K || ldx % 8 != 0) return "x row stride must be >= K and a multiple of 8";
  if (ldy < N) return "y row stride must be >= N";
  if (pal_size < 1 || pal_size > PAL_MAX_ENTRIES) return "palette must have 1..16 entries";
  if (nv < 0 || nv > N * plan::blocks_per_row(K)) return "bad verbatim block count";
  if (N * plan::blocks_per_row(K) > 0xFFFFFFFFll) return "matrix too large for uint32 block ids";
  return nullptr;
}

struct PmmaArgs : PalProduct {
  int64_t split_tiles;  // K tiles per split (gridDim.y splits)
  int chunks;           // batch chunks of PMMA_CHUNK_M rows (gridDim.x = row blocks x chunks)
  float* ws;            // fp32 [splits, M, N] when splits > 1
  int32_t* counters;    // int32 [gridDim.x], zero before and after a launch (splits > 1)
  // wgmma (set_wgmma_tile_wait, a timing probe): 1 waits for a tile's wgmmas at its end, so x's
  // slots are refilled S - 1 stages ahead; 0 lets them run under the next tile's decode (x S - 2
  // ahead).  The same wgmmas in the same order either way: the same bits.
  int wg_tile_wait;
};

// First index in sorted v[0, n) with v[i] >= key, found by G groups of 32 / G lanes, each group
// searching for its own key (uniform within the group): each round a group probes 32 / G
// evenly spaced entries and keeps the gap its key falls in, so ~log_{32/G}(n) dependent loads
// instead of log2(n), the groups sharing them.  Returns the lane's group's result.
template <int G, class Ctx>
UW_HD int64_t warp_lower_bound_groups(Ctx& c, const uint32_t* v, int64_t n, uint64_t key) {
  constexpr int W = emu::kWarpSize / G;
  const int lane = c.lane(), sl = lane % W, shift = lane - sl;
  auto count = [&](unsigned bits) {  // this group's bits of a ballot
    return popc(static_cast<unsigned>((static_cast<uint64_t>(bits) >> shift) & ((uint64_t{1} << W) - 1)));
  };
  int64_t lo = 0, hi = n;  // the answer is in [lo, hi]
  for (;;) {
    const bool more = hi - lo > W;
    if (G == 1 ? !more : c.ballot(more) == 0) break;  // G == 1: `more` is warp-uniform
    int64_t step = 0;
    bool below = false;
    if (more) {
      step = cdiv(hi - lo, W);
      int64_t p = lo + step * (sl + 1) - 1;
      p = p < hi - 1 ? p : hi - 1;
      below = static_cast<uint64_t>(v[p]) < key;
    }
    const int nb = count(c.ballot(below));
    if (more) {
      const int64_t nlo = lo + step * nb;
      const int64_t nhi = nb < W ? lo + step * (nb + 1) - 1 : hi;
      lo = nlo < hi ? nlo : hi;
      hi = nhi < hi ? nhi : hi;
    }
  }
  const int64_t p = lo + sl;
  return lo + count(c.ballot(p < hi && static_cast<uint64_t>(v[p]) < key));
}

// One key (warp-uniform), the whole warp probing 32 entries per round.
template <class Ctx>
UW_HD int64_t warp_lower_bound(Ctx& c, const uint32_t* v, int64_t n, uint64_t key) {
  return warp_lower_bound_groups<1>(c, v, n, key);
}

// Two keys at once (warp-uniform ka, kb), a half-warp each, so the two searches share their
// dependent loads (~log16(n) rounds where two warp_lower_bound calls take 2 log32(n)).
// *ra, *rb: warp_lower_bound's results for ka and kb, warp-uniform.
template <class Ctx>
UW_HD void warp_lower_bound2(Ctx& c, const uint32_t* v, int64_t n, uint64_t ka, uint64_t kb, int64_t* ra,
                             int64_t* rb) {
  const int64_t res = warp_lower_bound_groups<2>(c, v, n, c.lane() < emu::kWarpSize / 2 ? ka : kb);
  *ra = c.shfl(res, 0);
  *rb = c.shfl(res, emu::kWarpSize / 2);
}

// One stage of the warp's ring, one 64-column tile (kSub = 1): lane (g, t) copies the 16
// sign+mantissa bytes it will read of rows g and g+8 (so those need no other lane), and one
// 16-byte half row of indices (lane/2, lane%2), which lanes read across: hence the syncwarp
// after the wait.
template <class Ctx>
UW_HD void pmma_issue(Ctx& c, bool valid, unsigned char* st, const uint8_t* sm_lo, const uint8_t* sm_hi,
                      const uint8_t* ix, int w_lo, int w_hi, int w_ix) {
  if (valid) {
    c.cp_async16(st + w_lo, sm_lo);
    c.cp_async16(st + w_hi, sm_hi);
    c.cp_async16(st + w_ix, ix);
  }
  c.cp_async_commit();  // empty past the end: the group count stays uniform for wait<N>
}

// Wide stages (kSub = 2): two consecutive 64-column tiles, so that every copy instruction
// reads whole 128-byte lines of the sign+mantissa rows (4 rows per instruction, lane i
// copying the 16-byte chunk i % 8 of row i / 8) and 64-byte runs of the index rows (8 rows
// per instruction).  In shared memory a stage is sm [16][128] then idx [16][64]; the 16-byte
// chunk c of sm row r sits at chunk c ^ 4 (r & 1), and the 16-byte piece p of idx row r at
// p ^ 2 ((r >> 1) & 1), which keeps the per-tile reads (rows 128 and 64 bytes apart) free of
// bank conflicts.  `tiles`: 2, or 1 for a stage holding only its first tile (the split's
// last, when its tile count is odd); 0 issues nothing.
constexpr int kWideSmBytes = plan::PMMA_TILE_N * 2 * plan::PMMA_TILE_K;
constexpr int kWideStageBytes = 2 * plan::PMMA_TILE_BYTES;
UW_HD int wide_sm_at(int r, int c) { return r * 2 * plan::PMMA_TILE_K + 16 * (c ^ ((r & 1) << 2)); }
UW_HD int wide_ix_at(int r, int p) { return kWideSmBytes + r * plan::PMMA_TILE_K + 16 * (p ^ (((r >> 1) & 1) << 1)); }

template <class Ctx>
UW_HD void pmma_issue_wide(Ctx& c, int tiles, unsigned char* st, const uint8_t* const (&sm)[4],
                           const uint8_t* const (&ix)[2], int lane) {
  const int ch = lane & 7, pc = lane & 3;
  if (tiles > 0) {
UW_UNROLL()
    for (int i = 0; i < 4; ++i)
      if (tiles == 2 || ch < 4) c.cp_async16(st + wide_sm_at(4 * i + (lane >> 3), ch), sm[i]);
UW_UNROLL()
    for (int i = 0; i < 2; ++i)
      if (tiles == 2 || pc < 2) c.cp_async16(st + wide_ix_at(8 * i + (lane >> 2), pc), ix[i]);
  }
  c.cp_async_commit();
}

// Block index within its row of vpos[cur] when that entry lies in the row starting at block
// id rowbase (bpr blocks per row), else 0xFFFFFFFF (none left: the cursor never hits again).
UW_HD uint32_t pmma_rel(const PalProduct& a, uint32_t cur, uint64_t rowbase, uint64_t bpr) {
  if (cur >= a.nv) return 0xFFFFFFFFu;
  const uint64_t id = a.vpos[cur];
  return id >= rowbase && id < rowbase + bpr ? static_cast<uint32_t>(id - rowbase) : 0xFFFFFFFFu;
}

// Shared x (kXs): the CTA's batch rows [m0, m0 + 8 NT) of the stage's 64 columns, copied once
// per CTA into a ring of its own beside the warps' weight rings (every warp of the CTA reads
// the same x, which otherwise each warp loads again through L1 / L2: at batch 64 that is 8 KB
// of x per 1.5 KB of weights a warp streams).  Row r is 128 bytes; its 16-byte chunk c sits at
// chunk c ^ (r & 7), so the fragment reads (8 rows g, chunks 2t or 2t + 1) hit 32 distinct banks.
// Rows past M are zero-filled by the copy itself.
UW_HD int xs_at(int r, int c) { return r * plan::PMMA_X_ROW_BYTES + 16 * (c ^ (r & 7)); }

template <int kRows, class Ctx>
UW_HD void pmma_issue_x(Ctx& c, unsigned char* xst, const uint16_t* x, int64_t ldx, int m0, int M, int64_t col) {
  constexpr int kChunks = kRows * 8;  // 8 chunks of 16 bytes per 64-column row
  // A fixed number of rounds (kRows / 16, at least one): no loop inside the stage loop.
UW_UNROLL()
  for (int j = 0; j < (kChunks + plan::PMMA_THREADS - 1) / plan::PMMA_THREADS; ++j) {
    const int q = c.tid() + j * plan::PMMA_THREADS;
    if (kChunks % plan::PMMA_THREADS != 0 && q >= kChunks) break;
    const int r = q >> 3, ch = q & 7;
    const bool valid = m0 + r < M;
    // A row past M still names an address inside x (row m0): nothing is read (src-size 0).
    const uint16_t* src = x + (valid ? static_cast<int64_t>(m0 + r) : static_cast<int64_t>(m0)) * ldx + col + 8 * ch;
    c.cp_async16(xst + xs_at(r, ch), src, valid ? 16 : 0);
  }
}

// The x row whose values feed B column m of an mma: m, or past the batch (m >= M) row M - 1
// again.  An mma's output column depends on its own B column alone, so the sums of columns
// past M (never stored) change no other; the x loads stay unconditional (no predicate, branch
// or zeroing per load) and, at the bytes lane M - 1 reads, add no sectors.  Shared by the
// fused GEMM and the tensor-core GEMV.
UW_HD int pmma_x_row(int m, int M) { return m < M ? m : M - 1; }

// wgmma's B operand for one stage (x_shared == PMMA_XS_WGMMA): the CTA's batch rows
// [m0, m0 + 8 NT) of the stage's 64 columns, as four [16, 8 NT] K-major operands, one per k16
// step j of the tile, in the unswizzled canonical layout: step j's operand at j * 256 NT bytes,
// n-group ng (batch rows 8ng..8ng+7) at ng * 256 (the descriptor's sbo), k chunk kc (k 8kc..
// 8kc+7) at kc * 128 (its lbo), batch row r of the group at 16 r.  The k order is the fused
// GEMM's column order (the A fragments are decoded as for mma.sync): step j's k = 2t + e is
// column 16t + 4j + e and k = 8 + 2t + e column 16t + 4j + 2 + e (e = 0, 1), so a core-matrix
// row, 8 k of one (j, kc), gathers 4-byte pieces of x 32 bytes apart.  Copied from x as it is,
// that is 4-byte copies whose warp-wide requests touch 8 rows x 4 sectors for 128 bytes (5-6x
// the sectors of the bytes, the emulator's profile), and every CTA of the launch repeats them
// for its rows.  So the launcher first writes x once as these stage images (pmma_wg_x_body,
// into the workspace), and a stage is one bulk copy of its image (cp.async.bulk, one thread,
// completing on the stage's mbarrier): the copy engine moves the bytes, no thread addresses
// them, and they arrive through the async proxy wgmma reads B through, so no proxy fence is
// needed between the copy and the wgmmas (the mbarrier wait orders them).

// The image of batch chunk ch and K tile kt (pmma_wg_x_body) in the reordered x xw.
template <int NT, class T>
UW_HD T* pmma_wg_x_image(T* xw, int64_t n_kt, int64_t ch, int64_t kt) {
  return xw + (ch * n_kt + kt) * (8 * NT * plan::PMMA_X_ROW_BYTES / 2);
}

// The wgmma variant's x as stage images: for batch chunk ch (rows ch * PMMA_WG_CHUNK_M ..
// + 8 nt, nt = pmma_ntiles(M, wg)) and K tile kt, 8 nt x 64 bf16 in the layout above, at
// pmma_wg_x_image; a row past M is zeros (its output columns are never stored).  One thread per
// (row, tile): it loads the row's 128 bytes of the tile (word i: columns 2i, 2i + 1) and stores
// the eight 16-byte core-matrix rows (j, kc) of it, word t of (j, kc) being word 8t + 2j + kc.
// A warp's stores are four runs of 128 contiguous bytes (whole sectors); its loads are 16 bytes
// of 32 rows each (half sectors, the other half the same lane's next load, from L1).
template <int NT, class Ctx>
UW_HD void pmma_wg_x_body(Ctx& c, const uint16_t* x, int64_t ldx, int M, int64_t K, uint16_t* xw) {
  constexpr int kRows = 8 * NT;  // rows of an image
  const int64_t n_kt = K / plan::PMMA_TILE_K, chunks = plan::pmma_chunks(M, true);
  const int64_t q = c.block_x() * plan::PMMA_WG_X_THREADS + c.tid();
  if (q >= chunks * kRows * n_kt) return;
  // Launched programmatically (ops.programmatic_launch), this may start while the launch ahead
  // ends, which may still write x or read the workspace: wait, then let the GEMM start, which
  // streams its planes while the images are written and waits for them before its x copies.
  c.grid_dep_wait();
  c.grid_dep_launch();
  // (consecutive threads take consecutive rows of one tile: the stores of a warp are whole runs)
  const int64_t kt = q / (chunks * kRows), pr = q - kt * (chunks * kRows);
  const int64_t ch = pr / kRows;
  const int rr = static_cast<int>(pr - ch * kRows), ng = rr >> 3, r = rr & 7;
  const int64_t m = ch * plan::PMMA_WG_CHUNK_M + rr;
  uint32_t w[32];
  if (m < M) {
    const uint16_t* src = x + m * ldx + kt * plan::PMMA_TILE_K;
UW_UNROLL()
    for (int i = 0; i < 8; ++i) {
      uint32_t v[4];
      ld_reuse_v4(src + 8 * i, v);
      for (int e = 0; e < 4; ++e) w[4 * i + e] = v[e];
    }
  } else {
UW_UNROLL()
    for (int i = 0; i < 32; ++i) w[i] = 0u;
  }
  uint16_t* img = pmma_wg_x_image<NT>(xw, n_kt, ch, kt);
UW_UNROLL()
  for (int jk = 0; jk < 8; ++jk) {
    const uint32_t v[4] = {w[jk], w[8 + jk], w[16 + jk], w[24 + jk]};
    st_v4(img + ((jk >> 1) * NT * 256 + ng * 256 + (jk & 1) * 128 + 16 * r) / 2, v);
  }
}

// The descriptor of step j's operand in the x stage `off` bytes into the x ring, from the ring's
// own descriptor desc0: the operand's offset in 16-byte units added to the start-address field
// (bits 0-13, the address's bits 4-17; the shared window is under 256 KB, so no carry leaves the
// field): a constant add per wgmma where encoding its address costs four uniform operations.
UW_HD uint64_t pmma_x_wg_stage_desc(uint64_t desc0, uint32_t off) { return desc0 + (off >> 4); }
template <int NT>
UW_HD uint64_t pmma_x_wg_desc(uint64_t stage_desc, int j) {
  return stage_desc + static_cast<uint64_t>(j * NT * 256 / 16);
}

// Replaces the exponents of the BF16 pair `reg` with e0 (low half) and e1 (high half).
UW_HD uint32_t set_exponents(uint32_t reg, uint32_t e0, uint32_t e1) {
  return (reg & 0x807F807Fu) | ((e0 & 0xFFu) << 7) | ((e1 & 0xFFu) << 23);
}

// Row r's verbatim cursor from the row index (a.vrow; r < N): `cur` the first entry of the row
// whose block id is >= key (rowbase + the part's first block), `rel` its block within the row
// (0xFFFFFFFF: none left in the row).  Two dependent loads: the row's bounds, then the first
// PMMA_VROW_WINDOW entries at once (a row holds a few verbatim blocks, and the first part's
// key is the row's first block); a row with more entries before the key searches the rest.
UW_HD void pmma_row_cursor(const PalProduct& a, int64_t r, uint64_t rowbase, uint64_t bpr, uint64_t key,
                           uint32_t& cur, uint32_t& rel) {
  // (32-bit: entry counts and block ids fit uint32, check_pal_product)
  constexpr uint32_t W = plan::PMMA_VROW_WINDOW;
  const uint32_t base = static_cast<uint32_t>(rowbase);
  const uint32_t k32 = static_cast<uint32_t>(key), end = static_cast<uint32_t>(rowbase + bpr);
  int64_t lo64 = 0, hi64 = 0;
  vrow_bounds(a.vrow, r, a.nv, &lo64, &hi64);
  const uint32_t lo = static_cast<uint32_t>(lo64), hi = static_cast<uint32_t>(hi64), n = hi - lo;
  uint32_t e[W];
UW_UNROLL()
  for (uint32_t j = 0; j < W; ++j) e[j] = j < n ? ld_ro_u32(a.vpos + lo + j) : 0xFFFFFFFFu;
  uint32_t k = W;  // the first window entry at or past the key
UW_UNROLL()
  for (int j = static_cast<int>(W) - 1; j >= 0; --j)
    if (static_cast<uint32_t>(j) < n && e[j] >= k32) k = static_cast<uint32_t>(j);
  if (k < W) {
    cur = lo + k;
    rel = e[k] >= base && e[k] < end ? e[k] - base : 0xFFFFFFFFu;
  } else if (n > W) {
    cur = lo + W + static_cast<uint32_t>(lower_bound_u32(a.vpos + lo + W, n - W, key));
    rel = pmma_rel(a, cur, rowbase, bpr);
  } else {
    cur = hi;
    rel = 0xFFFFFFFFu;
  }
}

// A row's cursor has reached entry `cur` (rel: its block within the row; 0xFFFFFFFF, none): the
// entry's exponents and the next entry's id are asked into L1 now, so the patch that meets the
// block (pmma_patch_tile) and the cursor's move past it wait on L1, not on L2 or DRAM.  A warp
// stalls at each verbatim block it meets, and the warp that meets the most ends the launch.
UW_HD void pmma_cursor_prefetch(const PalProduct& a, uint32_t cur, uint32_t rel) {
  if (rel == 0xFFFFFFFFu) return;
  prefetch_line<true>(a.vexp + static_cast<int64_t>(cur) * PAL_BLOCK);
  if (static_cast<int64_t>(cur) + 1 < a.nv) prefetch_line<true>(a.vpos + cur + 1);
}

// The verbatim cursors of a warp's 16 rows row0.. over their blocks [b_first, b_end): lane
// i < 16 keeps row i's first entry at or past its block b_first (`rowbase`: row0 + (lane & 15)
// times bpr, the row's first block id) as `cur` and `rel` (pmma_rel; 0xFFFFFFFF: none).  With
// the row index (a.vrow) each lane reads its row's (pmma_row_cursor); without it, the range's
// two ends are searched together (warp_lower_bound2: ~log16(nv) + 1 dependent loads), then
// each lane searches that range for its row.  Shared by the fused GEMM and the tensor-core GEMV.
template <class Ctx>
UW_HD void pmma_tile_cursors(Ctx& c, const PalProduct& a, int64_t row0, uint64_t bpr, uint64_t b_first,
                             uint64_t b_end, uint64_t rowbase, uint32_t& cur, uint32_t& rel) {
  if (a.vrow != nullptr) {  // (uniform)
    const int64_t r = row0 + c.lane();
    if (c.lane() < plan::PMMA_TILE_N && r < a.N) {
      pmma_row_cursor(a, r, rowbase, bpr, rowbase + b_first, cur, rel);
      pmma_cursor_prefetch(a, cur, rel);
    }
    return;
  }
  int64_t v_lo = 0, v_hi = 0;
  warp_lower_bound2(c, a.vpos, a.nv, static_cast<uint64_t>(row0) * bpr + b_first,
                    static_cast<uint64_t>(row0 + plan::PMMA_TILE_N - 1) * bpr + b_end, &v_lo, &v_hi);
  if (c.lane() < plan::PMMA_TILE_N && v_hi > v_lo) {
    cur = static_cast<uint32_t>(v_lo + lower_bound_u32(a.vpos + v_lo, v_hi - v_lo, rowbase + b_first));
    rel = pmma_rel(a, cur, rowbase, bpr);
    pmma_cursor_prefetch(a, cur, rel);
  }
}

// The verbatim blocks of one 64-column tile of a warp's 16 rows (blocks kb, kb + 1 of each
// row; rare): lane i < 16 holds row i's cursor `cur` and `rel` (pmma_rel), so one ballot finds
// the rows with a block here; for each, the two lanes holding the block's 16-column halves load
// its exponents and patch their A registers af[mma][reg] (regs 0, 2 row g; 1, 3 row g + 8),
// and the row's cursor moves on.  Shared by the fused GEMM and the tensor-core GEMV.
template <class Ctx>
UW_HD void pmma_patch_tile(Ctx& c, const PalProduct& a, uint32_t kb, uint64_t rowbase, uint64_t bpr, uint32_t& cur,
                           uint32_t& rel, uint32_t (&af)[4][4]) {
  const int lane = c.lane(), g = lane >> 2, t = lane & 3;
  unsigned hits = c.ballot(rel - kb < 2u);
  while (hits) {
    const int r = lowest_bit(hits);  // tile row
    const uint32_t v = c.shfl(cur, r);
    const uint32_t blk = c.shfl(rel, r) - kb;
    if ((r & 7) == g && (t >> 1) == static_cast<int>(blk)) {
      // This lane's 16 columns of the block: exponents 16 (t & 1) .. +16 of the entry.
      uint32_t e[4];
      // (through L1, where pmma_cursor_prefetch asked for the entry's line)
      ld_reuse_v4(reinterpret_cast<const uint16_t*>(a.vexp + static_cast<int64_t>(v) * PAL_BLOCK + 16 * (t & 1)), e);
      const bool upper = r >= 8;  // row g + 8: registers 1, 3 (constant indices keep af in registers)
UW_UNROLL()
      for (int j = 0; j < 4; ++j) {
        const uint32_t p0 = set_exponents(upper ? af[j][1] : af[j][0], e[j], e[j] >> 8);
        const uint32_t p1 = set_exponents(upper ? af[j][3] : af[j][2], e[j] >> 16, e[j] >> 24);
        af[j][0] = upper ? af[j][0] : p0;
        af[j][1] = upper ? p0 : af[j][1];
        af[j][2] = upper ? af[j][2] : p1;
        af[j][3] = upper ? p1 : af[j][3];
      }
    }
    if (lane == r) {
      rel = pmma_rel(a, ++cur, rowbase, bpr);  // (an L1 hit: prefetched when the cursor reached the last one)
      pmma_cursor_prefetch(a, cur, rel);
    }
    hits = c.ballot(rel - kb < 2u);
  }
}

// One CTA: PMMA_WARPS row tiles x one K split x one chunk of NT n-tiles of 8 batch rows.
// kSub: 64-column tiles per stage of the cp.async ring (1, or 2 for wide stages).  kXs: x
// staged in shared memory once per CTA (one-tile stages only): 1 (pmma_issue_x) for the
// mma.sync fragments, the same mma sequence on the same values, so the same bits;
// PMMA_XS_WGMMA (x as stage images from the launcher, a bulk copy each; sm_90a) for wgmma.
//
// wgmma (kXs == PMMA_XS_WGMMA).  The CTA's four warps are one warpgroup and its 64 rows one
// m64 tile: per 64-column tile each warp decodes its 16 rows into the same A fragments as for
// mma.sync (the m16n8k16 A layout is wgmma's per-warp A layout), and the warpgroup issues one
// wgmma m64n(8 NT)k16 per k16 step with B, the stage's x, read by the tensor cores from shared
// memory: no x fragment loads, four instructions per tile for any batch, and up to 16 n-tiles
// (128 batch rows) per CTA, so each weight is decoded once per 128 rows of a large batch.  Its
// accumulators are laid out as the mma.sync ones (acc[nt][e]), so the epilogue and split fix-up
// are shared.  Per stage: each thread's weight copies land (wait), the barrier (which also
// votes whether a row of the tile has a verbatim block), thread 0 starts the bulk copy of x
// into the slot of the tile two back, then per k16 step the wait for the group that last read
// the step's A registers, the step's decode, (step 0) the wait for this stage's x on its
// mbarrier, and fence, wgmma, commit: a step's decode runs under the three wgmmas before it,
// the previous tile's included.  (a.wg_tile_wait, a timing probe: each tile also waits for its
// own wgmmas, and x is refilled a stage further ahead.)  The sums are a tensor core's per k16
// step in the mma.sync variant's order; the emulator gives both variants the same bits, the
// hardware may round inside a step differently.
template <int NT, bool kPaired, int kSub, int kXs, class Ctx>
UW_HD void pmma_body(Ctx& c, const PmmaArgs& a) {
  static_assert(kSub == 1 || kSub == 2, "a stage holds one or two tiles");
  static_assert(!kXs || kSub == 1, "shared x goes with one-tile stages");
  constexpr bool kWg = kXs == plan::PMMA_XS_WGMMA;
  static_assert(NT <= 8 || kWg, "16 n-tiles: the wgmma variant only");
  constexpr int S = plan::pmma_stages(kXs, NT), TK = plan::PMMA_TILE_K;
  constexpr int kStageBytes = kSub * plan::PMMA_TILE_BYTES;
  constexpr int kXStageBytes = kXs ? 8 * NT * plan::PMMA_X_ROW_BYTES : 0;
  const int lane = c.lane(), warp = c.warp(), g = lane >> 2, t = lane & 3;
  // The chunks of one row block are neighbours in launch order: they stream the same weight
  // tiles at about the same time, so all but the first read them from L2.
  const int64_t bx = c.block_x(), split = c.block_y();
  const int64_t rb = bx / a.chunks;
  const int m0 = static_cast<int>(bx % a.chunks) * 8 * NT;  // first batch row of the CTA (chunks > 1: NT full)
  const int64_t row0 = rb * plan::PMMA_ROWS + warp * plan::PMMA_TILE_N;
  const int64_t n_kt = a.K / TK, kt0 = split * a.split_tiles;
  const int64_t kt1 = kt0 + a.split_tiles < n_kt ? kt0 + a.split_tiles : n_kt;
  const bool active = row0 < a.N;  // warp-uniform
  // With shared x every warp takes part in every stage (its CTA barriers and x copies); a warp
  // past N streams row N-1 again and stores nothing.
  const int ntiles = (kXs || active) && kt1 > kt0 ? static_cast<int>(kt1 - kt0) : 0;
  const int nstages = (ntiles + kSub - 1) / kSub;
  unsigned char* ring = c.smem() + warp * S * kStageBytes;
  unsigned char* xring = c.smem() + plan::PMMA_WARPS * S * kStageBytes;  // kXs: S stages of x

  // Rows past N (the last tile) load row N-1 again: valid memory, results never stored.
  // Pointers (issue side) and offsets (read side) advance by a stage per step: the loop body
  // keeps 64-bit arithmetic to a few pointer increments.
  const int64_t last = a.N - 1;
  const int64_t r_lo = row0 + g < last ? row0 + g : last, r_hi = row0 + g + 8 < last ? row0 + g + 8 : last;
  const int64_t r_ix = row0 + (lane >> 1) < last ? row0 + (lane >> 1) : last;
  // kSub = 1: this lane's three copies per stage, and where they land.
  const uint8_t* q_lo = a.sm + a.sm_at(r_lo, kt0 * TK + 16 * t);
  const uint8_t* q_hi = a.sm + a.sm_at(r_hi, kt0 * TK + 16 * t);
  const uint8_t* q_ix = a.idx + a.idx_at(r_ix, kt0 * TK + 32 * (lane & 1));
  const int d_sm = static_cast<int>(a.sm_cols(TK)), d_ix = static_cast<int>(a.idx_cols(TK));  // a tile's advance
  const int w_lo = g * TK + 16 * t, w_hi = (g + 8) * TK + 16 * t;
  const int w_ix = plan::PMMA_SM_BYTES + (lane >> 1) * (TK / 2) + 16 * (lane & 1);
  // kSub = 2: four sign+mantissa rows and two index rows per lane (pmma_issue_wide).
  const uint8_t* qs[4];
  const uint8_t* qi[2];
UW_UNROLL()
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + 4 * i + (lane >> 3) < last ? row0 + 4 * i + (lane >> 3) : last;
    qs[i] = a.sm + a.sm_at(r, kt0 * TK + 16 * (lane & 7));
  }
UW_UNROLL()
  for (int i = 0; i < 2; ++i) {
    const int64_t r = row0 + 8 * i + (lane >> 2) < last ? row0 + 8 * i + (lane >> 2) : last;
    qi[i] = a.idx + a.idx_at(r, kt0 * TK + 32 * (lane & 3));
  }
  // kWg: x arrives as stage images (a.x: pmma_wg_x_body), one bulk copy per stage by thread 0,
  // completing on the stage's mbarrier (after the fix-up flag); the k-th use of a stage waits on
  // parity k & 1.
  uint64_t* const xbars = reinterpret_cast<uint64_t*>(xring + S * kXStageBytes + 16);
  const uint16_t* const ximg = kWg ? pmma_wg_x_image<NT>(a.x, n_kt, m0 / (8 * NT), kt0) : nullptr;  // (m0: chunk)
  if constexpr (kWg) {
    if (c.tid() == 0) {
UW_UNROLL()
      for (int j = 0; j < S; ++j) c.mbar_init(xbars + j, 1);
      c.mbar_init_fence();
    }
    c.syncthreads();  // (the barriers are initialised before any thread arrives or waits)
  }
  const uint64_t xdesc0 = kWg ? emu::wgmma_desc(c.smem_addr(xring), 128, 256) : 0;  // (pmma_x_wg_desc)
  // kWg: x of `stage` into x slot `slot` (thread 0; the slot's wgmmas are retired, see below).
  // xlag: the stages x's lead is short of the weights' (1 when a tile's wgmmas may still run
  // after the next stage barrier: the slot they read is refilled a stage later).
  const int xlag = kWg && !a.wg_tile_wait ? 1 : 0;
  auto issue_x = [&](int stage, int slot) {
    if (kWg && stage < ntiles && c.tid() == 0) {
      c.mbar_arrive_expect_tx(xbars + slot, kXStageBytes);
      c.bulk_copy(xring + slot * kXStageBytes, ximg + static_cast<int64_t>(stage) * (kXStageBytes / 2), kXStageBytes,
                  xbars + slot);
    }
  };
  auto issue = [&](int stage, int slot) {  // slot: the ring stage it fills
    unsigned char* st = ring + slot * kStageBytes;
    if (kXs && !kWg && stage < ntiles)  // before pmma_issue's commit: the same group as the weights
      pmma_issue_x<8 * NT>(c, xring + slot * kXStageBytes, a.x, a.ldx, m0, a.M, (kt0 + stage) * TK);
    if (kSub == 1) {
      pmma_issue(c, stage < ntiles, st, q_lo, q_hi, q_ix, w_lo, w_hi, w_ix);
      q_lo += d_sm;
      q_hi += d_sm;
      q_ix += d_ix;
    } else {
      const int left = ntiles - 2 * stage;
      pmma_issue_wide(c, left >= 2 ? 2 : (left > 0 ? left : 0), st, qs, qi, lane);
UW_UNROLL()
      for (int i = 0; i < 4; ++i) qs[i] += 2 * d_sm;
UW_UNROLL()
      for (int i = 0; i < 2; ++i) qi[i] += 2 * d_ix;
    }
  };
UW_UNROLL()
  for (int i = 0; i < S - 1; ++i) issue(i, i);

  // x rows of this lane's n-tile columns (B fragment: n = g; pmma_x_row): one pointer (the
  // chunk's first row) advances, and n-tile nt is row offset xo[nt] from it (32-bit offsets,
  // check_pmma bounds ldx, keep the 8-tile kernel in registers).
  const uint16_t* xp = a.x + m0 * a.ldx + kt0 * TK + 16 * t;
  int xo[NT];
UW_UNROLL()
  for (int nt = 0; nt < NT; ++nt)
    xo[nt] = static_cast<int>((pmma_x_row(m0 + nt * 8 + g, a.M) - m0) * a.ldx);

  // Verbatim blocks: lane i < 16 follows row row0 + i with a cursor into vpos (its first
  // entry at or after the tile being processed); `rel` is that entry's block index within
  // the row (0xFFFFFFFF: none left in the row), so a tile's test is one subtract and compare.
  // Block ids fit in 32 bits (the launcher checks N * K / 32 < 2^32).
  const uint64_t bpr = static_cast<uint64_t>(a.K / PAL_BLOCK);
  const uint64_t rowbase = static_cast<uint64_t>(row0 + (lane & 15)) * bpr;
  uint32_t cur = 0, rel = 0xFFFFFFFFu;
  if (a.nv > 0 && ntiles > 0)
    pmma_tile_cursors(c, a, row0, bpr, static_cast<uint64_t>(2 * kt0), static_cast<uint64_t>(2 * kt1), rowbase, cur,
                      rel);

  if constexpr (kWg) {
    // Launched programmatically under the x reorder (launch_pmma), the CTA has so far touched
    // only its planes and verbatim lists; x's images, the workspace, the counters and y wait for
    // the launches ahead.  Then the next launch may start (this one's writes race with nothing
    // it reads early: its own planes).
    c.grid_dep_wait();
    c.grid_dep_launch();
    for (int i = 0; i < S - 1 - xlag; ++i) issue_x(i, i);
  }

  float acc[NT][4];
UW_UNROLL()
  for (int nt = 0; nt < NT; ++nt)
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  const PalTables pt = lane_tables<(NT <= 4)>(c, a.pt);  // (8 n-tiles: at the register cap)

  // Read offsets of this lane's weights in a stage, per tile u of the stage: sign+mantissa
  // of rows g, g+8 (16 bytes each) and indices of rows g, g+8 (8 bytes each).
  int r_sm_lo[kSub], r_sm_hi[kSub], r_n_lo[kSub], r_n_hi[kSub];
UW_UNROLL()
  for (int u = 0; u < kSub; ++u) {
    if (kSub == 1) {
      r_sm_lo[u] = w_lo;
      r_sm_hi[u] = w_hi;
      r_n_lo[u] = plan::PMMA_SM_BYTES + g * (TK / 2) + 8 * t;
      r_n_hi[u] = r_n_lo[u] + 8 * (TK / 2);
    } else {
      r_sm_lo[u] = wide_sm_at(g, 4 * u + t);
      r_sm_hi[u] = wide_sm_at(g + 8, 4 * u + t);
      r_n_lo[u] = wide_ix_at(g, 2 * u + (t >> 1)) + 8 * (t & 1);
      r_n_hi[u] = wide_ix_at(g + 8, 2 * u + (t >> 1)) + 8 * (t & 1);
    }
  }

  int rd = 0, wr = S - 1;                        // ring stage being read / refilled
  uint32_t kb = static_cast<uint32_t>(2 * kt0);  // first block of the tile within its row
  for (int i = 0; i < nstages; ++i) {
    uint32_t xb[NT][4];  // x[nt*8+g][col + 16t .. +8): B registers of steps 0, 1 (then 2, 3)
    if (!kXs) {
UW_UNROLL()
      for (int nt = 0; nt < NT; ++nt) ld_reuse_v4(xp + xo[nt], xb[nt]);
    }
    c.template cp_async_wait<S - 2>();
    bool vtile = false;  // kWg: a row of the CTA's tile has a verbatim block (CTA-uniform)
    if (kWg) {
      // Every thread's weight copies of this stage are in, and its reads of the weight stage
      // refilled below are done; the vote makes the verbatim test one for the warpgroup.
      vtile = c.syncthreads_or(a.nv > 0 && rel - kb < 2u);
    } else if (kXs) {
      c.syncthreads();  // every thread's copies of this stage (weights and x) are in; the stage refilled below is read
    } else {
      c.syncwarp();  // other lanes' copies of this stage are in; their reads of the stage refilled below are done
    }
    issue(i + S - 1, wr);
    // kWg: x into the slot of tile i - 1 - xlag, whose wgmmas every warp retired before this
    // barrier (by default tile i - 1's may still be running, so its slot waits a stage).
    if (kWg) issue_x(i + S - 1 - xlag, xlag == 0 ? wr : (wr == 0 ? S - 1 : wr - 1));
    wr = wr + 1 == S ? 0 : wr + 1;
    const int rslot = rd;  // (the stage read below)
    const unsigned char* xst = xring + rd * kXStageBytes;
    if (kXs && !kWg) {
UW_UNROLL()
      for (int nt = 0; nt < NT; ++nt) c.lds_v4(xst + xs_at(8 * nt + g, 2 * t), xb[nt]);
    }
    const unsigned char* st = ring + rd * kStageBytes;
    rd = rd + 1 == S ? 0 : rd + 1;
UW_UNROLL()
    for (int u = 0; u < kSub; ++u) {
      if (u > 0) {
        if (kSub * i + u >= ntiles) break;  // warp-uniform: the split's odd last tile
UW_UNROLL()
        for (int nt = 0; nt < NT; ++nt) ld_reuse_v4(xp + xo[nt], xb[nt]);
      }
      uint32_t s_lo[4], s_hi[4], n_lo[2], n_hi[2];
      c.lds_v4(st + r_sm_lo[u], s_lo);
      c.lds_v4(st + r_sm_hi[u], s_hi);
      c.lds_v2(st + r_n_lo[u], n_lo);
      c.lds_v2(st + r_n_hi[u], n_hi);
      uint32_t af[4][4];  // [step][A register]: regs 0, 2 row g; 1, 3 row g + 8
      auto decode = [&](int j) {
        const int sh = 16 * (j & 1);
        pal_decode4<kPaired>(s_lo[j], n_lo[j >> 1] >> sh, pt, af[j][0], af[j][2]);
        pal_decode4<kPaired>(s_hi[j], n_hi[j >> 1] >> sh, pt, af[j][1], af[j][3]);
      };
      if constexpr (kWg) {
        // One commit group per k16 step, and each step's A registers rewritten only once the
        // group that last read them (the previous tile's same step, four groups back) retired:
        // step j's decode overlaps the wgmmas of steps j - 3 .. j - 1, across the tile boundary.
        // A tile with a verbatim block (vtile: rare) is decoded and patched whole first.  The
        // waits and wgmmas sit on paths the whole warpgroup takes (.sync.aligned).
        const uint64_t xd = pmma_x_wg_stage_desc(xdesc0, static_cast<uint32_t>(rslot * kXStageBytes));
        auto mma = [&](int j) {
          if (j == 0) c.mbar_wait(xbars + rslot, static_cast<unsigned>(i / S) & 1u);  // x is in
          c.wgmma_fence();  // (af[j] was just written; acc is only the wgmmas' own, or zeroed)
          c.template wgmma<8 * NT>(acc, af[j], pmma_x_wg_desc<NT>(xd, j), true);
          c.wgmma_commit();
        };
        if (vtile) {
          c.template wgmma_wait<0>(acc);
UW_UNROLL()
          for (int j = 0; j < 4; ++j) decode(j);
          pmma_patch_tile(c, a, kb, rowbase, bpr, cur, rel, af);
UW_UNROLL()
          for (int j = 0; j < 4; ++j) mma(j);
        } else {
UW_UNROLL()
          for (int j = 0; j < 4; ++j) {
            c.template wgmma_wait<3>(acc);
            decode(j);
            mma(j);
          }
        }
        if (a.wg_tile_wait) c.template wgmma_wait<0>(acc);
      } else {
UW_UNROLL()
        for (int j = 0; j < 4; ++j) decode(j);
        if (a.nv > 0) {  // rare: a row of this tile has a verbatim block here
          pmma_patch_tile(c, a, kb, rowbase, bpr, cur, rel, af);
        }
UW_UNROLL()
        for (int j = 0; j < 4; ++j) {
          if (j == 2) {  // second half of the lane's 16 columns: x loaded late keeps NT = 8 in registers
            if (kXs) {
UW_UNROLL()
              for (int nt = 0; nt < NT; ++nt) c.lds_v4(xst + xs_at(8 * nt + g, 2 * t + 1), xb[nt]);
            } else {
UW_UNROLL()
              for (int nt = 0; nt < NT; ++nt) ld_reuse_v4(xp + xo[nt] + 8, xb[nt]);
            }
          }
UW_UNROLL()
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t b[2] = {xb[nt][2 * (j & 1)], xb[nt][2 * (j & 1) + 1]};
            c.mma_bf16_16816(acc[nt], af[j], b, acc[nt]);
          }
        }
      }
      xp += TK;
      kb += 2;
    }
  }
  c.template cp_async_wait<0>();
  if constexpr (kWg) c.template wgmma_wait<0>(acc);  // (the last tile's groups)

  // Epilogue.  acc[nt][e]: W row row0 + g (+8 for e >= 2), batch row nt*8 + 2t + (e & 1).
  const int64_t splits = c.grid_y();
  if (splits == 1) {
    if (active) {
UW_UNROLL()
      for (int nt = 0; nt < NT; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int m = m0 + nt * 8 + 2 * t + (e & 1);
          const int64_t r = row0 + g + (e >> 1) * 8;
          if (m < a.M && r < a.N) a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(acc[nt][e]));
        }
    }
    return;
  }
  if (active) {
UW_UNROLL()
    for (int nt = 0; nt < NT; ++nt)
      for (int e = 0; e < 4; ++e) {
        const int m = m0 + nt * 8 + 2 * t + (e & 1);
        const int64_t r = row0 + g + (e >> 1) * 8;
        if (m < a.M && r < a.N) c.st_grid(a.ws + (split * a.M + m) * a.N + r, acc[nt][e]);
      }
  }
  // Serial split-K fix-up: the last CTA of this row block to arrive sums the partials in
  // split order (deterministic whichever CTA it is) and resets the counter for the next launch.
  c.threadfence();
  c.syncthreads();
  int* last_flag = reinterpret_cast<int*>(c.smem() + plan::PMMA_WARPS * S * kStageBytes + S * kXStageBytes);
  if (c.tid() == 0) {
    const int is_last = c.atomic_add(a.counters + bx, 1) == splits - 1;
    if (is_last) a.counters[bx] = 0;
    c.sts(last_flag, is_last);
  }
  c.syncthreads();
  if (!c.lds(last_flag) || !active) return;
  c.threadfence();
  // Each output is 0 + p_0 + p_1 + ... in split order.  The loads of kU splits of all the
  // lane's 4 NG outputs go out together (32 in flight), then their adds: a lane waits out
  // splits / kU L2 round trips, where one loop per output waited out about 4 NT splits / 4.
  // NG: n-tiles per pass (16 n-tiles take two passes, which keeps their sums in registers).
  constexpr int NG = NT > 8 ? 8 : NT;
  constexpr int kU = NG >= 8 ? 1 : 8 / NG;
  const int64_t split_elems = static_cast<int64_t>(a.M) * a.N;
UW_UNROLL(1)
  for (int g0 = 0; g0 < NT; g0 += NG) {
    const float* base = a.ws + static_cast<int64_t>(m0 + 8 * g0 + 2 * t) * a.N + row0 + g;
    float sum[NG][4];
    bool take[NG][4];
UW_UNROLL()
    for (int nt = 0; nt < NG; ++nt)
UW_UNROLL()
      for (int e = 0; e < 4; ++e) {
        sum[nt][e] = 0.f;
        take[nt][e] = m0 + (g0 + nt) * 8 + 2 * t + (e & 1) < a.M && row0 + g + (e >> 1) * 8 < a.N;
      }
    for (int64_t s0 = 0; s0 < splits; s0 += kU) {
      float p[kU][NG][4];
UW_UNROLL()
      for (int u = 0; u < kU; ++u)
UW_UNROLL()
        for (int nt = 0; nt < NG; ++nt)
UW_UNROLL()
          for (int e = 0; e < 4; ++e) {
            // Past the last split: that split's word again, never added (keeps every load of
            // the group under one predicate, which lets the compiler issue them all first).
            const int64_t su = s0 + u < splits ? s0 + u : splits - 1;
            const int64_t at = su * split_elems + static_cast<int64_t>(nt * 8 + (e & 1)) * a.N + (e >> 1) * 8;
            p[u][nt][e] = take[nt][e] ? c.ld_grid(base + at) : 0.f;
          }
UW_UNROLL()
      for (int u = 0; u < kU; ++u)
        if (s0 + u < splits)  // (never add a missing split's 0: -0 + 0 is +0)
UW_UNROLL()
          for (int nt = 0; nt < NG; ++nt)
UW_UNROLL()
            for (int e = 0; e < 4; ++e) sum[nt][e] += p[u][nt][e];
    }
UW_UNROLL()
    for (int nt = 0; nt < NG; ++nt)
UW_UNROLL()
      for (int e = 0; e < 4; ++e)
        if (take[nt][e]) {
          const int m = m0 + (g0 + nt) * 8 + 2 * t + (e & 1);
          const int64_t r = row0 + g + (e >> 1) * 8;
          a.y[m * a.ldy + r] = bf16_round_bits(bits_from_f32(sum[nt][e]));
        }
  }
}

// Launchers of the kernel instantiations (palette_matmul.cu).
template <int NT, bool kPaired, int kSub, int kXs>
void launch_pmma(const PmmaArgs& a, int64_t splits, cudaStream_t s);

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
