// C++ CPU codec of unweight format v1: raw pointers in, raw pointers out, no Python.
// bindings_cpu.cpp wraps these with argument checks; every function is thread-parallel over
// independent units (segments, row ranges) with `threads` workers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace unweight {

// Splits BF16 words [n] into the sign+mantissa plane and a per-context exponent histogram
// hist[HUFF_NUM_CTX][256].  Returns crc32 of the n*2 input bytes.
uint32_t split_histogram(const uint16_t* w, int64_t n, uint8_t* sm, int64_t* hist, int threads);

uint32_t crc32_parallel(const uint8_t* data, int64_t nbytes, int threads);

// Uninitialized host buffer of at least n bytes for a decoded or split tensor; *cap receives
// its capacity, which host_free(p, cap) needs back.  See cpu_codec.cpp for the policy (malloc,
// or pre-faulted pages with a bounded cache of freed ones); host_cache_clear() unmaps the
// cache and returns the bytes released.
void* host_alloc(size_t n, int threads, size_t* cap);
void host_free(void* p, size_t cap);
size_t host_cache_clear();

// Grid description shared by the Huffman functions.
struct Grid {
  int64_t rows, cols, R, C;
  int64_t n_groups() const { return (rows + R - 1) / R; }
  int64_t n_chunks() const { return (cols + C - 1) / C; }
};

// Optimal length-limited code lengths (package-merge) for counts[n]: out[n] gets 0 for
// absent symbols, 1 for a lone symbol, else a complete code with lengths <= max_len.  Ties
// are broken exactly as unweight/codec/huffman.py does (leaves sorted by (count, symbol),
// leaves before packages of equal weight), so both give the same bytes.
void code_lengths(const int64_t* counts, int n, int max_len, uint8_t* out);

// Encodes every segment (chunk-major order) and returns the byte offsets (n_segments + 1
// entries) and the stream, STREAM_SLACK_BYTES zero bytes included.  lens/codes are
// [HUFF_NUM_CTX][256].
void huffman_encode_all(const uint16_t* w, const Grid& g, const uint8_t* lens, const uint16_t* codes,
                        std::vector<uint32_t>* off, std::vector<uint8_t>* stream, int threads);

// Decodes the segments [g0,g1) x [c0,c1).  `sm` and `out` point at row g0*R, column c0*C of
// the sign+mantissa plane and of the output, with row strides in elements.  `table` holds the
// stored code lengths [HUFF_NUM_CTX][exp_hi-exp_lo+1].  On failure returns a message naming
// the first bad segment; on success an empty string.
std::string huffman_decode(const uint8_t* stream, int64_t stream_bytes, const uint32_t* off,
                           const Grid& g, const uint8_t* table, int exp_lo, int exp_hi,
                           int64_t g0, int64_t g1, int64_t c0, int64_t c1, const uint8_t* sm,
                           int64_t sm_stride, uint16_t* out, int64_t out_stride, int threads);

// Tests: true makes the codec use its baseline builds (x86-64 decode loop without AVX2/BMI2,
// zlib's crc32 instead of the carry-less-multiply one) so both are checked on one machine.
void set_force_baseline_cpu(bool on);

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
