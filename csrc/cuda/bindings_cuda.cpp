// pybind11 module unweight._cuda: argument checks and conversions only; the kernels and
// their launchers are in the *.cu files beside it (host API in kernels.cuh, no CUDA types).
//
// Device buffers arrive as integers (torch.Tensor.data_ptr()) and the stream as an integer
// (torch.cuda.current_stream().cuda_stream), so this module has no libtorch ABI dependency
// and works with any torch build.  Launch errors raise RuntimeError with the CUDA error
// string; data errors are counted into the caller's int32 `err` device counter.
//
// The emulate_* functions run the kernels' bodies on the host over NumPy arrays (see
// kernels.cuh), and plan_* expose kernel_plan.h so tests can compare the Python mirror.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../decode_primitives.h"
#include "emu/fiber.h"
#include "emu/global_bounds.h"
#include "emu/host_buffer.h"
#include "emu/selftest.h"
#include "kernel_plan.h"
#include "kernels.cuh"

namespace py = pybind11;
using namespace unweight;
using unweight::cuda::Palette;

namespace {

template <class T>
using arr = py::array_t<T, py::array::c_style>;

template <class T>
T* dev(uintptr_t p) { return reinterpret_cast<T*>(p); }
void* stream_of(uintptr_t s) { return reinterpret_cast<void*>(s); }

void check(const char* err) {
  if (err) throw std::runtime_error(std::string("unweight._cuda: ") + err);
}

void need(bool ok, const char* what) {
  if (!ok) throw py::value_error(what);
}

// The emulated fused kernels' operands: shapes checked, and each plane copied into a host
// buffer aligned as a device buffer would be (emu/host_buffer.h; numpy's need not be).
struct AlignedCopy {
  emu::HostBuffer buf;
  unsigned char* p;
  size_t n;
  // (the bound also tells the compiler the copy's size is an object's)
  AlignedCopy(const void* src, size_t bytes) : buf(bytes), p(buf.data()), n(bytes) {
    if (bytes > (SIZE_MAX >> 2)) throw std::length_error("array too large to copy");
    std::memcpy(p, src, bytes);
  }
};
struct EmuOperands {
  int M;
  int64_t N, K, nv;
  AlignedCopy x, sm, idx, vexp;
  EmuOperands(const arr<uint16_t>& x_, const arr<uint8_t>& sm_, const arr<uint8_t>& idx_, const arr<uint32_t>& vpos,
              const arr<uint8_t>& vexp_)
      : M(static_cast<int>(x_.shape(0))), N(sm_.shape(0)), K(sm_.shape(1)), nv(vpos.size()),
        x(x_.data(), x_.nbytes()), sm(sm_.data(), sm_.nbytes()), idx(idx_.data(), idx_.nbytes()),
        vexp(vexp_.data(), vexp_.nbytes()) {}
  const uint16_t* x16() const { return reinterpret_cast<const uint16_t*>(x.p); }
};
void check_emu_operands(const arr<uint16_t>& x, const arr<uint8_t>& sm, const arr<uint8_t>& idx,
                        const arr<uint32_t>& vpos, const arr<uint8_t>& vexp) {
  need(x.ndim() == 2 && sm.ndim() == 2, "x and sm must be 2-D");
  need(x.shape(1) == sm.shape(1), "x width must equal K");
  need(idx.size() == sm.shape(0) * ((sm.shape(1) + 1) / 2), "idx size mismatch");
  need(vexp.size() == vpos.size() * PAL_BLOCK, "vexp size mismatch");
}

// An emulated kernel's optional verbatim row index: None, or uint32 [count] (ops.verbatim_rows).
struct RowIndex {
  arr<uint32_t> a;
  const uint32_t* p = nullptr;
  size_t bytes = 0;
  RowIndex(const py::object& o, int64_t count) {
    if (o.is_none()) return;
    a = py::cast<arr<uint32_t>>(o);
    need(a.size() == count, "vrow must hold rows + 1 uint32 entries per matrix");
    p = a.data();
    bytes = a.nbytes();
  }
};

// Palette from its exponent bytes (1..16 of them, Python bytes / bytearray / uint8 array).
Palette make_palette(const py::bytes& b) {
  const std::string s = b;
  need(!s.empty() && s.size() <= static_cast<size_t>(PAL_MAX_ENTRIES), "palette must have 1..16 entries");
  Palette p{};
  for (size_t i = 0; i < s.size(); ++i)
    p.w[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(s[i])) << (8 * (i % 4));
  p.size = static_cast<int>(s.size());
  return p;
}

// An emulated palette GEMV: the operands checked and copied, y [M, N] allocated, then
// launch(o, pal, vpos, vrow, y) emulates the kernel with the GIL released and the launch's global
// buffers (the planes, x, y) bounded; y uint16 (bf16 bits) [M, N].
// after_wait: the kernel waits on the launches ahead of it (programmatic dependent launch)
// before it touches x and y, which the emulator then checks (and `extra`, more such buffers).
template <class F>
arr<uint16_t> emulate_gemv_like(const arr<uint16_t>& x, const arr<uint8_t>& sm, const arr<uint8_t>& idx,
                                const py::bytes& palette, const arr<uint32_t>& vpos, const arr<uint8_t>& vexp,
                                const py::object& vrow, bool after_wait,
                                std::vector<std::pair<const void*, size_t>> extra, F&& launch) {
  check_emu_operands(x, sm, idx, vpos, vexp);
  const EmuOperands o(x, sm, idx, vpos, vexp);
  const RowIndex vr(vrow, o.N + 1);
  arr<uint16_t> y({static_cast<int64_t>(o.M), o.N});
  const Palette pal = make_palette(palette);
  uint16_t* yp = y.mutable_data();
  const char* e;
  const std::pair<const void*, size_t> vb{vpos.data(), vpos.nbytes()}, yb{yp, y.nbytes()};
  {
    py::gil_scoped_release nogil;
    // (a read past any of these fails the emulated launch)
    emu::GlobalBounds bounds{{o.sm.p, o.sm.n}, {o.idx.p, o.idx.n}, {o.vexp.p, o.vexp.n}, vb, {vr.p, vr.bytes}};
    for (const auto& [p, n] : {std::pair<const void*, size_t>{o.x.p, o.x.n}, yb}) {
      if (after_wait) bounds.after_wait(p, n);
      else bounds.add(p, n);
    }
    for (const auto& [p, n] : extra) bounds.after_wait(p, n);
    e = launch(o, pal, vpos.data(), vr.p, yp);
  }
  check(e);
  return y;
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "unweight CUDA kernels (format v1): raw device pointers + stream, no libtorch ABI";

  m.def("device_count", &cuda::device_count, "Visible CUDA devices (0 without driver/device).");
  m.def("compiled_archs", []() {
    std::vector<int> out;
    std::string s = cuda::compiled_archs();
    size_t i = 0;
    while (i < s.size()) {
      size_t j = s.find(',', i);
      if (j == std::string::npos) j = s.size();
      if (j > i) out.push_back(std::stoi(s.substr(i, j - i)));
      i = j + 1;
    }
    return out;
  }, "SM targets with device code in this build, e.g. [800, 900].");

  // --------------------------------------------------------------------- launch geometry
  m.attr("HUFF_THREADS") = plan::HUFF_THREADS;
  m.attr("HUFF_VARIANT_DEFAULT") = plan::HUFF_VARIANT_DEFAULT;
  m.attr("HUFF_VARIANT_CHAIN") = plan::HUFF_VARIANT_CHAIN;
  m.attr("HUFF_VARIANT_AHEAD") = plan::HUFF_VARIANT_AHEAD;
  m.attr("HUFF_VARIANT_AHEAD2") = plan::HUFF_VARIANT_AHEAD2;
  m.attr("HUFF_VARIANT_SCALAR") = plan::HUFF_VARIANT_SCALAR;
  m.attr("HUFF_VARIANT_RING") = plan::HUFF_VARIANT_RING;
  m.attr("HUFF_RING_SLOTS") = plan::HUFF_RING_SLOTS;
  m.attr("HUFF_VARIANT_RING_WIDE") = plan::HUFF_VARIANT_RING_WIDE;
  m.attr("HUFF_RING_WIDE_THREADS") = plan::HUFF_RING_WIDE_THREADS;
  m.attr("HUFF_VARIANT_RING_MAX") = plan::HUFF_VARIANT_RING_MAX;
  m.attr("HUFF_RING_MAX_THREADS") = plan::HUFF_RING_MAX_THREADS;
  m.attr("HUFF_RING_MAX_CTAS_PER_SM") = plan::HUFF_RING_MAX_CTAS_PER_SM;
  m.attr("HUFF_VARIANT_PAIR") = plan::HUFF_VARIANT_PAIR;
  m.attr("HUFF_PAIR_BITS") = plan::HUFF_PAIR_BITS;
  m.attr("HUFF_PAIR_THREADS") = plan::HUFF_PAIR_THREADS;
  m.attr("HUFF_PAIR_CTAS_PER_SM") = plan::HUFF_PAIR_CTAS_PER_SM;
  m.attr("HUFF_DEFAULT_VARIANT") = plan::HUFF_DEFAULT_VARIANT;
  m.attr("PAL_TILE_ROWS") = plan::PAL_TILE_ROWS;
  m.attr("PAL_TILE_COLS") = plan::PAL_TILE_COLS;
  m.attr("PAL_VEC") = plan::PAL_VEC;
  m.attr("PAL_WIDE") = plan::PAL_WIDE;
  m.attr("PAL_WIDE_STEPS") = plan::PAL_WIDE_STEPS;
  m.attr("PAL_VARIANT_DEFAULT") = plan::PAL_VARIANT_DEFAULT;
  m.attr("PAL_VARIANT_VEC8") = plan::PAL_VARIANT_VEC8;
  m.attr("PAL_VARIANT_WIDE") = plan::PAL_VARIANT_WIDE;
  m.attr("PAL_DEFAULT_VARIANT") = plan::PAL_DEFAULT_VARIANT;
  m.attr("PAL_THREADS") = plan::PAL_THREADS;
  m.attr("WARP_KERNEL_THREADS") = plan::WARP_KERNEL_THREADS;
  m.attr("ENC_THREADS") = plan::ENC_THREADS;
  m.attr("HIST_THREADS") = plan::HIST_THREADS;
  m.attr("HIST_MAX_CTAS") = plan::HIST_MAX_CTAS;
  m.attr("PREFETCH_THREADS") = plan::PREFETCH_THREADS;
  m.attr("PREFETCH_MAX_CTAS") = plan::PREFETCH_MAX_CTAS;
  m.attr("PREFETCH_MAX_RANGES") = plan::PREFETCH_MAX_RANGES;
  m.attr("PREFETCH_LINE") = plan::PREFETCH_LINE;
  m.attr("CRC_THREADS") = plan::CRC_THREADS;
  m.attr("CRC_STEPS") = plan::CRC_STEPS;
  m.attr("CRC_STRIDE_BYTES") = plan::CRC_STRIDE_BYTES;
  m.attr("CRC_PIECE_BYTES") = plan::CRC_PIECE_BYTES;
  m.attr("CRC_TABLE_WORDS") = plan::CRC_TABLE_WORDS;
  m.attr("CRC_POW_TERMS") = plan::CRC_POW_TERMS;
  m.attr("CRC_INV_TERMS") = plan::CRC_INV_TERMS;
  m.attr("CRC_MAX_CTAS") = plan::CRC_MAX_CTAS;
  m.attr("SCAN_THREADS") = plan::SCAN_THREADS;
  m.attr("PMMA_WARPS") = plan::PMMA_WARPS;
  m.attr("PMMA_THREADS") = plan::PMMA_THREADS;
  m.attr("PMMA_TILE_N") = plan::PMMA_TILE_N;
  m.attr("PMMA_VROW_WINDOW") = plan::PMMA_VROW_WINDOW;
  m.attr("PMMA_ROWS") = plan::PMMA_ROWS;
  m.attr("PMMA_TILE_K") = plan::PMMA_TILE_K;
  m.attr("PMMA_STAGES") = plan::PMMA_STAGES;
  m.attr("PMMA_TILE_BYTES") = plan::PMMA_TILE_BYTES;
  m.attr("PMMA_SMEM_BYTES") = plan::PMMA_SMEM_BYTES;
  m.attr("PMMA_SUB_WIDE") = plan::PMMA_SUB_WIDE;
  m.attr("PMMA_X_ROW_BYTES") = plan::PMMA_X_ROW_BYTES;
  m.attr("PGEMV_WARPS") = plan::PGEMV_WARPS;
  m.attr("PGEMV_THREADS") = plan::PGEMV_THREADS;
  m.attr("PGEMV_COLS") = plan::PGEMV_COLS;
  m.attr("PGEMV_UNROLL") = plan::PGEMV_UNROLL;
  m.attr("PGEMV_MAX_M") = plan::PGEMV_MAX_M;
  m.attr("PGEMV_MAX_PARTS") = plan::PGEMV_MAX_PARTS;
  m.attr("PGEMV_CTAS_PER_SM") = plan::PGEMV_CTAS_PER_SM;
  m.attr("PGEMV_WARPS_PER_SM") = plan::PGEMV_WARPS_PER_SM;
  m.attr("PGEMV_SMEM_BYTES") = plan::PGEMV_SMEM_BYTES;
  m.attr("PGEMV_DEEP_UNROLL") = plan::PGEMV_DEEP_UNROLL;
  m.attr("PGEMV_DEEP_CTAS_PER_SM") = plan::PGEMV_DEEP_CTAS_PER_SM;
  m.attr("PGEMV_VARIANT_DEFAULT") = plan::PGEMV_VARIANT_DEFAULT;
  m.attr("PGEMV_VARIANT_STD") = plan::PGEMV_VARIANT_STD;
  m.attr("PGEMV_VARIANT_DEEP") = plan::PGEMV_VARIANT_DEEP;
  m.attr("PGEMV_STAGED_DEPTH") = plan::PGEMV_STAGED_DEPTH;
  m.attr("PGEMV_STAGED_SLOT") = plan::PGEMV_STAGED_SLOT;
  m.attr("PGEMV_STAGED_CTAS_PER_SM") = plan::PGEMV_STAGED_CTAS_PER_SM;
  m.attr("PGEMV_VARIANT_STAGED") = plan::PGEMV_VARIANT_STAGED;
  m.attr("PGEMV_STAGED_SMEM_BYTES") = plan::PGEMV_STAGED_SMEM_BYTES;
  m.attr("PGEMV_VARIANT_MMA") = plan::PGEMV_VARIANT_MMA;
  m.attr("PGEMV_MMA_ROWS") = plan::PGEMV_MMA_ROWS;
  m.attr("PGEMV_MMA_COLS") = plan::PGEMV_MMA_COLS;
  m.attr("PGEMV_MMA_MAX_M") = plan::PGEMV_MMA_MAX_M;
  m.attr("PGEMV_MMA_CTAS_PER_SM") = plan::PGEMV_MMA_CTAS_PER_SM;
  m.attr("PGEMV_MMA4_CTAS_PER_SM") = plan::PGEMV_MMA4_CTAS_PER_SM;
  m.attr("PGEMV_MMA4_RING_CTAS_PER_SM") = plan::PGEMV_MMA4_RING_CTAS_PER_SM;
  m.attr("PGEMV_MMA_WARPS_PER_SM") = plan::PGEMV_MMA_WARPS_PER_SM;
  m.attr("PGEMV_MMA_MIN_STEPS") = plan::PGEMV_MMA_MIN_STEPS;
  m.attr("PGEMV_MMA_SMEM_BYTES") = plan::PGEMV_MMA_SMEM_BYTES;
  m.attr("PGEMV_VARIANT_MMA_STAGED") = plan::PGEMV_VARIANT_MMA_STAGED;
  m.attr("PGEMV_MMA_STAGED_DEPTH") = plan::PGEMV_MMA_STAGED_DEPTH;
  m.attr("PGEMV_MMA_STAGED_SLOT") = plan::PGEMV_MMA_STAGED_SLOT;
  m.attr("PGEMV_MMA_STAGED_CTAS_PER_SM") = plan::PGEMV_MMA_STAGED_CTAS_PER_SM;
  m.attr("PGEMV_MMA_STAGED_SMEM_BYTES") = plan::PGEMV_MMA_STAGED_SMEM_BYTES;
  m.attr("PGEMV_VARIANT_MMA_PREFETCH") = plan::PGEMV_VARIANT_MMA_PREFETCH;
  m.attr("PGEMV_MMA_PREFETCH_STEPS") = plan::PGEMV_MMA_PREFETCH_STEPS;
  m.attr("PGEMV_VARIANT_MMA_BULK") = plan::PGEMV_VARIANT_MMA_BULK;
  m.attr("PGEMV_MMA_BULK_DEPTH") = plan::PGEMV_MMA_BULK_DEPTH;
  m.attr("PGEMV_MMA_BULK_SLOT") = plan::PGEMV_MMA_BULK_SLOT;
  m.attr("PGEMV_MMA_BULK_CTAS_PER_SM") = plan::PGEMV_MMA_BULK_CTAS_PER_SM;
  m.attr("PGEMV_MMA_BULK_SMEM_BYTES") = plan::PGEMV_MMA_BULK_SMEM_BYTES;
  m.attr("PGEMV_VARIANT_MMA_QUEUE") = plan::PGEMV_VARIANT_MMA_QUEUE;
  m.attr("PGEMV_VARIANT_MMA_SPLIT") = plan::PGEMV_VARIANT_MMA_SPLIT;
  m.attr("PAL_SPLIT_HALVES") = plan::PAL_SPLIT_HALVES;
  m.attr("PGEMV_PROBE_NO_DECODE") = plan::PGEMV_PROBE_NO_DECODE;
  m.attr("PGEMV_PROBE_STREAM") = plan::PGEMV_PROBE_STREAM;
  m.attr("PGEMV_PROBE_NO_MMA") = plan::PGEMV_PROBE_NO_MMA;
  m.attr("PGEMV_MMA_QUEUE_UNITS_PER_WARP") = plan::PGEMV_MMA_QUEUE_UNITS_PER_WARP;
  m.attr("PGEMV_MMA_QUEUE_MIN_STEPS") = plan::PGEMV_MMA_QUEUE_MIN_STEPS;
  m.attr("PGEMV_MMA_QUEUE_MAX_UNITS") = plan::PGEMV_MMA_QUEUE_MAX_UNITS;
  m.attr("PGEMV_QUEUE_HEAD") = plan::PGEMV_QUEUE_HEAD;
  m.attr("PGEMV_QUEUE_DONE") = plan::PGEMV_QUEUE_DONE;
  m.attr("PGEMV_QUEUE_TILES") = plan::PGEMV_QUEUE_TILES;
  m.attr("PMMA_CHUNK_M") = plan::PMMA_CHUNK_M;
  m.attr("PMMA_WG_CHUNK_M") = plan::PMMA_WG_CHUNK_M;
  m.attr("PMMA_XS_WGMMA") = plan::PMMA_XS_WGMMA;
  m.attr("PMMA_WG_STAGES") = plan::PMMA_WG_STAGES;
  m.attr("PMMA_WG_X_THREADS") = plan::PMMA_WG_X_THREADS;
  m.attr("PMMA_MAX_M") = plan::PMMA_MAX_M;
  m.attr("PMMA_CTAS_PER_SM") = plan::PMMA_CTAS_PER_SM;
  m.attr("PMMA_WG_CTAS_PER_SM") = plan::PMMA_WG_CTAS_PER_SM;
  m.attr("PMMA_MIN_SPLIT_TILES") = plan::PMMA_MIN_SPLIT_TILES;
  m.attr("PMMA_MAX_SPLITS") = plan::PMMA_MAX_SPLITS;
  m.def("plan_huffman_grid", &plan::huffman_grid, py::arg("n_items"), py::arg("max_ctas"),
        py::arg("threads") = plan::HUFF_THREADS);
  m.def("plan_huffman_ways", &plan::huffman_ways);
  m.def("plan_huffman_chains_per_segment", &plan::huffman_chains_per_segment);
  m.def("plan_huffman_chain", [](int64_t t, int64_t cps) {
    int64_t i, j;
    plan::huffman_chain(t, cps, &i, &j);
    return py::make_tuple(i, j);
  });
  m.def("plan_hgather_units", &plan::hgather_units);
  m.def("plan_hgather_unit", [](int64_t t, int64_t n_chunks, int64_t units) {
    int64_t id, c, u;
    plan::hgather_unit(t, n_chunks, units, &id, &c, &u);
    return py::make_tuple(id, c, u);
  });
  m.def("plan_huffman_unit", [](int64_t i, int64_t g0, int64_t c0, int64_t nsg) {
    int64_t g, c;
    plan::huffman_unit(i, g0, c0, nsg, &g, &c);
    return py::make_tuple(g, c);
  });
  m.def("plan_pal_grid", &plan::pal_grid);
  m.def("plan_pal_unit", [](int64_t t, int64_t n_cols) {
    int64_t r, k;
    int n;
    plan::pal_unit(t, n_cols, &r, &k, &n);
    return py::make_tuple(r, k, n);
  });
  m.def("plan_pal_wide_threads", &plan::pal_wide_threads);
  m.def("plan_pal_wide_grid", &plan::pal_wide_grid);
  m.def("plan_pal_wide_units", [](int64_t t, int64_t n_cols) {
    int64_t r[plan::PAL_WIDE_STEPS], k[plan::PAL_WIDE_STEPS];
    int n[plan::PAL_WIDE_STEPS];
    plan::pal_wide_units(t, n_cols, r, k, n);
    py::list out;
    for (int s = 0; s < plan::PAL_WIDE_STEPS; ++s) out.append(py::make_tuple(r[s], k[s], n[s]));
    return out;
  });
  m.def("plan_warp_grid", &plan::warp_grid);
  m.def("plan_pal_tiled_ok", &plan::pal_tiled_ok);
  m.def("plan_pal_sm_index", &plan::pal_sm_index);
  m.def("plan_pal_idx_index", &plan::pal_idx_index);
  m.def("plan_enc_grid", &plan::enc_grid);
  m.def("plan_hist_grid", &plan::hist_grid);
  m.def("plan_prefetch_grid", &plan::prefetch_grid);
  m.def("plan_crc_pieces", &plan::crc_pieces);
  m.def("plan_crc_grid", &plan::crc_grid);
  m.def("plan_pmma_ntiles", &plan::pmma_ntiles, py::arg("M"), py::arg("wg") = false);
  m.def("plan_pmma_chunks", &plan::pmma_chunks, py::arg("M"), py::arg("wg") = false);
  m.def("plan_pmma_row_blocks", &plan::pmma_row_blocks);
  m.def("plan_pmma_grid_x", &plan::pmma_grid_x, py::arg("N"), py::arg("M"), py::arg("wg") = false);
  m.def("plan_pmma_splits", &plan::pmma_splits, py::arg("N"), py::arg("K"), py::arg("num_sms"), py::arg("M"),
        py::arg("wg") = false);
  m.def("plan_pmma_split_tiles", &plan::pmma_split_tiles);
  m.def("plan_pmma_workspace_elems", &plan::pmma_workspace_elems);
  m.def("plan_pmma_wg_x_at", &plan::pmma_wg_x_at);
  m.def("plan_pmma_wg_x_rows", &plan::pmma_wg_x_rows);
  m.def("plan_pmma_workspace_need", &plan::pmma_workspace_need, py::arg("M"), py::arg("N"), py::arg("K"),
        py::arg("splits"), py::arg("wg") = false);
  m.def("plan_pmma_counters", &plan::pmma_counters);
  m.def("plan_pmma_smem_bytes", [](int stage_tiles, int ntiles, int x_shared) {
    return plan::pmma_smem_bytes(stage_tiles, ntiles, x_shared);
  });
  m.def("plan_pmma_workspace_max", &plan::pmma_workspace_max);
  m.def("plan_pgemv_parts", &plan::pgemv_parts);
  m.def("plan_pgemv_grid", &plan::pgemv_grid);
  // The plan's step ranges, [first, last) as a tuple.
  using StepsFn = void (*)(int64_t, int, int, int64_t*, int64_t*);
  auto steps_range = [](StepsFn f) {
    return [f](int64_t K, int parts, int part) {
      int64_t first = 0, last = 0;
      f(K, parts, part, &first, &last);
      return py::make_tuple(first, last);
    };
  };
  m.def("plan_pgemv_steps", steps_range(&plan::pgemv_steps));
  m.def("plan_pgemv_mma_parts", &plan::pgemv_mma_parts);
  m.def("plan_pgemv_mma_grid", &plan::pgemv_mma_grid);
  m.def("plan_pgemv_mma_parts_any", &plan::pgemv_mma_parts_any);
  m.def("plan_pgemv_mma_part_steps", &plan::pgemv_mma_part_steps);
  m.def("plan_pgemv_mma_cta_warps", &plan::pgemv_mma_cta_warps);
  m.def("plan_pgemv_mma_sm_warps", &plan::pgemv_mma_sm_warps);
  m.def("plan_pgemv_any_parts", &plan::pgemv_any_parts);
  m.def("plan_pgemv_mma_steps", steps_range(&plan::pgemv_mma_steps));
  m.def("plan_pgemv_mma_queue_units", &plan::pgemv_mma_queue_units);
  m.def("plan_pgemv_mma_unit_steps", steps_range(&plan::pgemv_mma_unit_steps));
  m.def("plan_pgemv_mma_queue_grid", &plan::pgemv_mma_queue_grid);
  m.def("plan_pgemv_mma_queue_ctas_per_sm", &plan::pgemv_mma_queue_ctas_per_sm);
  m.def("plan_pgemv_mma_queue_workspace", &plan::pgemv_mma_queue_workspace);
  m.def("plan_pgemv_mma_queue_counters", &plan::pgemv_mma_queue_counters);
  m.def("plan_pgemv_is_mma", &plan::pgemv_is_mma);
  m.def("plan_pgemv_max_m", &plan::pgemv_max_m);
  m.def("plan_pgemv_variant_parts", &plan::pgemv_variant_parts);
  m.def("plan_pgemv_variant_grid", &plan::pgemv_variant_grid);

  // --------------------------------------------------------------------- device launches
  m.def("huffman_build_lut", [](uintptr_t table, int exp_lo, int exp_hi, uintptr_t lut, uintptr_t err,
                                uintptr_t stream) {
    need(table && lut && err, "null device pointer");
    check(cuda::huffman_build_lut(dev<const uint8_t>(table), exp_lo, exp_hi, dev<uint16_t>(lut),
                                  dev<int32_t>(err), stream_of(stream)));
  }, py::arg("table"), py::arg("exp_lo"), py::arg("exp_hi"), py::arg("lut"), py::arg("err"),
     py::arg("stream") = 0,
     "Build the uint16 [4, 4096] decode LUT from the uint8 [4, exp_hi-exp_lo+1] code lengths.");

  m.def("huffman_decode", [](uintptr_t stream_p, int64_t stream_bytes, uintptr_t off, int64_t rows,
                             int64_t cols, int64_t R, int64_t C, uintptr_t lut, int64_t g0, int64_t g1,
                             int64_t c0, int64_t c1, uintptr_t sm, int64_t sm_stride, uintptr_t out,
                             int64_t out_stride, uintptr_t err, uintptr_t stream, bool exp_only, uintptr_t chk,
                             int64_t S, int64_t P, int variant) {
    need(stream_p && off && lut && sm && out && err, "null device pointer");
    check(cuda::huffman_decode(dev<const uint8_t>(stream_p), stream_bytes, dev<const uint32_t>(off), rows,
                               cols, R, C, dev<const uint16_t>(lut), g0, g1, c0, c1,
                               dev<const uint8_t>(sm), sm_stride, exp_only ? nullptr : dev<uint16_t>(out),
                               exp_only ? dev<uint8_t>(out) : nullptr, out_stride, dev<const uint16_t>(chk), S, P,
                               dev<int32_t>(err), variant, stream_of(stream)));
  }, py::arg("exp"), py::arg("exp_bytes"), py::arg("off"), py::arg("rows"), py::arg("cols"), py::arg("R"),
     py::arg("C"), py::arg("lut"), py::arg("g0"), py::arg("g1"), py::arg("c0"), py::arg("c1"), py::arg("sm"),
     py::arg("sm_stride"), py::arg("out"), py::arg("out_stride"), py::arg("err"), py::arg("stream") = 0,
     py::arg("exp_only") = false, py::arg("chk") = 0, py::arg("S") = 0, py::arg("P") = 0, py::arg("variant") = 0,
     "Decode Huffman segments [g0,g1)x[c0,c1), chain by chain with the checkpoint index chk [n_seg, P] of "
     "interval S (chk 0 and S 0: one chain per segment); sm/out point at the rectangle origin; variant: "
     "HUFF_VARIANT_* of kernel_plan.h (0: the default).");

  m.def("huffman_gather_rows", [](uintptr_t ids, int64_t n_ids, uintptr_t stream_p, int64_t stream_bytes,
                                  uintptr_t off, int64_t rows, int64_t cols, int64_t R, int64_t C, uintptr_t lut,
                                  uintptr_t sm, uintptr_t chk, int64_t S, int64_t P, uintptr_t out,
                                  int64_t out_stride, uintptr_t err, uintptr_t stream) {
    need((ids || n_ids == 0) && stream_p && off && lut && sm && out && err, "null device pointer");
    check(cuda::huffman_gather_rows(dev<const int64_t>(ids), n_ids, dev<const uint8_t>(stream_p), stream_bytes,
                                    dev<const uint32_t>(off), rows, cols, R, C, dev<const uint16_t>(lut),
                                    dev<const uint8_t>(sm), dev<const uint16_t>(chk), S, P, dev<uint16_t>(out),
                                    out_stride, dev<int32_t>(err), stream_of(stream)));
  }, py::arg("ids"), py::arg("n_ids"), py::arg("exp"), py::arg("exp_bytes"), py::arg("off"), py::arg("rows"),
     py::arg("cols"), py::arg("R"), py::arg("C"), py::arg("lut"), py::arg("sm"), py::arg("chk"), py::arg("S"),
     py::arg("P"), py::arg("out"), py::arg("out_stride"), py::arg("err"), py::arg("stream") = 0,
     "out[i] = row ids[i] (int64 device ids) of a Huffman matrix, decoding only the chains that hold the rows.");

  m.def("palette_gather_rows", [](uintptr_t ids, int64_t n_ids, uintptr_t sm, uintptr_t idx, int64_t rows,
                                  int64_t cols, py::bytes palette, uintptr_t vpos, int64_t nv, uintptr_t vexp,
                                  uintptr_t out, int64_t out_stride, uintptr_t err, uintptr_t stream,
                                  uintptr_t vrow) {
    need((ids || n_ids == 0) && sm && idx && out && err, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gather_rows(dev<const int64_t>(ids), n_ids, dev<const uint8_t>(sm), dev<const uint8_t>(idx),
                                    rows, cols, make_palette(palette), dev<const uint32_t>(vpos), nv,
                                    dev<const uint8_t>(vexp), dev<const uint32_t>(vrow), dev<uint16_t>(out),
                                    out_stride, dev<int32_t>(err), stream_of(stream)));
  }, py::arg("ids"), py::arg("n_ids"), py::arg("sm"), py::arg("idx"), py::arg("rows"), py::arg("cols"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"), py::arg("out"), py::arg("out_stride"),
     py::arg("err"), py::arg("stream") = 0, py::arg("vrow") = 0,
     "out[i] = row ids[i] (int64 device ids) of a palette matrix; vrow: the verbatim row index [rows + 1] or 0.");

  m.def("palette_decode", [](uintptr_t sm, uintptr_t idx, int64_t rows, int64_t cols, int64_t r0,
                             int64_t r1, int64_t k0, int64_t k1, py::bytes palette, uintptr_t vpos,
                             int64_t nv, uintptr_t vexp, uintptr_t out, int64_t out_stride,
                             uintptr_t err, uintptr_t stream, int variant, int tiled) {
    need(sm && idx && out && err, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_decode(dev<const uint8_t>(sm), dev<const uint8_t>(idx), rows, cols, r0, r1, k0, k1,
                               make_palette(palette), dev<const uint32_t>(vpos), nv,
                               dev<const uint8_t>(vexp), dev<uint16_t>(out), out_stride,
                               dev<int32_t>(err), variant, tiled, stream_of(stream)));
  }, py::arg("sm"), py::arg("idx"), py::arg("rows"), py::arg("cols"), py::arg("r0"), py::arg("r1"),
     py::arg("k0"), py::arg("k1"), py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"),
     py::arg("out"), py::arg("out_stride"), py::arg("err"), py::arg("stream") = 0, py::arg("variant") = 0,
     py::arg("tiled") = 0,
     "Decode rows [r0,r1) x cols [k0,k1) of the full sm/idx planes into out (rectangle origin); variant: "
     "PAL_VARIANT_* of kernel_plan.h (0: the default); tiled: the planes are tile-major (kernel_plan.h).");

  m.def("palette_decode_slots", [](uintptr_t ids, int64_t slots, int64_t n, uintptr_t sm, uintptr_t idx, int64_t rows,
                                   int64_t cols, py::bytes palette, uintptr_t vpos, int64_t nv_per, uintptr_t vexp,
                                   uintptr_t out, uintptr_t err, uintptr_t stream, int variant) {
    need(slots == 0 || (ids && sm && idx && out && err), "null device pointer");
    need(nv_per == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_decode_slots(dev<const int64_t>(ids), slots, n, dev<const uint8_t>(sm),
                                     dev<const uint8_t>(idx), rows, cols, make_palette(palette),
                                     dev<const uint32_t>(vpos), nv_per, dev<const uint8_t>(vexp), dev<uint16_t>(out),
                                     dev<int32_t>(err), variant, stream_of(stream)));
  }, py::arg("ids"), py::arg("slots"), py::arg("n"), py::arg("sm"), py::arg("idx"), py::arg("rows"), py::arg("cols"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv_per"), py::arg("vexp"), py::arg("out"), py::arg("err"),
     py::arg("stream") = 0, py::arg("variant") = 0,
     "out[s] = matrix ids[s] (int64 device ids, read on the device) of a palette stack sm [n, rows, cols], idx "
     "[n, rows, ceil(cols/2)] with verbatim lists vpos [n, nv_per], vexp [n, nv_per, 32].");

  m.def("prefetch_l2", [](std::vector<uintptr_t> ptrs, std::vector<int64_t> bytes, uintptr_t stream) {
    need(ptrs.size() == bytes.size(), "one size per range");
    need(ptrs.size() <= static_cast<size_t>(plan::PREFETCH_MAX_RANGES), "at most 4 ranges");
    std::vector<const uint8_t*> p;
    for (uintptr_t q : ptrs) p.push_back(dev<const uint8_t>(q));
    check(cuda::prefetch_l2(p.data(), bytes.data(), static_cast<int>(p.size()), stream_of(stream)));
  }, py::arg("ptrs"), py::arg("bytes"), py::arg("stream") = 0,
     "Bring the device byte ranges [ptrs[i], ptrs[i] + bytes[i]) into L2 (a hint; reads and writes nothing).");

  m.def("crc32_ranges", [](uintptr_t p, int64_t bytes, int64_t ranges, uintptr_t table, uintptr_t out,
                           uintptr_t stream) {
    check(cuda::crc32_ranges(dev<const uint8_t>(p), bytes, ranges, dev<const uint32_t>(table), dev<uint32_t>(out),
                             stream_of(stream)));
  }, py::arg("p"), py::arg("bytes"), py::arg("ranges"), py::arg("table"), py::arg("out"), py::arg("stream") = 0,
     "out[r] (uint32 [ranges], device) = zlib's crc32 of device bytes [p + r * bytes, p + (r + 1) * bytes); table: "
     "crc32_stride_table() on the device.");
  m.def("crc32_stride_table", []() {
    arr<uint32_t> u({16, 256});
    cuda::crc32_stride_table(u.mutable_data());
    return u;
  }, "The device CRC's stride tables, uint32 [16, 256] (host memory).");

  m.def("exp_histogram", [](uintptr_t exps, int64_t n, uintptr_t hist, uintptr_t stream) {
    need(exps && hist, "null device pointer");
    check(cuda::exp_histogram(dev<const uint8_t>(exps), n, dev<unsigned long long>(hist), stream_of(stream)));
  }, py::arg("exps"), py::arg("n"), py::arg("hist"), py::arg("stream") = 0);

  m.def("palette_encode_pass1", [](uintptr_t exps, int64_t rows, int64_t cols, py::bytes palette,
                                   uintptr_t idx, uintptr_t flags, uintptr_t row_counts,
                                   uintptr_t row_offsets, uintptr_t stream) {
    need(exps && idx && flags && row_counts && row_offsets, "null device pointer");
    check(cuda::palette_encode_pass1(dev<const uint8_t>(exps), rows, cols, make_palette(palette),
                                     dev<uint8_t>(idx), dev<uint8_t>(flags), dev<uint32_t>(row_counts),
                                     dev<uint32_t>(row_offsets), stream_of(stream)));
  }, py::arg("exps"), py::arg("rows"), py::arg("cols"), py::arg("palette"), py::arg("idx"), py::arg("flags"),
     py::arg("row_counts"), py::arg("row_offsets"), py::arg("stream") = 0);

  m.def("palette_encode_pass2", [](uintptr_t exps, int64_t rows, int64_t cols, uintptr_t flags,
                                   uintptr_t row_offsets, int64_t nv, uintptr_t vpos, uintptr_t vexp,
                                   uintptr_t stream) {
    need(exps && flags && row_offsets, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_encode_pass2(dev<const uint8_t>(exps), rows, cols, dev<const uint8_t>(flags),
                                     dev<const uint32_t>(row_offsets), nv, dev<uint32_t>(vpos),
                                     dev<uint8_t>(vexp), stream_of(stream)));
  }, py::arg("exps"), py::arg("rows"), py::arg("cols"), py::arg("flags"), py::arg("row_offsets"),
     py::arg("nv"), py::arg("vpos"), py::arg("vexp"), py::arg("stream") = 0);

  m.def("palette_gemm", [](uintptr_t x, int64_t ldx, int M, uintptr_t sm, uintptr_t idx, int64_t N, int64_t K,
                           py::bytes palette, uintptr_t vpos, int64_t nv, uintptr_t vexp, int splits, uintptr_t ws,
                           uintptr_t counters, uintptr_t y, int64_t ldy, uintptr_t stream, int stage_tiles,
                           int x_shared, int tiled, uintptr_t vrow) {
    need(x && sm && idx && y, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gemm(dev<const uint16_t>(x), ldx, M, dev<const uint8_t>(sm), dev<const uint8_t>(idx), N, K,
                             make_palette(palette), dev<const uint32_t>(vpos), nv, dev<const uint8_t>(vexp),
                             dev<const uint32_t>(vrow), splits,
                             dev<float>(ws), dev<int32_t>(counters), dev<uint16_t>(y), ldy, stage_tiles, x_shared,
                             tiled, stream_of(stream)));
  }, py::arg("x"), py::arg("ldx"), py::arg("M"), py::arg("sm"), py::arg("idx"), py::arg("N"), py::arg("K"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"), py::arg("splits"), py::arg("ws"),
     py::arg("counters"), py::arg("y"), py::arg("ldy"), py::arg("stream") = 0, py::arg("stage_tiles") = 1,
     py::arg("x_shared") = 0, py::arg("tiled") = 0, py::arg("vrow") = 0,
     "y[M,N] (bf16) = x[M,K] (bf16) @ W^T for palette-coded W [N,K] on the tensor cores (M <= 256, K % 64 == 0); "
     "with splits > 1, ws is fp32 scratch [splits, M, N] and counters int32 [plan_pmma_counters(N)], zero; "
     "wgmma: ws holds plan_pmma_workspace_need(M, N, K, splits, True) floats, 16-byte aligned (x's stage images); "
     "stage_tiles 1 or 2 (wide stages); x_shared 1: x staged once per CTA in shared memory (stage_tiles 1), "
     "2: the same in wgmma's layout, multiplied by wgmma (sm_90a; splits from plan_pmma_splits(..., wg=True)); "
     "tiled 1: the planes are tile-major (N % 16 == 0).");

  m.def("palette_gemv", [](uintptr_t x, int64_t ldx, int M, uintptr_t sm, uintptr_t idx, int64_t N, int64_t K,
                           py::bytes palette, uintptr_t vpos, int64_t nv, uintptr_t vexp, int parts, uintptr_t y,
                           int64_t ldy, uintptr_t stream, int variant, int tiled, uintptr_t vrow) {
    need(x && sm && idx && y, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gemv(dev<const uint16_t>(x), ldx, M, dev<const uint8_t>(sm), dev<const uint8_t>(idx), N, K,
                             make_palette(palette), dev<const uint32_t>(vpos), nv, dev<const uint8_t>(vexp),
                             dev<const uint32_t>(vrow), parts,
                             dev<uint16_t>(y), ldy, variant, tiled, stream_of(stream)));
  }, py::arg("x"), py::arg("ldx"), py::arg("M"), py::arg("sm"), py::arg("idx"), py::arg("N"), py::arg("K"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"), py::arg("parts"), py::arg("y"),
     py::arg("ldy"), py::arg("stream") = 0, py::arg("variant") = 0, py::arg("tiled") = 0, py::arg("vrow") = 0,
     "y[M,N] (bf16) = x[M,K] (bf16) @ W^T for palette-coded W [N,K] on CUDA cores (M <= 4, K % 64 == 0); parts: "
     "warps per row (plan_pgemv_parts); variant: PGEMV_VARIANT_* (0: the default).");

  m.def("palette_gemv_probe", [](uintptr_t x, int64_t ldx, int M, uintptr_t sm, uintptr_t idx, int64_t N, int64_t K,
                                 py::bytes palette, uintptr_t vpos, int64_t nv, uintptr_t vexp, int parts, uintptr_t y,
                                 int64_t ldy, uintptr_t stream, int probe, int tiled, uintptr_t vrow) {
    need(x && sm && idx && y, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gemv_probe(dev<const uint16_t>(x), ldx, M, dev<const uint8_t>(sm), dev<const uint8_t>(idx), N,
                                   K, make_palette(palette), dev<const uint32_t>(vpos), nv, dev<const uint8_t>(vexp),
                                   dev<const uint32_t>(vrow),
                                   parts, dev<uint16_t>(y), ldy, probe, tiled, stream_of(stream)));
  }, py::arg("x"), py::arg("ldx"), py::arg("M"), py::arg("sm"), py::arg("idx"), py::arg("N"), py::arg("K"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"), py::arg("parts"), py::arg("y"),
     py::arg("ldy"), py::arg("stream") = 0, py::arg("probe") = 1, py::arg("tiled") = 0, py::arg("vrow") = 0,
     "A timing probe of the register-direct tensor-core GEMV (M <= 8, paired palette): its launch with one "
     "stage left out (probe: PGEMV_PROBE_NO_DECODE, _NO_MMA or _STREAM); y is written but is not the product.");

  m.def("set_programmatic_launch", &cuda::set_programmatic_launch, py::arg("on"),
        "Programmatic dependent launch of the tensor-core GEMV kernels on sm_90+ (process-wide; off by default).");
  m.def("programmatic_launch", &cuda::programmatic_launch_on);
  m.def("set_wgmma_tile_wait", &cuda::set_wgmma_tile_wait, py::arg("on"),
        "The wgmma palette_gemm's schedule (a timing probe, the same bits either way): on, each tile "
        "waits for its own wgmmas; off (default), they run under the next tile's decode.");
  m.def("wgmma_tile_wait", &cuda::wgmma_tile_wait_on);
  m.def("set_gemv_x_prefetch", &cuda::set_gemv_x_prefetch, py::arg("on"),
        "Whether the tensor-core GEMVs prefetch x's lines into L1 two steps ahead of its loads (process-wide; "
        "on by default; the same bits either way).");
  m.def("gemv_x_prefetch", &cuda::gemv_x_prefetch_on);

  m.def("palette_gemv_queue", [](uintptr_t x, int64_t ldx, int M, uintptr_t sm, uintptr_t idx, int64_t N, int64_t K,
                                 py::bytes palette, uintptr_t vpos, int64_t nv, uintptr_t vexp, int units, int64_t ctas,
                                 uintptr_t ws, uintptr_t queue, uintptr_t y, int64_t ldy, uintptr_t stream, int tiled,
                                 uintptr_t vrow) {
    need(x && sm && idx && y && queue, "null device pointer");
    need(nv == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gemv_queue(dev<const uint16_t>(x), ldx, M, dev<const uint8_t>(sm), dev<const uint8_t>(idx), N,
                                   K, make_palette(palette), dev<const uint32_t>(vpos), nv, dev<const uint8_t>(vexp),
                                   dev<const uint32_t>(vrow),
                                   units, ctas, dev<float>(ws), dev<int32_t>(queue), dev<uint16_t>(y), ldy, tiled,
                                   stream_of(stream)));
  }, py::arg("x"), py::arg("ldx"), py::arg("M"), py::arg("sm"), py::arg("idx"), py::arg("N"), py::arg("K"),
     py::arg("palette"), py::arg("vpos"), py::arg("nv"), py::arg("vexp"), py::arg("units"), py::arg("ctas"),
     py::arg("ws"), py::arg("queue"), py::arg("y"), py::arg("ldy"), py::arg("stream") = 0, py::arg("tiled") = 0,
     py::arg("vrow") = 0,
     "y[M,N] (bf16) = x[M,K] (bf16) @ W^T through the queued tensor-core GEMV (M <= 32, K % 64 == 0): units per "
     "16-row tile (plan_pgemv_mma_queue_units), a persistent grid of ctas CTAs (plan_pgemv_mma_queue_grid); ws fp32 "
     "[plan_pgemv_mma_queue_workspace], queue int32 [plan_pgemv_mma_queue_counters], zero, left zero.");

  m.def("palette_gemv_slots", [](uintptr_t x, int64_t ldx, uintptr_t ids, int64_t slots, int64_t E, uintptr_t sm,
                                 uintptr_t idx, int64_t N, int64_t K, py::bytes palette, uintptr_t vpos, int64_t V,
                                 uintptr_t vexp, int parts, uintptr_t y, int64_t ldy, uintptr_t err, uintptr_t stream,
                                 uintptr_t vrow) {
    need(slots == 0 || (x && ids && sm && idx && y && err), "null device pointer");
    need(V == 0 || (vpos && vexp), "null verbatim pointers");
    check(cuda::palette_gemv_slots(dev<const uint16_t>(x), ldx, dev<const int64_t>(ids), slots, E,
                                   dev<const uint8_t>(sm), dev<const uint8_t>(idx), N, K, make_palette(palette),
                                   dev<const uint32_t>(vpos), V, dev<const uint8_t>(vexp), dev<const uint32_t>(vrow),
                                   parts, dev<uint16_t>(y), ldy, dev<int32_t>(err), stream_of(stream)));
  }, py::arg("x"), py::arg("ldx"), py::arg("ids"), py::arg("slots"), py::arg("E"), py::arg("sm"), py::arg("idx"),
     py::arg("N"), py::arg("K"), py::arg("palette"), py::arg("vpos"), py::arg("V"), py::arg("vexp"), py::arg("parts"),
     py::arg("y"), py::arg("ldy"), py::arg("err"), py::arg("stream") = 0, py::arg("vrow") = 0,
     "y[s] = x[s] @ W[ids[s]]^T (bf16, batch 1 per slot) for a palette stack sm [E, N, K], idx [E, N, K/2], vpos "
     "[E, V], vexp [E, V, 32]; ids int64 read on the device; parts as palette_gemv's tensor-core variant.");

  // --------------------------------------------------------------------- warp emulator self-tests
  m.def("emu_fiber_fast", &emu::fiber_fast,
        "Whether the emulator switches fibers without ucontext here (emu/fiber.h): x86-64 Linux without a shadow "
        "stack, unless UNWEIGHT_EMU_UCONTEXT=1.");
  m.def("emu_fiber_switch_ns", &emu::fiber_switch_ns, py::arg("n") = 1000000,
        "Nanoseconds per fiber switch, timed over n round trips on this thread (the path emu_fiber_fast names).");
  m.def("emu_selftest_mma", [](arr<uint16_t> A, arr<uint16_t> B, arr<float> C) {
    need(A.size() == 256 && B.size() == 128 && C.size() == 128, "A [16,16], B [16,8] bf16 bits and C [16,8] fp32");
    arr<float> D({16, 8});
    check(emu::selftest_mma_host(A.data(), B.data(), C.data(), D.mutable_data()));
    return D;
  }, "D [16,8] fp32 = A @ B + C through one emulated warp's mma.sync m16n8k16 (bf16 bits in, PTX layouts).");
  m.def("selftest_mma", [](uintptr_t A, uintptr_t B, uintptr_t C, uintptr_t D, uintptr_t stream) {
    need(A && B && C && D, "null device pointer");
    check(emu::selftest_mma_device(dev<const uint16_t>(A), dev<const uint16_t>(B), dev<const float>(C),
                                   dev<float>(D), stream_of(stream)));
  }, py::arg("A"), py::arg("B"), py::arg("C"), py::arg("D"), py::arg("stream") = 0,
     "The emu_selftest_mma body on the GPU (device pointers), to compare the emulator with the hardware.");
  m.def("emu_selftest_wgmma", [](int kind, arr<uint16_t> A, arr<uint16_t> B) -> py::object {
    need(A.ndim() == 2 && A.shape(0) == 64 && A.shape(1) == 16, "A must be bf16 bits [64, 16]");
    need(B.ndim() == 2 && B.shape(0) == 16, "B must be bf16 bits [16, n]");
    const int n = static_cast<int>(B.shape(1));
    arr<float> D({int64_t{64}, static_cast<int64_t>(n)});
    std::fill(D.mutable_data(), D.mutable_data() + D.size(), 0.f);
    const char* e = emu::selftest_wgmma_host(kind, n, A.data(), B.data(), D.mutable_data());
    return py::make_tuple(e ? py::object(py::str(e)) : py::object(py::none()), D);
  }, py::arg("kind"), py::arg("A"), py::arg("B"),
     "D [64, n] fp32 = A @ B through one emulated warpgroup's wgmma m64nNk16 (emu/selftest.h; kind 0 by the "
     "rules, 1-5 each break one): (the emulator's error or None, D).");
  m.def("selftest_wgmma", [](int n, uintptr_t A, uintptr_t B, uintptr_t D, uintptr_t stream) {
    need(A && B && D, "null device pointer");
    check(emu::selftest_wgmma_device(n, dev<const uint16_t>(A), dev<const uint16_t>(B), dev<float>(D),
                                     stream_of(stream)));
  }, py::arg("n"), py::arg("A"), py::arg("B"), py::arg("D"), py::arg("stream") = 0,
     "The emu_selftest_wgmma body (kind 0) on an sm_90 GPU (device pointers A [64,16], B [16,n] bf16, D [64,n] "
     "fp32), to compare the emulator's wgmma layouts with the hardware's.");
  m.def("emu_selftest_collectives", [](arr<uint32_t> src) {
    need(src.size() == 64 * 8, "src must hold 512 uint32 words");
    arr<int32_t> out({64, emu::kCollectiveFields});
    check(emu::selftest_collectives_host(src.data(), out.mutable_data()));
    return out;
  }, "Per-thread results [64, 9] of shuffles, ballots, barriers and cp.async groups in one emulated CTA.");
  m.def("emu_selftest_error", [](int kind) -> py::object {
    const char* e = emu::selftest_error_host(kind);
    if (e == nullptr) return py::none();
    return py::str(e);
  }, "The error the emulator reports for a body that breaks a rule (0: hang in a syncwarp, 1: mixed masks, "
     "2: hang across syncthreads/syncwarp, 3-5: shared-memory races, 6-7: a cp.async stage read before its wait, "
     "8-10: out of bounds, misaligned, unwritten, 11: a read racing atomics, 12: a 2-byte read racing, 13: a "
     "2-byte store; emu/selftest.h); None if it reports none.");
  m.def("emu_selftest_bulk", [](int kind) -> py::object {
    arr<uint32_t> out({32, 4});
    std::fill(out.mutable_data(), out.mutable_data() + 128, 0u);
    const char* e = emu::selftest_bulk_host(kind, out.mutable_data());
    return py::make_tuple(e ? py::object(py::str(e)) : py::object(py::none()), out);
  }, "One emulated warp streaming 4 steps through two bulk-copy slots (emu/selftest.h, kind 0: by the rules, "
     "1-7: each breaks one): (the emulator's error or None, out [32, 4] the lanes' sums).");
  m.def("emu_selftest_grid", [](int kind) -> py::object {
    arr<float> out(32);
    std::fill(out.mutable_data(), out.mutable_data() + 32, -1.f);
    const char* e = emu::selftest_grid_host(kind, out.mutable_data());
    return py::make_tuple(e ? py::object(py::str(e)) : py::object(py::none()), out);
  }, "Two emulated CTAs handing each other words as the split-K fix-up does (emu/selftest.h, kind 0-3): "
     "(the emulator's error or None, out [32]).");
  m.def("emu_selftest_grid_dep", [](int kind) -> py::object {
    const char* e = emu::selftest_grid_dep_host(kind);
    return e ? py::object(py::str(e)) : py::object(py::none());
  }, "One emulated warp of a launch that may start before the one ahead ends (emu/selftest.h, kind 0: waits "
     "before it touches x, y and a counter; 1-3 do not): the emulator's error or None.");
  m.def("emu_selftest_access", [](int op, int bytes, int stride, uint32_t lanes, int64_t bound) -> py::object {
    const char* e = emu::selftest_access_host(op, bytes, stride, lanes, bound);
    if (e == nullptr) return py::none();
    return py::str(e);
  }, py::arg("op"), py::arg("bytes"), py::arg("stride"), py::arg("lanes") = 0xFFFFFFFFu, py::arg("bound") = -1,
     "One emulated warp, one access per lane in `lanes`, lane l at byte l * stride (op 0: shared load, 1: shared "
     "store, 2: cp.async, 3: global load, 4: global store; emu/selftest.h), for the access profile; bound >= 0: "
     "the global buffer's first `bound` bytes are the launch's only buffer.  The emulator's error or None.");
  m.def("emu_profile", [](bool on) {
    static const char* const kinds[] = {"shared_load", "shared_store", "shared_async", "global_load",
                                        "global_store", "global_async"};
    static const char* const fields[] = {"requests", "units", "ideal", "bytes", "worse", "max_degree"};
    uint64_t out[emu::kProfileKinds * emu::kProfileFields];
    std::string worst;
    emu::take_profile(on, out, &worst);
    py::dict d;
    for (int k = 0; k < emu::kProfileKinds; ++k) {
      py::dict f;
      for (int i = 0; i < emu::kProfileFields; ++i) f[fields[i]] = out[k * emu::kProfileFields + i];
      d[kinds[k]] = f;
    }
    d["worst"] = worst;
    return d;
  }, py::arg("on"),
     "The memory-access profile of emulated launches (warp_emu.h): returns the totals since the last call, "
     "{kind: {requests, units, ideal, bytes, worse, max_degree}, worst: str} with kind shared_load / "
     "shared_store / shared_async (cp.async writes; units: wavefronts) and global_load / global_store / "
     "global_async (cp.async reads; units: 32-byte sectors), resets them, and profiles every later launch "
     "when `on`. Process-wide.");
  m.def("emu_cta_order", [](const std::string& order, uint64_t seed, int resident) {
    const int o = order == "forward" ? 0 : order == "reverse" ? 1 : order == "shuffle" ? 2 : -1;
    need(emu::set_cta_order(o, seed, resident), "order must be 'forward', 'reverse' or 'shuffle', resident >= 1");
  }, py::arg("order"), py::arg("seed") = 0, py::arg("resident") = 1,
     "The order every later emulated launch runs its CTAs in: 'forward' (x fastest, then y; the default), "
     "'reverse', or 'shuffle' (a permutation drawn from seed); resident: CTAs in flight at once, taking turns "
     "drawn from seed (each turn runs a CTA's threads to their next collective). Process-wide.");

  // --------------------------------------------------------------------- host emulation
  m.def("emulate_huffman_decode", [](arr<uint8_t> stream, arr<uint32_t> off, int64_t rows, int64_t cols,
                                     int64_t R, int64_t C, arr<uint8_t> table, int exp_lo, int exp_hi,
                                     int64_t g0, int64_t g1, int64_t c0, int64_t c1, arr<uint8_t> sm,
                                     py::array out, bool exp_only, arr<uint16_t> chk, int64_t S, int64_t max_ctas,
                                     int variant, py::object path_out) {
    need(sm.ndim() == 2 && out.ndim() == 2, "sm and out must be 2-D");
    need(off.size() == ((rows + R - 1) / R) * ((cols + C - 1) / C) + 1, "offset table has the wrong size");
    need(table.size() == HUFF_NUM_CTX * (exp_hi - exp_lo + 1), "code table has the wrong size");
    const int64_t nr = std::min(rows, g1 * R) - g0 * R;
    need(sm.shape(0) == nr && out.shape(0) == nr, "row count mismatch");
    need(out.flags() & py::array::c_style, "out must be C-contiguous");
    int32_t err = 0;
    uint16_t* o16 = nullptr;
    uint8_t* o8 = nullptr;
    if (exp_only) {
      need(out.dtype().is(py::dtype::of<uint8_t>()), "out must be uint8 when exp_only");
      o8 = static_cast<uint8_t*>(out.mutable_data());
    } else {
      need(out.dtype().is(py::dtype::of<uint16_t>()), "out must be uint16");
      o16 = static_cast<uint16_t*>(out.mutable_data());
    }
    const char* e;
    int path = -1;
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::huffman_decode(stream.data(), stream.size(), off.data(), rows, cols, R, C,
                                        table.data(), exp_lo, exp_hi, g0, g1, c0, c1, sm.data(), sm.shape(1),
                                        o16, o8, out.shape(1), S ? chk.data() : nullptr, S,
                                        chk.ndim() == 2 ? chk.shape(1) : 0, &err, max_ctas, variant, &path);
    }
    check(e);
    if (!path_out.is_none()) path_out.attr("append")(path);
    return err;
  }, py::arg("stream"), py::arg("off"), py::arg("rows"), py::arg("cols"), py::arg("R"), py::arg("C"),
     py::arg("table"), py::arg("exp_lo"), py::arg("exp_hi"), py::arg("g0"), py::arg("g1"), py::arg("c0"),
     py::arg("c1"), py::arg("sm"), py::arg("out"), py::arg("exp_only") = false,
     py::arg("chk") = arr<uint16_t>(std::vector<py::ssize_t>{0, 0}), py::arg("S") = 0, py::arg("max_ctas") = 0,
     py::arg("variant") = 0, py::arg("path_out") = py::none(),
     "Host run of the Huffman chain bodies (chk uint16 [n_seg, P] of interval S, or empty and 0; max_ctas caps "
     "the grid as occupancy does, 0 = no cap; variant: HUFF_VARIANT_* as on the device; path_out: a list that "
     "receives the variant that ran); returns the error count.");

  m.def("emulate_huffman_gather_rows", [](arr<int64_t> ids, arr<uint8_t> stream, arr<uint32_t> off, int64_t rows,
                                          int64_t cols, int64_t R, int64_t C, arr<uint8_t> table, int exp_lo,
                                          int exp_hi, arr<uint8_t> sm, arr<uint16_t> chk, int64_t S,
                                          arr<uint16_t> out, int64_t max_ctas) {
    need(sm.ndim() == 2 && sm.shape(0) == rows && sm.shape(1) == cols, "sm must be [rows, cols]");
    need(off.size() == ((rows + R - 1) / R) * ((cols + C - 1) / C) + 1, "offset table has the wrong size");
    need(table.size() == HUFF_NUM_CTX * (exp_hi - exp_lo + 1), "code table has the wrong size");
    need(out.ndim() == 2 && out.shape(0) == ids.size() && out.shape(1) >= cols, "out must be [len(ids), >= cols]");
    int32_t err = 0;
    const char* e;
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::huffman_gather_rows(ids.data(), ids.size(), stream.data(), stream.size(), off.data(), rows,
                                             cols, R, C, table.data(), exp_lo, exp_hi, sm.data(),
                                             S ? chk.data() : nullptr, S, chk.ndim() == 2 ? chk.shape(1) : 0,
                                             out.mutable_data(), out.shape(1), &err, max_ctas);
    }
    check(e);
    return err;
  }, py::arg("ids"), py::arg("stream"), py::arg("off"), py::arg("rows"), py::arg("cols"), py::arg("R"),
     py::arg("C"), py::arg("table"), py::arg("exp_lo"), py::arg("exp_hi"), py::arg("sm"), py::arg("chk"),
     py::arg("S"), py::arg("out"), py::arg("max_ctas") = 0,
     "Host run of the Huffman row-gather bodies; returns the error count.");

  m.def("emulate_palette_gather_rows", [](arr<int64_t> ids, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                          arr<uint32_t> vpos, arr<uint8_t> vexp, arr<uint16_t> out,
                                          py::object vrow) {
    need(sm.ndim() == 2 && idx.ndim() == 2 && out.ndim() == 2, "planes must be 2-D");
    const int64_t rows = sm.shape(0), cols = sm.shape(1);
    need(idx.shape(0) == rows && idx.shape(1) == (cols + 1) / 2, "idx shape mismatch");
    need(out.shape(0) == ids.size() && out.shape(1) >= cols, "out must be [len(ids), >= cols]");
    need(vexp.size() == vpos.size() * PAL_BLOCK, "vexp size mismatch");
    const RowIndex vr(vrow, rows + 1);
    int32_t err = 0;
    check(cuda::emulate::palette_gather_rows(ids.data(), ids.size(), sm.data(), idx.data(), rows, cols,
                                             make_palette(palette), vpos.data(), vpos.size(), vexp.data(), vr.p,
                                             out.mutable_data(), out.shape(1), &err));
    return err;
  }, py::arg("ids"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("out"), py::arg("vrow") = py::none(),
     "Host run of the palette row-gather bodies (vrow: the verbatim row index, or None); returns the error count.");

  m.def("emulate_palette_decode", [](arr<uint8_t> sm, arr<uint8_t> idx, int64_t r0, int64_t r1, int64_t k0,
                                     int64_t k1, py::bytes palette, arr<uint32_t> vpos, arr<uint8_t> vexp,
                                     arr<uint16_t> out, int variant, py::object path_out, int tiled) {
    need(sm.ndim() == 2 && idx.ndim() == 2 && out.ndim() == 2, "planes must be 2-D");
    const int64_t rows = sm.shape(0), cols = sm.shape(1);
    need(idx.shape(0) == rows && idx.shape(1) == (cols + 1) / 2, "idx shape mismatch");
    need(out.shape(0) == r1 - r0, "out row count mismatch");
    need(vexp.size() == vpos.size() * PAL_BLOCK, "vexp size mismatch");
    int32_t err = 0;
    int path = -1;
    const char* e = cuda::emulate::palette_decode(sm.data(), idx.data(), rows, cols, r0, r1, k0, k1,
                                                  make_palette(palette), vpos.data(), vpos.size(), vexp.data(),
                                                  out.mutable_data(), out.shape(1), &err, variant, tiled, &path);
    check(e);
    if (!path_out.is_none()) path_out.attr("append")(path);
    return err;
  }, py::arg("sm"), py::arg("idx"), py::arg("r0"), py::arg("r1"), py::arg("k0"), py::arg("k1"), py::arg("palette"),
     py::arg("vpos"), py::arg("vexp"), py::arg("out"), py::arg("variant") = 0, py::arg("path_out") = py::none(),
     py::arg("tiled") = 0,
     "Host run of the palette decode bodies (variant: PAL_VARIANT_*; path_out: a list that receives the variant "
     "that ran; tiled: sm and idx hold tile-major bytes in their [rows, cols] and [rows, cols / 2] shapes); "
     "returns the error count.");

  m.def("emulate_palette_gemv_slots", [](arr<uint16_t> x, arr<int64_t> ids, arr<uint8_t> sm, arr<uint8_t> idx,
                                         py::bytes palette, arr<uint32_t> vpos, arr<uint8_t> vexp, int parts,
                                         bool force_general, py::object vrow) {
    need(x.ndim() == 2 && ids.ndim() == 1 && sm.ndim() == 3 && idx.ndim() == 3 && vpos.ndim() == 2 && vexp.ndim() == 3,
         "x 2-D, ids 1-D, sm, idx, vexp 3-D and vpos 2-D");
    const int64_t S = ids.shape(0), E = sm.shape(0), N = sm.shape(1), K = sm.shape(2);
    need(x.shape(0) == S && x.shape(1) == K, "x must be [slots, K]");
    need(idx.shape(0) == E && idx.shape(1) == N && idx.shape(2) == (K + 1) / 2, "idx shape mismatch");
    need(vpos.shape(0) == E && vexp.shape(0) == E && vexp.shape(1) == vpos.shape(1) && vexp.shape(2) == PAL_BLOCK,
         "verbatim list shapes mismatch");
    arr<uint16_t> y({S, N});
    std::fill(y.mutable_data(), y.mutable_data() + S * N, uint16_t{0xFFFF});  // unwritten rows show
    int32_t err = 0;
    const Palette pal = make_palette(palette);
    // (16-byte aligned copies, as device buffers are)
    const AlignedCopy xc(x.data(), x.nbytes()), smc(sm.data(), sm.nbytes()), idxc(idx.data(), idx.nbytes()),
        vexpc(vexp.data(), vexp.nbytes());
    uint16_t* yp = y.mutable_data();
    const uint32_t* vp = vpos.data();
    const int64_t* ip = ids.data();
    const int64_t V = vpos.shape(1);
    const RowIndex vr(vrow, E * (N + 1));
    const std::pair<const void*, size_t> vb{vp, vpos.nbytes()}, ib{ip, ids.nbytes()}, yb{yp, y.nbytes()};
    const char* e;
    {
      py::gil_scoped_release nogil;
      const emu::GlobalBounds bounds{{xc.p, xc.n}, {smc.p, smc.n}, {idxc.p, idxc.n}, {vexpc.p, vexpc.n}, vb, ib, yb,
                                     {vr.p, vr.bytes}};
      e = cuda::emulate::palette_gemv_slots(reinterpret_cast<const uint16_t*>(xc.p), K, ip, S, E, smc.p, idxc.p, N, K,
                                            pal, vp, V, vexpc.p, vr.p, parts, yp, N, &err,
                                            force_general ? 1 : 0);
    }
    check(e);
    return py::make_tuple(y, err);
  }, py::arg("x"), py::arg("ids"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("parts") = 1, py::arg("force_general") = false, py::arg("vrow") = py::none(),
     "The slots GEMV's kernel body through the warp emulator (ids on the host): (y uint16 [slots, N], rows of a bad "
     "id left 0xFFFF; the error count).");
  m.def("emulate_palette_decode_slots", [](arr<int64_t> ids, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                           arr<uint32_t> vpos, arr<uint8_t> vexp, arr<uint16_t> out, int variant,
                                           py::object kind_out) {
    need(sm.ndim() == 3 && idx.ndim() == 3 && out.ndim() == 3 && vpos.ndim() == 2 && vexp.ndim() == 3,
         "sm, idx, out, vexp must be 3-D and vpos 2-D");
    const int64_t n = sm.shape(0), rows = sm.shape(1), cols = sm.shape(2);
    need(idx.shape(0) == n && idx.shape(1) == rows && idx.shape(2) == (cols + 1) / 2, "idx shape mismatch");
    need(out.shape(0) == ids.size() && out.shape(1) == rows && out.shape(2) == cols, "out shape mismatch");
    need(vpos.shape(0) == n && vexp.shape(0) == n && vexp.shape(1) == vpos.shape(1) && vexp.shape(2) == PAL_BLOCK,
         "verbatim list shapes mismatch");
    int32_t err = 0;
    int kind = -1;
    check(cuda::emulate::palette_decode_slots(ids.data(), ids.size(), n, sm.data(), idx.data(), rows, cols,
                                              make_palette(palette), vpos.data(), vpos.shape(1), vexp.data(),
                                              out.mutable_data(), &err, variant, &kind));
    if (!kind_out.is_none()) kind_out.attr("append")(kind);
    return err;
  }, py::arg("ids"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("out"), py::arg("variant") = 0, py::arg("kind_out") = py::none(),
     "Host run of the palette slots decode bodies (ids on the host); kind_out: a list that receives the slot body "
     "that ran (0 / 1 VEC8 scalar / vector, 2 / 3 wide general / paired); returns the error count.");

  m.def("emulate_prefetch_l2", [](arr<uint8_t> buf, std::vector<int64_t> offsets, std::vector<int64_t> bytes) {
    need(offsets.size() == bytes.size(), "one size per range");
    need(offsets.size() <= static_cast<size_t>(plan::PREFETCH_MAX_RANGES), "at most 4 ranges");
    // The ranges may run past the buffer (the test of the bounds check): only the buffer is a
    // buffer of the launch, and the emulator never dereferences a prefetched address.
    const uint8_t* base = buf.data();
    std::vector<const uint8_t*> p;
    for (int64_t o : offsets) p.push_back(base + o);
    const emu::GlobalBounds bounds{{base, static_cast<size_t>(buf.size())}};
    const char* e;
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::prefetch_l2(p.data(), bytes.data(), static_cast<int>(p.size()));
    }
    check(e);
  }, py::arg("buf"), py::arg("offsets"), py::arg("bytes"),
     "Host run of the L2 prefetch body over ranges of buf (each line checked against buf's bounds).");

  m.def("emulate_crc32_ranges", [](arr<uint8_t> buf, int64_t offset, int64_t bytes, int64_t ranges) {
    // The launch may read the 16-byte words around the ranges (aligned loads): those words
    // must lie in buf, and they are the only global memory besides the tables and out.
    need(offset >= 0 && bytes >= 0 && ranges >= 0, "negative offset, size or count");
    const uintptr_t b = reinterpret_cast<uintptr_t>(buf.data());
    const uintptr_t lo = (b + offset) & ~uintptr_t{15}, hi = (b + offset + bytes * ranges + 15) & ~uintptr_t{15};
    need(lo >= b && hi <= b + static_cast<uintptr_t>(buf.size()), "buf must hold the 16-byte words around the ranges");
    arr<uint32_t> table({16, 256});
    cuda::crc32_stride_table(table.mutable_data());
    arr<uint32_t> out(std::max<int64_t>(ranges, 1));
    const char* e;
    {
      const emu::GlobalBounds bounds{{reinterpret_cast<const void*>(lo), hi - lo},
                                     {table.data(), static_cast<size_t>(table.size()) * 4},
                                     {out.data(), static_cast<size_t>(out.size()) * 4}};
      py::gil_scoped_release nogil;
      e = cuda::emulate::crc32_ranges(buf.data() + offset, bytes, ranges, table.data(), out.mutable_data());
    }
    check(e);
    return py::array_t<uint32_t>(ranges, out.data());
  }, py::arg("buf"), py::arg("offset"), py::arg("bytes"), py::arg("ranges"),
     "Host run of the CRC-32 body: uint32 [ranges], the crc32 of bytes [offset + r * bytes, ...) of buf (every "
     "global access checked against the words around the ranges).");

  m.def("emulate_exp_histogram", [](arr<uint8_t> exps) {
    arr<uint64_t> hist(256);
    std::fill(hist.mutable_data(), hist.mutable_data() + 256, 0);
    auto* h = reinterpret_cast<unsigned long long*>(hist.mutable_data());
    const uint8_t* ep = exps.data();
    const int64_t n = exps.size();
    const char* e;
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::exp_histogram(ep, n, h);
    }
    check(e);
    return hist;
  });

  m.def("emulate_palette_encode", [](arr<uint8_t> exps, py::bytes palette) {
    need(exps.ndim() == 2, "exps must be 2-D");
    const int64_t rows = exps.shape(0), cols = exps.shape(1);
    const int64_t bpr = plan::blocks_per_row(cols);
    arr<uint8_t> idx({rows, (cols + 1) / 2});
    std::vector<uint8_t> flags(rows * bpr);
    std::vector<uint32_t> counts(rows), offsets(rows + 1);
    const Palette pal = make_palette(palette);
    const uint8_t* ep = exps.data();
    uint8_t* ip = idx.mutable_data();
    const char* e;
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::palette_encode_pass1(ep, rows, cols, pal, ip, flags.data(), counts.data(), offsets.data());
    }
    check(e);
    const int64_t nv = offsets[rows];
    arr<uint32_t> vpos(nv);
    arr<uint8_t> vexp({nv, static_cast<int64_t>(PAL_BLOCK)});
    uint32_t* vp = vpos.mutable_data();
    uint8_t* xp = vexp.mutable_data();
    {
      py::gil_scoped_release nogil;
      e = cuda::emulate::palette_encode_pass2(ep, rows, cols, flags.data(), offsets.data(), nv, vp, xp);
    }
    check(e);
    return py::make_tuple(idx, vpos, vexp);
  }, "Host run of the transcode's encode kernels: (idx, vpos, vexp) from an exponent plane.");

  m.def("emulate_warp_lower_bounds", [](arr<uint32_t> v, arr<uint64_t> ka, arr<uint64_t> kb) {
    need(ka.size() == kb.size(), "ka and kb must have the same length");
    arr<int64_t> out({static_cast<int64_t>(ka.size()), int64_t{4}});
    check(cuda::emulate::warp_lower_bounds(v.data(), static_cast<int64_t>(v.size()), ka.data(), kb.data(),
                                           static_cast<int64_t>(ka.size()), out.mutable_data()));
    return out;
  }, py::arg("v"), py::arg("ka"), py::arg("kb"),
     "The fused kernels' warp-wide lower bounds through the emulator: int64 [len(ka), 4].");
  m.def("emulate_palette_gemm", [](arr<uint16_t> x, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                   arr<uint32_t> vpos, arr<uint8_t> vexp, int splits, bool force_general,
                                   int stage_tiles, int x_shared, int tiled, py::object vrow) {
    check_emu_operands(x, sm, idx, vpos, vexp);
    const EmuOperands o(x, sm, idx, vpos, vexp);
    const RowIndex vr(vrow, o.N + 1);
    const int M = o.M;
    const int64_t N = o.N, K = o.K, nv = o.nv;
    // (aligned as a device buffer: the wgmma variant's x sits in it)
    const size_t ws_n = static_cast<size_t>(
        std::max<int64_t>(1, plan::pmma_workspace_need(M, N, K, splits, x_shared == plan::PMMA_XS_WGMMA)));
    const emu::HostBuffer ws_buf(ws_n * sizeof(float));
    float* const ws = reinterpret_cast<float*>(ws_buf.data());
    std::vector<int32_t> counters(static_cast<size_t>(plan::pmma_counters(N)), 0);
    arr<uint16_t> y({static_cast<int64_t>(M), N});
    const Palette pal = make_palette(palette);
    uint16_t* yp = y.mutable_data();
    const char* e;
    const std::pair<const void*, size_t> vb{vpos.data(), vpos.nbytes()}, yb{yp, y.nbytes()};
    {
      py::gil_scoped_release nogil;
      // (a read past any of these fails the emulated launch)
      emu::GlobalBounds bounds{{o.sm.p, o.sm.n}, {o.idx.p, o.idx.n}, {o.vexp.p, o.vexp.n}, vb, {vr.p, vr.bytes}};
      // The wgmma variant's launches (the x reorder, then the GEMM) may start before the ones
      // ahead of them end (programmatic launch): they touch x, y, the workspace and the counters
      // only after their grid-dependency wait, which the emulator checks.
      const bool wg = x_shared == plan::PMMA_XS_WGMMA;
      for (const auto& [p, n] : {std::pair<const void*, size_t>{o.x.p, o.x.n}, yb, {ws, ws_n * sizeof(float)},
                                 {counters.data(), counters.size() * sizeof(int32_t)}}) {
        if (wg) bounds.after_wait(p, n);
        else bounds.add(p, n);
      }
      e = cuda::emulate::palette_gemm(o.x16(), K, M, o.sm.p, o.idx.p, N, K, pal, vpos.data(), nv,
                                      o.vexp.p, vr.p, splits, ws,
                                      counters.data(), yp, N, force_general ? 1 : 0, stage_tiles,
                                      x_shared, tiled);
    }
    check(e);
    for (int32_t c : counters) need(c == 0, "emulated palette_gemm left an arrival counter non-zero");
    return y;
  }, py::arg("x"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("splits") = 1, py::arg("force_general") = false, py::arg("stage_tiles") = 1, py::arg("x_shared") = 0,
     py::arg("tiled") = 0, py::arg("vrow") = py::none(),
     "The fused GEMM's kernel body through the warp emulator (tiled: sm and idx hold tile-major bytes in their "
     "[N, K] and [N, K / 2] shapes): y uint16 (bf16 bits) [M, N].");

  m.def("emulate_palette_gemv_queue", [](arr<uint16_t> x, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                         arr<uint32_t> vpos, arr<uint8_t> vexp, int units, int64_t ctas,
                                         bool force_general, int tiled, py::object vrow) {
    need(units >= 1, "units must be >= 1");
    need(x.ndim() == 2 && sm.ndim() == 2, "x and sm must be 2-D");
    std::vector<float> ws(static_cast<size_t>(
        std::max<int64_t>(1, plan::pgemv_mma_queue_workspace(sm.shape(0), units, static_cast<int>(x.shape(0))))));
    std::vector<int32_t> queue(static_cast<size_t>(plan::pgemv_mma_queue_counters(sm.shape(0))), 0);
    arr<uint16_t> y = emulate_gemv_like(
        x, sm, idx, palette, vpos, vexp, vrow, true,
        {{ws.data(), ws.size() * sizeof(float)}, {queue.data(), queue.size() * sizeof(int32_t)}},
        [&](const EmuOperands& o, const Palette& pal, const uint32_t* vp, const uint32_t* vr,
                                 uint16_t* yp) {
          return cuda::emulate::palette_gemv_queue(o.x16(), o.K, o.M, o.sm.p, o.idx.p, o.N, o.K, pal, vp, o.nv,
                                                   o.vexp.p, vr, units, ctas, ws.data(), queue.data(), yp, o.N,
                                                   force_general ? 1 : 0, tiled);
        });
    for (int32_t c : queue) need(c == 0, "emulated palette_gemv_queue left a counter non-zero");
    return y;
  }, py::arg("x"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("units") = 1, py::arg("ctas") = 1, py::arg("force_general") = false, py::arg("tiled") = 0,
     py::arg("vrow") = py::none(),
     "The queued tensor-core GEMV's kernel body through the warp emulator on a persistent grid of ctas CTAs "
     "(units per 16-row tile; tiled as for emulate_palette_gemm): y uint16 (bf16 bits) [M, N].");

  m.def("emulate_palette_gemv_probe", [](arr<uint16_t> x, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                         arr<uint32_t> vpos, arr<uint8_t> vexp, int parts, int probe, int tiled,
                                         py::object vrow) {
    return emulate_gemv_like(x, sm, idx, palette, vpos, vexp, vrow, true, {},
                             [&](const EmuOperands& o, const Palette& pal, const uint32_t* vp, const uint32_t* vr,
                                 uint16_t* yp) {
      return cuda::emulate::palette_gemv_probe(o.x16(), o.K, o.M, o.sm.p, o.idx.p, o.N, o.K, pal, vp, o.nv, o.vexp.p,
                                               vr, parts, yp, o.N, probe, tiled);
    });
  }, py::arg("x"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("parts") = 1, py::arg("probe") = 1, py::arg("tiled") = 0, py::arg("vrow") = py::none(),
     "A tensor-core GEMV timing probe's kernel body through the warp emulator (probe: PGEMV_PROBE_*): y uint16 "
     "[M, N], not the product.");

  m.def("emulate_palette_gemv", [](arr<uint16_t> x, arr<uint8_t> sm, arr<uint8_t> idx, py::bytes palette,
                                   arr<uint32_t> vpos, arr<uint8_t> vexp, int parts, bool force_general,
                                   int variant, int tiled, py::object vrow) {
    // (the tensor-core variants wait on the launches ahead before they touch x and y)
    return emulate_gemv_like(x, sm, idx, palette, vpos, vexp, vrow, plan::pgemv_is_mma(variant), {},
                             [&](const EmuOperands& o, const Palette& pal, const uint32_t* vp, const uint32_t* vr,
                                 uint16_t* yp) {
      return cuda::emulate::palette_gemv(o.x16(), o.K, o.M, o.sm.p, o.idx.p, o.N, o.K, pal, vp, o.nv, o.vexp.p, vr,
                                         parts, yp, o.N, force_general ? 1 : 0, variant, tiled);
    });
  }, py::arg("x"), py::arg("sm"), py::arg("idx"), py::arg("palette"), py::arg("vpos"), py::arg("vexp"),
     py::arg("parts") = 1, py::arg("force_general") = false, py::arg("variant") = 0, py::arg("tiled") = 0,
     py::arg("vrow") = py::none(),
     "The palette GEMV's kernel body through the warp emulator (variant: PGEMV_VARIANT_*; tiled as for "
     "emulate_palette_gemm): y uint16 (bf16 bits) [M, N].");
}
