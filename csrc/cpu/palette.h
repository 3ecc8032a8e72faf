// Palette tier: a 4-bit index per weight into a palette of up to 16 exponents, with
// PAL_BLOCK-weight blocks whose exponents fall outside it stored verbatim.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace unweight {

// Palette encode: map[256] gives the palette index of each exponent or -1.  Writes the nibble
// plane idx [rows][(cols+1)/2] and returns the ids (row * blocks_per_row + block) of the
// verbatim blocks in ascending order; their exponents go to vexp (PAL_BLOCK bytes each).
void palette_encode(const uint16_t* w, int64_t rows, int64_t cols, const int16_t* map,
                    uint8_t* idx, std::vector<uint32_t>* vpos, std::vector<uint8_t>* vexp,
                    int threads);

// Palette decode of rows [r0, r1) (all columns).  `sm`/`idx`/`out` point at row r0.
std::string palette_decode(const uint8_t* sm, const uint8_t* idx, int64_t rows_total,
                           int64_t cols, int64_t r0, int64_t r1, const uint8_t* palette,
                           int pal_size, const uint32_t* vpos, int64_t nverb,
                           const uint8_t* vexp, uint16_t* out, int threads);

}  // namespace unweight
