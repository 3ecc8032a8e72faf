// CRC-32 (zlib's polynomial) of the raw tensor bytes, the checksum the container stores.
#pragma once
#include <cstdint>

namespace unweight {

// crc32 of data[0, nbytes), as zlib's crc32(0, data, nbytes) returns; from 8 MiB the buffer is
// split across `threads` and the pieces' crcs combined.
uint32_t crc32_parallel(const uint8_t* data, int64_t nbytes, int threads);

// out[r] = crc32 of row r's bytes data[r * row_bytes, (r + 1) * row_bytes), r in [0, rows): the
// records a column shard's check combines (one crc per row of a block), rows split across
// `threads`.
void crc32_rows(const uint8_t* data, int64_t rows, int64_t row_bytes, uint32_t* out, int threads);

}  // namespace unweight
