// Compress side of the Huffman tier: plane split + context histogram, code lengths, and the
// segment encoder.
#pragma once
#include <cstdint>
#include <vector>

#include "grid.h"

namespace unweight {

// Splits BF16 words [n] into the sign+mantissa plane and a per-context exponent histogram
// hist[HUFF_NUM_CTX][256].  Returns crc32 of the n*2 input bytes.
uint32_t split_histogram(const uint16_t* w, int64_t n, uint8_t* sm, int64_t* hist, int threads);

// Optimal length-limited code lengths (package-merge) for counts[n]: out[n] gets 0 for
// absent symbols, 1 for a lone symbol, else a complete code with lengths <= max_len.  Ties
// are broken exactly as unweight/codec/huffman.py does (leaves sorted by (count, symbol),
// leaves before packages of equal weight), so both give the same bytes.
void code_lengths(const int64_t* counts, int n, int max_len, uint8_t* out);

// Encodes every segment (chunk-major order) and returns the byte offsets (n_segments + 1
// entries) and the stream, STREAM_SLACK_BYTES zero bytes included.  lens/codes are
// [HUFF_NUM_CTX][256].  With chk_interval S > 0, chk (n_segments * chk_cols entries, zeroed by
// the caller) receives the checkpoint index (FORMAT.md "Checkpoint index", huffman_index).
void huffman_encode_all(const uint16_t* w, const Grid& g, const uint8_t* lens, const uint16_t* codes,
                        std::vector<uint32_t>* off, std::vector<uint8_t>* stream, int threads,
                        int64_t chk_interval = 0, int64_t chk_cols = 0, uint16_t* chk = nullptr);

// The checkpoint index of w under code lengths lens (chk: n_segments * chk_cols entries,
// zeroed by the caller): row s, entry m-1 is the bit distance from symbol (m-1)*S to symbol
// m*S of segment s, for m*S inside the segment.  A function of the code lengths only, so no
// stream is needed: the encoder, a loader adding the index to a tensor stored without one,
// and a verifier rebuilding a stored one all run this.
void huffman_index(const uint16_t* w, const Grid& g, const uint8_t* lens, int threads, int64_t chk_interval,
                   int64_t chk_cols, uint16_t* chk);

}  // namespace unweight
