"""The ops as the runtime's forward calls them: each kernel run directly in eager mode, the
``torch.ops.unweight.*`` op itself wherever torch must see it (a compile trace, fake tensors,
a dispatch mode, autograd, the profiler): ``_ext.direct``.  Same arguments, same results as
the ops; only the host time per call differs.

    decode_huffman, decode_palette, decode_palette_slots      (ops/decode.py)
    gather_rows_huffman, gather_rows_palette                  (ops/gather.py)
    palette_matmul, palette_gemv, palette_gemv_queue,
    palette_gemv_slots                                        (ops/matmul.py)
    prefetch_l2                                               (ops/prefetch.py, CUDA only)
"""
import torch

from . import _ext, decode, gather, matmul, prefetch

# Each op with the module that registers its kernels, as _<op>_cpu / _<op>_cuda.
_HOMES = {"decode_huffman": decode, "decode_palette": decode, "decode_palette_slots": decode,
          "gather_rows_huffman": gather, "gather_rows_palette": gather, "palette_matmul": matmul,
          "palette_gemv": matmul, "palette_gemv_queue": matmul, "palette_gemv_slots": matmul,
          "prefetch_l2": prefetch}

__all__ = list(_HOMES)


def _runner(name: str, home):
    kernels = {dev: getattr(home, f"_{name}_{dev}") for dev in ("cpu", "cuda") if hasattr(home, f"_{name}_{dev}")}
    return _ext.direct(getattr(torch.ops.unweight, name), **kernels)


globals().update({name: _runner(name, home) for name, home in _HOMES.items()})
