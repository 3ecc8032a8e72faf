"""Shared helpers of the CUDA kernel tests and of scripts/gpu_check.py.

Host-only functions (weights, bit conversions, error bounds) import NumPy alone; the device
helpers import torch and the ops layer when called, so this module is importable on a
machine without CUDA (the GPU tests are then collected and skipped).
"""
from __future__ import annotations

import contextlib

import numpy as np

# Values that a kernel never writes: decoded outputs are poisoned with each in turn, so an
# element the kernel skipped cannot match the expected bits by luck.
POISONS = (0x5555, 0xAAAA)


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


def all_bf16_patterns(rows: int = 256, seed: int = 7) -> np.ndarray:
    """uint16 [rows, 65536 // rows]: every BF16 bit pattern exactly once (NaNs, infinities,
    subnormals, both zeros), shuffled so every segment sees a mix."""
    w = np.random.default_rng(seed).permutation(65536).astype(np.uint16)
    return w.reshape(rows, 65536 // rows)


def aligned(a: np.ndarray, align: int = 256) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts on an `align`-byte boundary, as cudaMalloc
    places device buffers: the emulator's access profile counts 32-byte sectors by address."""
    a = np.ascontiguousarray(a)
    buf = np.empty(a.nbytes + align, np.uint8)
    off = -buf.ctypes.data % align
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@contextlib.contextmanager
def access_profile(cuda_module):
    """Profiles the emulated launches inside the block (``cuda_module.emu_profile``, the
    extension's binding of warp_emu.h's profile()); yields a dict that receives the totals,
    {kind: {requests, units, ideal, bytes, worse, max_degree}, worst}, when the block ends.
    The profile is switched off again however the block ends."""
    cuda_module.emu_profile(True)
    totals: dict = {}
    try:
        yield totals
    finally:
        totals.update(cuda_module.emu_profile(False))


def bf16_to_f64(w: np.ndarray) -> np.ndarray:
    return (w.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def max_abs_err(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max()) if y.size else 0.0


def fused_bound(err_cublas: float, ref: np.ndarray) -> float:
    """The accuracy bar of a fused kernel: 2x cuBLAS BF16's own max error against the same fp64
    reference (flash-attention's rule), plus 1/1000 of a bf16 ulp of the largest output so an
    exact cuBLAS result does not demand an exact kernel."""
    return 2.0 * err_cublas + 2.0 ** -18 * (float(np.abs(ref).max()) if ref.size else 0.0)


# --------------------------------------------------------------------------- device helpers


def bits(t) -> np.ndarray:
    """uint16 bit patterns of a bf16 / uint16 tensor on any device (host NumPy copy)."""
    import torch
    return t.detach().view(torch.int16).cpu().numpy().view(np.uint16)


def bf16_tensor(w: np.ndarray, device):
    """bf16 tensor on `device` holding the bit patterns w (uint16)."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(w).view(np.int16)).to(device).view(torch.bfloat16)


def device_planes(planes: dict, device) -> dict:
    """{suffix: tensor on device} of host planes (uint8 / uint32 NumPy arrays)."""
    import torch
    return {s: torch.from_numpy(np.ascontiguousarray(a)).to(device) for s, a in planes.items()}


def encoded_weight(enc, device, err=None):
    """EncodedWeight of a host ``tensor_codec.Encoded`` on `device` (CUDA: decode tables built).

    err: int32 [1] device counter that the table build adds invalid code lengths to (default:
    the runtime's per-device counter)."""
    from unweight.format import constants as C
    from unweight.runtime import scratch
    from unweight.runtime.weights import EncodedWeight, hold_row_index
    h = enc.header
    planes = device_planes(enc.planes, device)
    err = scratch.error_counter(device) if err is None else err
    table, lut = device_lut(h, device, err) if h.encoding == C.ENC_HUFFMAN else (None, None)
    # (as the loaders hold it: a CUDA palette weight with its verbatim row index)
    return hold_row_index(EncodedWeight.from_header(h, planes, table, lut))


def device_lut(header, device, err):
    """(code lengths uint8 [4, n], decode tables uint16 [4, 4096]) of a huffman header on
    `device`: the tables built there on CUDA (invalid lengths counted on err), empty elsewhere,
    where the CPU decoder builds its own from the code lengths."""
    import torch

    from unweight import ops
    table = torch.from_numpy(np.ascontiguousarray(header.table, dtype=np.uint8)).to(device)
    lut = (ops.build_lut(table, header.exp_lo, header.exp_hi, err) if torch.device(device).type == "cuda"
           else torch.empty(0, dtype=torch.uint16))
    return table, lut


def huffman_planes(enc, w) -> dict:
    """{suffix: tensor} of a Huffman tensor on w's device for ops.transcode_to_palette: w's
    sm / exp / off planes, the others (header, checkpoint index) moved there."""
    from unweight.format import constants as C
    out = device_planes({s: a for s, a in enc.planes.items()
                         if s not in (C.SUFFIX_SM, C.SUFFIX_EXP, C.SUFFIX_OFF)}, w.device)
    out.update({C.SUFFIX_SM: w.sm, C.SUFFIX_EXP: w.exp, C.SUFFIX_OFF: w.off})
    return out


def decode_op(w, out, err, variant: int = 0) -> None:
    """Run the decode op of w's encoding into `out` (bf16 [rows, cols], or uint8 for the
    Huffman exponent bytes); variant: the decoder (kernel_plan.HUFF_VARIANTS or PAL_VARIANTS
    by w's encoding, 0 the default)."""
    import torch
    if w.is_huffman:
        # The checkpoint index, when w has one: the kernel then decodes S-weight chains.
        torch.ops.unweight.decode_huffman(w.sm, w.exp, w.off, w.table, w.lut, out, err, w.rows, w.cols,
                                          w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi, w.chk,
                                          w.chk_interval, variant)
    else:
        torch.ops.unweight.decode_palette(w.sm, w.idx, w.vpos, w.vexp, out, err, w.rows, w.cols, w.palette, variant,
                                          w.tiled)


def gather_op(w, ids, err):
    """Rows ids (int tensor on w's device) of w through its row-gather op: bf16 [ids.numel(), cols]."""
    import torch
    if w.is_huffman:
        return torch.ops.unweight.gather_rows_huffman(ids, w.sm, w.exp, w.off, w.table, w.rows, w.cols,
                                                      w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi,
                                                      w.lut, err, w.chk, w.chk_interval)
    return torch.ops.unweight.gather_rows_palette(ids, w.sm, w.idx, w.vpos, w.vexp, w.rows, w.cols, w.palette, err)


def without_index(w):
    """The same EncodedWeight with its checkpoint index dropped (one chain per segment), to
    compare the kernel's two ways of cutting the work."""
    from unweight.runtime.weights import EncodedWeight
    return EncodedWeight(w.encoding, w.rows, w.cols, w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi,
                         w.palette, w.sm, exp=w.exp, off=w.off, table=w.table, lut=w.lut, idx=w.idx, vpos=w.vpos,
                         vexp=w.vexp, name=w.name)


def decode_poisoned(w, err, variant: int = 0) -> list:
    """Decode w once per poison value into a poisoned bf16 buffer; returns the uint16 results."""
    import torch
    outs = []
    for p in POISONS:
        out = torch.full((w.rows, w.cols), p - 65536 if p >= 32768 else p, dtype=torch.int16,
                         device=w.device).view(torch.bfloat16)
        decode_op(w, out, err, variant)
        outs.append(bits(out))
    return outs


def fused_paths() -> dict:
    """{encoding: dispatch path} of the fused decode + GEMM kernels this build registers."""
    import torch

    import unweight.ops  # noqa: F401  (registers the ops)
    out = {}
    if hasattr(torch.ops.unweight, "palette_matmul"):
        out["palette"] = "palette_gemm"
    if hasattr(torch.ops.unweight, "huffman_matmul"):
        out["huffman"] = "huffman_gemm"
    return out


def fused_supported(w, M: int) -> bool:
    """Whether the fused kernel of w's encoding documents that it takes batch M (kernel_plan)."""
    from unweight import ops
    from unweight.runtime import kernel_plan as kp
    if w.is_huffman:
        f = getattr(kp, "huffman_gemm_supported", None)
        return bool(f and f(M, w.cols, w.cols_per_chunk))
    if hasattr(ops, "palette_supported"):
        return bool(ops.palette_supported(M, w.cols))
    return bool(kp.gemm_supported(M, w.cols))


def fused_op(w, x, err=None, path=None):
    """y = x @ W^T through the fused kernel of w's encoding (or the fused `path`, e.g. the wide
    palette GEMM), via the runtime's one entry point (unweight.runtime.dispatch.fused: its
    workspaces, its error counter).  bf16 [M, rows]."""
    from unweight.runtime import dispatch
    return dispatch.fused(w, x, path or fused_paths().get(w.encoding_name, w.encoding_name + "_gemm"))


@contextlib.contextmanager
def _setting(name: str, on: bool):
    """ops.<name> (a process-wide switch) set to `on` inside the block (yields the setting in
    effect; False without the CUDA kernels), the previous setting restored after."""
    from unweight import ops
    switch = getattr(ops, name)
    before = switch()
    try:
        yield switch(on)
    finally:
        switch(before)


def programmatic(on: bool):
    """ops.programmatic_launch set to `on` inside the block (see _setting)."""
    return _setting("programmatic_launch", on)


def wgmma_tile_wait(on: bool):
    """ops.wgmma_tile_wait (the wgmma GEMM's schedule) set to `on` inside the block (see _setting)."""
    return _setting("wgmma_tile_wait", on)


def gemv_x_prefetch(on: bool):
    """ops.gemv_x_prefetch (the tensor-core GEMVs' L1 prefetch of x) set to `on` inside the block
    (see _setting)."""
    return _setting("gemv_x_prefetch", on)


def graph_replays_bitwise(fn, want, replays: int = 3) -> bool:
    """fn() captured in a CUDA graph and replayed `replays` times: whether every replay's output
    (a tensor) has want's bits."""
    import torch
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    same = True
    for _ in range(replays):
        g.replay()
        torch.cuda.synchronize()
        same &= bool(torch.equal(out.view(torch.int16), want.view(torch.int16)))
    return same


def emulate_fused(enc, xb: np.ndarray, device) -> np.ndarray:
    """Host emulation of the fused kernel's bodies (unweight._cuda.emulate_*_gemm) for the host
    encoding `enc` and x bits xb uint16 [M, K]: y bits uint16 [M, rows], what the device must
    produce bit for bit."""
    from unweight import ops
    from unweight.format import constants as C
    from unweight.ops import _ext
    cu, h, p = _ext.cuda_module(), enc.header, enc.planes
    if h.encoding == C.ENC_HUFFMAN:
        y, nerr = cu.emulate_huffman_gemm(xb, p[C.SUFFIX_SM], p[C.SUFFIX_EXP], p[C.SUFFIX_OFF], h.rows_per_group,
                                          h.cols_per_chunk, h.table, h.exp_lo, h.exp_hi)
        if nerr:
            raise ValueError(f"emulation counted {nerr} corrupt segments")
        return y
    args = (xb, p[C.SUFFIX_SM], p[C.SUFFIX_IDX], bytes(h.palette[: h.pal_size]), p[C.SUFFIX_VPOS], p[C.SUFFIX_VEXP])
    if hasattr(ops, "palette_splits"):  # the split-K kernel: emulate the device's split count
        y = cu.emulate_palette_gemm(*args, ops.palette_splits(h.rows, h.cols, device), False)
    else:
        y = cu.emulate_palette_gemm(*args)
    return y[0] if isinstance(y, tuple) else y


def bf16_ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between BF16 bit patterns a and b (uint16, same shape): the
    distance along the ordered line of BF16 values (-0 and +0 are 0 apart).  int64, a's shape."""
    def ordered(u):
        u = u.astype(np.int64)
        return np.where(u & 0x8000, 0x8000 - u, u)  # negatives mirror below +0 (0x8000 maps to 0)
    return np.abs(ordered(a) - ordered(b))


# The host emulation runs the kernel's body with each mma.sync's 16 products and accumulator
# summed exactly and rounded to fp32 once; the tensor cores round their fp32 accumulation their
# own way, and over a K/16-long chain of mma instructions the last-bit differences can add up.
# Measured on an H100 (K=512): 1 of 4800 outputs differed at M=16, 3 of 19200 at M=64, by at
# most 2 BF16 ulps.  A logic error (a wrong fragment, palette entry, verbatim patch or split)
# moves most outputs, and by far more, so the check allows a few ulps in under 1% of outputs.
EMULATION_ULPS = 4


def fused_vs_cublas(w, x, w_ref, err, path=None) -> dict:
    """Accuracy of the fused kernel (or fused `path`) against cuBLAS BF16 on the same weights:
    max errors of both against a float64 reference, the bound, and whether a repeat is bitwise
    equal.  w_ref: the weights as uint16 bit patterns (NumPy) or a bf16 tensor on x's device."""
    import torch
    y = fused_op(w, x, err, path)
    y2 = fused_op(w, x, err, path)
    wt = w_ref if isinstance(w_ref, torch.Tensor) else bf16_tensor(w_ref, x.device)
    y_cublas = x @ wt.T
    ref = (x.double() @ wt.double().T).cpu().numpy()
    got = y.double().cpu().numpy()
    e_k, e_c = max_abs_err(got, ref), max_abs_err(y_cublas.double().cpu().numpy(), ref)
    bound = fused_bound(e_c, ref)
    rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))
    return {"max_err": e_k, "max_err_cublas": e_c, "bound": bound, "rel_err": rel,
            "finite": bool(np.isfinite(got).all()), "deterministic": bool(torch.equal(y.view(torch.int16),
                                                                                     y2.view(torch.int16))),
            "passed": bool(np.isfinite(got).all() and e_k <= bound and torch.equal(y.view(torch.int16),
                                                                                   y2.view(torch.int16)))}
