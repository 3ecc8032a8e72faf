"""Shared helpers of the CUDA kernel tests."""
import numpy as np


def make_weights(rows: int, cols: int, seed: int = 0, spread: bool = True) -> np.ndarray:
    """BF16 bit patterns uint16 [rows, cols]: N(0, 0.02) plus, if spread, a sprinkle of
    exponents far outside the bulk (so palette tensors get verbatim blocks) and exact zeros."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    if spread:
        m = rng.random((rows, cols)) < 0.003
        x[m] *= np.exp2(rng.integers(-40, 12, size=int(m.sum()))).astype(np.float32)
        x[rng.random((rows, cols)) < 0.01] = 0.0
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def bf16_to_f64(w: np.ndarray) -> np.ndarray:
    return (w.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
