"""unweight's ops layer: every kernel as a ``torch.ops.unweight.*`` custom op.

This package is the only holder of the native extension handles (``_ext.py``) and the only
place that passes raw device pointers; everything above it (runtime modules, dispatch,
integrations) calls these ops.  Every op has a fake implementation (torch.compile, FakeTensor
tracing, CUDA-graph capture) and a CPU implementation where one exists.

    decode.py     decode_huffman, decode_palette, decode_palette_slots       (out-variant)
    gather.py     gather_rows_huffman, gather_rows_palette                   (embedding lookups)
    matmul.py     palette_matmul, palette_gemv, palette_gemv_slots           (fused decode + GEMM / GEMV)
                  palette_gemv_probe (a plain function: the GEMV with a stage left out, for timing)
    layout.py     tile_palette_planes, untile_palette_planes, paired_palette,
                  remap_index, pair_index, stored_index,
                  split_halves, split_palette_planes                         (the planes' device order)
                  verbatim_rows                                              (the verbatim lists' row index)
    transcode.py  build_lut, exp_histogram, palette_encode, palette_verbatim,
                  transcode_to_palette(), build_index()                      (load time)
    prefetch.py   prefetch_l2                                                (weights into L2 ahead of a matmul)
    checksum.py   crc32_ranges                                               (load-time crc32 where the bytes live)
    run.py        the forward's ops as the runtime calls them: each kernel directly in eager
                  mode, the op wherever torch must see it (_ext.direct)

Importing it imports torch and registers the ops; it never touches a CUDA device.
"""
from ._ext import cuda_available, cuda_kernels_built
from .checksum import crc32_ranges
from .decode import decode_huffman, decode_palette, decode_palette_slots
from .gather import gather_rows_huffman, gather_rows_palette
from .layout import (inverse_nibble_map, pair_index, palette_pairs, paired_palette, remap_index, split_halves,
                     split_palette_planes, stored_index, tile_palette_planes, untile_palette_planes, verbatim_rows)
from .matmul import (palette_counters_elems, palette_gemv, palette_gemv_parts, palette_gemv_probe, palette_gemv_queue,
                     palette_gemv_queue_counters, palette_gemv_queue_units, palette_gemv_queue_workspace,
                     palette_gemv_queue_workspace_max, palette_gemv_slots, palette_gemv_supported, palette_matmul,
                     palette_splits, palette_supported, palette_workspace_elems, palette_workspace_max,
                     programmatic_launch, wgmma_tile_wait, gemv_x_prefetch)
from .prefetch import prefetch_l2
from . import run  # (after the ops it calls are registered)
from .transcode import build_index, build_lut, exp_histogram, palette_encode, palette_verbatim, transcode_to_palette

__all__ = ["cuda_available", "cuda_kernels_built", "decode_huffman", "decode_palette", "decode_palette_slots",
           "gather_rows_huffman", "gather_rows_palette", "palette_matmul", "palette_splits", "palette_supported",
           "palette_gemv", "palette_gemv_parts", "palette_gemv_slots", "palette_gemv_supported", "palette_gemv_queue",
           "palette_gemv_queue_units", "palette_gemv_queue_workspace", "palette_gemv_queue_workspace_max",
           "palette_gemv_queue_counters", "palette_gemv_probe", "programmatic_launch",
           "wgmma_tile_wait", "gemv_x_prefetch",
           "palette_workspace_elems", "palette_workspace_max", "palette_counters_elems", "build_lut", "exp_histogram", "palette_encode",
           "palette_verbatim", "transcode_to_palette", "build_index", "tile_palette_planes", "untile_palette_planes",
           "palette_pairs", "paired_palette",
           "remap_index", "inverse_nibble_map", "pair_index", "stored_index", "split_halves", "split_palette_planes",
           "verbatim_rows", "prefetch_l2", "crc32_ranges", "run"]
