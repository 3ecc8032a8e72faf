// Segment grid of a Huffman-coded matrix (FORMAT.md "The segment grid"), shared by the encoder
// and the decoder: rows x cols weights cut into row groups of R rows and column chunks of C.
#pragma once
#include <cstdint>

namespace unweight {

struct Grid {
  int64_t rows, cols, R, C;
  int64_t n_groups() const { return (rows + R - 1) / R; }
  int64_t n_chunks() const { return (cols + C - 1) / C; }
};

}  // namespace unweight
