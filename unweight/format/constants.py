"""The one source of every format constant of unweight format v1.

``scripts/gen_constants.py`` renders this module into ``csrc/unweight_constants.h``;
``tests/format/test_constants.py`` fails when the two drift apart.  Change a value here,
regenerate the header, and record the change in docs/FORMAT.md's version log.
"""

# Per-tensor header (the ``<name>__hdr`` uint8 tensor).
MAGIC = b"UNWT"
VERSION_MAJOR = 1
VERSION_MINOR = 2  # what this writer emits (FORMAT.md "Version changes")
# Minor version that introduced an optional feature.  A writer stamps each tensor header with the
# smallest minor whose features that tensor uses, so a tensor without them stays byte-identical
# to what an older writer produced.
MINOR_STACK = 1  # stacked tensors [E, N, K] (header field stack, offset 34)
MINOR_CHK = 2  # the checkpoint index (huffman header field chk_interval, plane __chk)
HEADER_BYTES = 64  # fixed part; the Huffman code-length table follows it

# Stacked tensors (format 1.1): a 3-D tensor [E, N, K] is E matrices in one set of planes; the
# header's uint16 stack field holds E.
MAX_STACK = 0xFFFF

# Encodings of an encoded tensor.
ENC_HUFFMAN = 1
ENC_PALETTE = 2

# Source dtypes an encoded tensor may have had (only BF16 is encoded in v1).
DTYPE_BF16 = 1

# Huffman tier.  The code is length-limited so a GPU can keep a flat 2^12-entry decode
# table per context in shared memory (4 contexts x 4096 x 2 bytes = 32 KiB).
HUFF_MAX_CODE_LEN = 12
# The exponent's code table is selected by the top two mantissa bits of the same weight,
# which the decoder already has from the sign+mantissa plane (see FORMAT.md, "Contexts").
HUFF_NUM_CTX = 4
HUFF_CTX_SHIFT = 5  # ctx = (sm_byte >> HUFF_CTX_SHIFT) & (HUFF_NUM_CTX - 1)
# Zero bytes appended after the last segment so decoders may load 8 bytes past any position.
STREAM_SLACK_BYTES = 8

# Checkpoint index (format 1.2): the bit offset of every CHK-th symbol of a segment, as uint16
# deltas, so a GPU decoder starts one independent chain per S symbols instead of one per
# segment.  S comes from the header (chk_interval, 0 = no index); FORMAT.md "Checkpoint index"
# derives the writer default from the per-symbol latency of a decode chain.
DEFAULT_CHK_INTERVAL = 1024
# The interval the GPU loaders give an index-free huffman weight at load (memory only, never
# written): 4x the index of DEFAULT_CHK_INTERVAL (~0.056 bit per weight) for 4x the chains.
# H100, 4096 x 4096, kernel time under ncu: 179 us at S=1024, 74 us at S=256, 81 us at S=128
# (the grid is then capped by occupancy), 1.27 ms without an index.
LOAD_CHK_INTERVAL = 256
CHK_ALIGN = 16  # S is a multiple of this, so every chain starts 16-weight aligned in its segment
CHK_MAX_INTERVAL = 4096  # S * HUFF_MAX_CODE_LEN bits must fit a uint16 delta (4096 * 12 < 65536)

# Palette tier.
PAL_MAX_ENTRIES = 16
PAL_BLOCK = 32  # verbatim granularity: weights of one row (one warp's worth on a GPU)

# Writer policy defaults (not normative: readers take R and C from the header).
DEFAULT_SEGMENT_WEIGHTS = 8192
MIN_ENCODED_WEIGHTS = 4096

# Suffixes of the plane tensors that replace an encoded tensor ``<name>`` in a shard.
SUFFIX_HDR = "__hdr"
SUFFIX_SM = "__sm"
SUFFIX_EXP = "__exp"
SUFFIX_OFF = "__off"
SUFFIX_IDX = "__idx"
SUFFIX_VPOS = "__vpos"
SUFFIX_VEXP = "__vexp"
SUFFIX_CHK = "__chk"  # optional huffman plane (1.2): present exactly when chk_interval > 0
HUFFMAN_PLANES = (SUFFIX_HDR, SUFFIX_SM, SUFFIX_EXP, SUFFIX_OFF)
PALETTE_PLANES = (SUFFIX_HDR, SUFFIX_SM, SUFFIX_IDX, SUFFIX_VPOS, SUFFIX_VEXP)
HUFFMAN_OPTIONAL_PLANES = (SUFFIX_CHK,)  # a huffman tensor may carry these (header says which)
ALL_SUFFIXES = (SUFFIX_HDR, SUFFIX_SM, SUFFIX_EXP, SUFFIX_OFF, SUFFIX_IDX, SUFFIX_VPOS, SUFFIX_VEXP, SUFFIX_CHK)

# Checkpoint-level identifiers.
QUANT_METHOD = "unweight"
FORMAT_VERSION = f"{VERSION_MAJOR}.{VERSION_MINOR}"
REPORT_NAME = "unweight_report.json"
INDEX_NAME = "model.safetensors.index.json"

# Names exported to the generated C++ header, in order.
CPP_EXPORTS = (
    "VERSION_MAJOR", "VERSION_MINOR", "HEADER_BYTES", "ENC_HUFFMAN", "ENC_PALETTE",
    "DTYPE_BF16", "HUFF_MAX_CODE_LEN", "HUFF_NUM_CTX", "HUFF_CTX_SHIFT",
    "STREAM_SLACK_BYTES", "PAL_MAX_ENTRIES", "PAL_BLOCK", "DEFAULT_CHK_INTERVAL", "LOAD_CHK_INTERVAL", "CHK_ALIGN",
    "CHK_MAX_INTERVAL",
)
