// Decompress side of the Huffman tier.
#pragma once
#include <cstdint>
#include <string>

#include "grid.h"

namespace unweight {

// Decodes the segments [g0,g1) x [c0,c1).  `sm` and `out` point at row g0*R, column c0*C of
// the sign+mantissa plane and of the output, with row strides in elements.  `table` holds the
// stored code lengths [HUFF_NUM_CTX][exp_hi-exp_lo+1].  On failure returns a message naming
// the first bad segment; on success an empty string.
std::string huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           const Grid& g, const uint8_t* table, int exp_lo, int exp_hi,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out, int64_t out_stride, int threads);

}  // namespace unweight
