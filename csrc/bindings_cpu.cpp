// pybind11 bindings of the CPU codec: argument checks and GIL release only; the work is in
// cpu/*.cpp.  Failures raise ValueError with one-line messages the Python layer turns
// into unweight.FormatError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include "cpu_codec.h"
#include "decode_primitives.h"

namespace py = pybind11;
using namespace unweight;

namespace {
template <class T>
using arr = py::array_t<T, py::array::c_style>;

template <class T>
const T* cptr(const arr<T>& a) { return a.data(); }
template <class T>
T* mptr(arr<T>& a) { return a.mutable_data(); }

void need(bool ok, const char* what) {
  if (!ok) throw py::value_error(what);
}

Grid make_grid(int64_t rows, int64_t cols, int64_t R, int64_t C) {
  need(rows > 0 && cols > 0 && R > 0 && C > 0, "grid dimensions must be positive");
  return Grid{rows, cols, R, C};
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "unweight C++ CPU codec (format v1)";
  m.attr("VERSION_MAJOR") = VERSION_MAJOR;
  m.attr("HUFF_MAX_CODE_LEN") = HUFF_MAX_CODE_LEN;
  m.attr("HUFF_NUM_CTX") = HUFF_NUM_CTX;
  m.attr("PAL_BLOCK") = PAL_BLOCK;

  m.def("_force_baseline_cpu", &set_force_baseline_cpu, py::arg("on"),
        "Tests only: use the baseline x86-64 decode loop and zlib crc32 even where faster ones exist.");
  m.def("host_empty", [](int64_t nbytes, int threads) {
    need(nbytes >= 0, "negative size");
    const size_t n = static_cast<size_t>(nbytes);
    void* p;
    size_t cap = 0;
    {
      py::gil_scoped_release nogil;
      p = host_alloc(n, threads, &cap);
    }
    if (!p) throw std::bad_alloc();
    struct Block { void* p; size_t cap; };
    py::capsule owner(new Block{p, cap}, [](void* b) {
      auto* blk = static_cast<Block*>(b);
      host_free(blk->p, blk->cap);
      delete blk;
    });
    return arr<uint8_t>({static_cast<py::ssize_t>(nbytes)}, {1}, static_cast<uint8_t*>(p), owner);
  }, py::arg("nbytes"), py::arg("threads") = 1,
     "Uninitialized uint8 [nbytes] host array (freed with the array); see csrc/cpu/host_alloc.cpp.");

  m.def("host_cache_clear", &host_cache_clear,
        "Unmap the freed decode buffers kept for reuse; returns the bytes released.");

  m.def("crc32", [](arr<uint8_t> data, int threads) {
    const int64_t n = data.size();
    py::gil_scoped_release nogil;
    return crc32_parallel(cptr(data), n, threads);
  }, py::arg("data"), py::arg("threads") = 1);

  m.def("crc32_rows", [](arr<uint8_t> data, int64_t rows, int threads) {
    need(rows > 0 && data.size() % rows == 0, "crc32_rows: the data must split into `rows` rows of equal length");
    arr<uint32_t> out({static_cast<py::ssize_t>(rows)});
    const int64_t row_bytes = data.size() / rows;
    uint32_t* o = mptr(out);
    py::gil_scoped_release nogil;
    crc32_rows(cptr(data), rows, row_bytes, o, threads);
    return out;
  }, py::arg("data"), py::arg("rows"), py::arg("threads") = 1,
     "uint32 [rows]: crc32 of each of the `rows` equal rows of a contiguous uint8 buffer.");

  m.def("split_histogram", [](arr<uint16_t> w, arr<uint8_t> sm, arr<int64_t> hist, int threads) {
    need(sm.size() == w.size(), "sm plane size mismatch");
    need(hist.size() == HUFF_NUM_CTX * 256, "hist must have HUFF_NUM_CTX*256 entries");
    const int64_t n = w.size();
    py::gil_scoped_release nogil;
    return split_histogram(cptr(w), n, mptr(sm), mptr(hist), threads);
  }, py::arg("w"), py::arg("sm"), py::arg("hist"), py::arg("threads") = 1);

  m.def("huffman_tables", [](arr<int64_t> hist) {
    need(hist.size() == HUFF_NUM_CTX * 256, "hist must have HUFF_NUM_CTX*256 entries");
    arr<uint8_t> lens({HUFF_NUM_CTX, 256});
    arr<uint16_t> codes({HUFF_NUM_CTX, 256});
    uint16_t lut[LUT_SIZE];
    for (int t = 0; t < HUFF_NUM_CTX; ++t) {
      uint8_t* l = lens.mutable_data() + t * 256;
      uint16_t* c = codes.mutable_data() + t * 256;
      code_lengths(cptr(hist) + t * 256, 256, HUFF_MAX_CODE_LEN, l);
      for (int i = 0; i < 256; ++i) c[i] = 0;
      if (!build_lut(l, 256, 0, lut, c)) throw py::value_error("internal: package-merge made an invalid code");
    }
    return py::make_tuple(lens, codes);
  }, "Per-context code lengths and canonical codes, uint8/uint16 [HUFF_NUM_CTX, 256].");

  // (off, stream, chk) of one matrix; chk is the checkpoint index uint16 [n_seg, P], P = 0 when
  // chk_interval is 0 or every segment fits in one chain (FORMAT.md "Checkpoint index").
  auto encode = [](arr<uint16_t> w, int64_t R, int64_t C, arr<uint8_t> lens, arr<uint16_t> codes, int threads,
                   int64_t chk_interval) {
    need(w.ndim() == 2, "w must be 2-D");
    Grid g = make_grid(w.shape(0), w.shape(1), R, C);
    need(lens.size() == HUFF_NUM_CTX * 256 && codes.size() == HUFF_NUM_CTX * 256,
         "lens/codes must have HUFF_NUM_CTX*256 entries");
    need(chk_interval == 0 || (chk_interval > 0 && chk_interval % CHK_ALIGN == 0 && chk_interval <= CHK_MAX_INTERVAL),
         "checkpoint interval must be 0 or a multiple of CHK_ALIGN up to CHK_MAX_INTERVAL");
    const int64_t seg_max = std::min(R, g.rows) * std::min(C, g.cols);
    const int64_t P = chk_interval ? (seg_max + chk_interval - 1) / chk_interval - 1 : 0;
    const int64_t nseg = g.n_groups() * g.n_chunks();
    arr<uint16_t> chk({static_cast<py::ssize_t>(nseg), static_cast<py::ssize_t>(P)});
    std::fill(chk.mutable_data(), chk.mutable_data() + nseg * P, uint16_t(0));
    std::vector<uint32_t> off;
    std::vector<uint8_t> stream;
    {
      py::gil_scoped_release nogil;
      huffman_encode_all(cptr(w), g, cptr(lens), cptr(codes), &off, &stream, threads, chk_interval, P,
                         P ? chk.mutable_data() : nullptr);
    }
    arr<uint32_t> o(static_cast<py::ssize_t>(off.size()));
    std::copy(off.begin(), off.end(), o.mutable_data());
    arr<uint8_t> st(static_cast<py::ssize_t>(stream.size()));
    std::copy(stream.begin(), stream.end(), st.mutable_data());
    return py::make_tuple(o, st, chk);
  };
  m.def("huffman_encode", [encode](arr<uint16_t> w, int64_t R, int64_t C, arr<uint8_t> lens,
                                   arr<uint16_t> codes, int threads) {
    py::tuple t = encode(w, R, C, lens, codes, threads, 0);
    return py::make_tuple(t[0], t[1]);
  }, py::arg("w"), py::arg("R"), py::arg("C"), py::arg("lens"), py::arg("codes"), py::arg("threads") = 1,
     "(off uint32 [n_seg + 1], stream uint8) of a BF16 matrix.");
  m.def("huffman_index", [](arr<uint16_t> w, int64_t R, int64_t C, arr<uint8_t> lens, int threads,
                            int64_t chk_interval) {
    need(w.ndim() == 2, "w must be 2-D");
    Grid g = make_grid(w.shape(0), w.shape(1), R, C);
    need(lens.size() == HUFF_NUM_CTX * 256, "lens must have HUFF_NUM_CTX*256 entries");
    need(chk_interval > 0 && chk_interval % CHK_ALIGN == 0 && chk_interval <= CHK_MAX_INTERVAL,
         "checkpoint interval must be a multiple of CHK_ALIGN up to CHK_MAX_INTERVAL");
    const int64_t seg_max = std::min(R, g.rows) * std::min(C, g.cols);
    const int64_t P = (seg_max + chk_interval - 1) / chk_interval - 1;
    const int64_t nseg = g.n_groups() * g.n_chunks();
    arr<uint16_t> chk({static_cast<py::ssize_t>(nseg), static_cast<py::ssize_t>(P)});
    std::fill(chk.mutable_data(), chk.mutable_data() + nseg * P, uint16_t(0));
    {
      py::gil_scoped_release nogil;
      huffman_index(cptr(w), g, cptr(lens), threads, chk_interval, P, chk.mutable_data());
    }
    return chk;
  }, py::arg("w"), py::arg("R"), py::arg("C"), py::arg("lens"), py::arg("threads"), py::arg("chk_interval"),
     "The checkpoint index uint16 [n_seg, P] huffman_encode_indexed writes for w (lens: uint8 [HUFF_NUM_CTX, "
     "256]), without encoding the stream.");
  m.def("huffman_encode_indexed", encode, py::arg("w"), py::arg("R"), py::arg("C"), py::arg("lens"),
        py::arg("codes"), py::arg("threads"), py::arg("chk_interval"),
        "(off uint32 [n_seg + 1], stream uint8, chk uint16 [n_seg, P]) of a BF16 matrix and its checkpoint index.");

  m.def("huffman_decode", [](arr<uint8_t> stream, arr<uint32_t> off, int64_t rows, int64_t cols,
                             int64_t R, int64_t C, arr<uint8_t> table, int exp_lo, int exp_hi,
                             int64_t g0, int64_t g1, int64_t c0, int64_t c1, arr<uint8_t> sm,
                             arr<uint16_t> out, int threads) {
    Grid g = make_grid(rows, cols, R, C);
    const int64_t nseg = g.n_groups() * g.n_chunks();
    need(off.size() == nseg + 1, "offset table has the wrong number of entries");
    need(0 <= exp_lo && exp_lo <= exp_hi && exp_hi <= 255, "bad exponent range");
    need(table.size() == HUFF_NUM_CTX * (exp_hi - exp_lo + 1), "code table has the wrong size");
    need(0 <= g0 && g0 < g1 && g1 <= g.n_groups() && 0 <= c0 && c0 < c1 && c1 <= g.n_chunks(),
         "segment range out of bounds");
    const int64_t r_first = g0 * R, r_last = std::min(rows, g1 * R);
    const int64_t k_first = c0 * C, k_last = std::min(cols, c1 * C);
    need(sm.ndim() == 2 && out.ndim() == 2, "sm and out must be 2-D");
    need(sm.shape(0) == r_last - r_first && out.shape(0) == r_last - r_first, "row count mismatch");
    need(sm.shape(1) == k_last - k_first && out.shape(1) == k_last - k_first, "column count mismatch");
    std::string err;
    {
      py::gil_scoped_release nogil;
      err = huffman_decode(cptr(stream), stream.size(), cptr(off), g, cptr(table), exp_lo, exp_hi,
                           g0, g1, c0, c1, cptr(sm), sm.shape(1), mptr(out), out.shape(1), threads);
    }
    if (!err.empty()) throw py::value_error(err);
  });

  m.def("palette_encode", [](arr<uint16_t> w, arr<int16_t> map, arr<uint8_t> idx, int threads) {
    need(w.ndim() == 2, "w must be 2-D");
    need(map.size() == 256, "map must have 256 entries");
    const int64_t rows = w.shape(0), cols = w.shape(1);
    need(idx.size() == rows * ((cols + 1) / 2), "idx has the wrong size");
    std::vector<uint32_t> vpos;
    std::vector<uint8_t> vexp;
    {
      py::gil_scoped_release nogil;
      palette_encode(cptr(w), rows, cols, cptr(map), mptr(idx), &vpos, &vexp, threads);
    }
    arr<uint32_t> pos(static_cast<py::ssize_t>(vpos.size()));
    std::copy(vpos.begin(), vpos.end(), pos.mutable_data());
    arr<uint8_t> ex({static_cast<py::ssize_t>(vpos.size()), static_cast<py::ssize_t>(PAL_BLOCK)});
    std::copy(vexp.begin(), vexp.end(), ex.mutable_data());
    return py::make_tuple(pos, ex);
  });

  m.def("palette_decode", [](arr<uint8_t> sm, arr<uint8_t> idx, int64_t rows_total, int64_t cols,
                             int64_t r0, int64_t r1, arr<uint8_t> palette, arr<uint32_t> vpos,
                             arr<uint8_t> vexp, arr<uint16_t> out, int threads) {
    need(0 <= r0 && r0 < r1 && r1 <= rows_total, "row range out of bounds");
    const int64_t n = r1 - r0;
    need(sm.size() == n * cols && out.size() == n * cols, "sm/out size mismatch");
    need(idx.size() == n * ((cols + 1) / 2), "idx size mismatch");
    need(palette.size() >= 1 && palette.size() <= 16, "palette must have 1..16 entries");
    need(vexp.size() == vpos.size() * PAL_BLOCK, "verbatim exponent plane size mismatch");
    std::string err;
    {
      py::gil_scoped_release nogil;
      err = palette_decode(cptr(sm), cptr(idx), rows_total, cols, r0, r1, cptr(palette),
                           static_cast<int>(palette.size()), cptr(vpos), vpos.size(), cptr(vexp),
                           mptr(out), threads);
    }
    if (!err.empty()) throw py::value_error(err);
  });
}
