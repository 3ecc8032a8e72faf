"""Torch-facing wrappers of the ``unweight._cuda`` kernels (decode, transcode, fused GEMMs).

Planes live on the GPU as torch tensors keyed by suffix (``__sm``, ``__exp`` ...) exactly as
``unweight.codec.tensor_codec`` produces them on the host; ``to_device`` moves them.  uint32
planes travel as int32 tensors (same bits; torch's uint32 support is partial).  Every
function launches on ``torch.cuda.current_stream()`` and, where the kernels count data errors,
synchronizes on the error counter and raises ``FormatError`` -- decode of a corrupt tensor
never returns silently wrong weights.
"""
from __future__ import annotations

import logging

import numpy as np

from ..codec.tensor_codec import choose_palette
from ..format import constants as C
from ..format.errors import FormatError
from ..format.header import TensorHeader
from . import kernel_plan as plan

log = logging.getLogger(__name__)


def _torch():
    import torch  # lazy: importing unweight must not pull in torch
    return torch


def available() -> bool:
    """True when the CUDA extension is built and a CUDA device is visible to torch."""
    try:
        from .. import _cuda
    except ImportError:
        return False
    torch = _torch()
    return torch.cuda.is_available() and _cuda.device_count() > 0


def _ext():
    try:
        from .. import _cuda
    except ImportError as e:
        raise RuntimeError("unweight._cuda is not built (no nvcc at install time?)") from e
    return _cuda


def _stream() -> int:
    return _torch().cuda.current_stream().cuda_stream


def to_device(planes: dict, device="cuda") -> dict:
    """Host NumPy planes -> torch tensors on `device` (uint32 planes as int32, same bits)."""
    torch = _torch()
    out = {}
    for k, a in planes.items():
        a = np.ascontiguousarray(a)
        if a.dtype == np.uint32:
            a = a.view(np.int32)
        out[k] = torch.from_numpy(a).to(device)
    return out


def _check_err(err, what: str) -> None:
    n = int(err.item())  # synchronizes with the stream
    if n:
        raise FormatError(f"{what}: {n} corrupt segment(s)/block(s) found by the GPU decoder")


def palette_bytes(header: TensorHeader) -> bytes:
    return bytes(header.palette[: header.pal_size])


def huffman_lut(header: TensorHeader, device="cuda"):
    """Decode LUT of a Huffman tensor: uint16 (as int16) [4, 4096] on `device`."""
    torch = _torch()
    table = torch.from_numpy(np.ascontiguousarray(header.table, dtype=np.uint8)).to(device)
    lut = torch.empty((C.HUFF_NUM_CTX, 1 << C.HUFF_MAX_CODE_LEN), dtype=torch.int16, device=device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    _ext().huffman_build_lut(table.data_ptr(), header.exp_lo, header.exp_hi, lut.data_ptr(), err.data_ptr(),
                             _stream())
    _check_err(err, "invalid huffman code lengths")
    return lut


def decode_huffman(header: TensorHeader, planes: dict, lut=None, groups=None, chunks=None,
                   exp_only: bool = False):
    """Decode segments groups=[g0,g1) x chunks=[c0,c1) (default: all) on the GPU.

    Returns bf16 [rows, cols] of the rectangle (uint8 exponents if exp_only), on planes' device.
    """
    torch = _torch()
    g0, g1 = groups or (0, header.n_groups)
    c0, c1 = chunks or (0, header.n_chunks)
    R, Cc = header.rows_per_group, header.cols_per_chunk
    r0, r1 = g0 * R, min(header.rows, g1 * R)
    k0, k1 = c0 * Cc, min(header.cols, c1 * Cc)
    sm = planes[C.SUFFIX_SM]
    dev = sm.device
    lut = huffman_lut(header, dev) if lut is None else lut
    out = torch.empty((r1 - r0, k1 - k0), dtype=torch.uint8 if exp_only else torch.bfloat16, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    exp = planes[C.SUFFIX_EXP]
    sm_view = sm[r0:r1, k0:k1]  # strided view: pointer at the rectangle origin, stride = cols
    _ext().huffman_decode(exp.data_ptr(), exp.numel(), planes[C.SUFFIX_OFF].data_ptr(), header.rows, header.cols,
                          R, Cc, lut.data_ptr(), g0, g1, c0, c1, sm_view.data_ptr(), sm.stride(0),
                          out.data_ptr(), out.stride(0), err.data_ptr(), _stream(), exp_only)
    _check_err(err, "corrupt exponent stream")
    return out


def decode_palette(header: TensorHeader, planes: dict, rows=None, cols=None):
    """Decode rows=[r0,r1) x cols=[k0,k1) (default: all) of a palette tensor: bf16 on the GPU."""
    torch = _torch()
    r0, r1 = rows or (0, header.rows)
    k0, k1 = cols or (0, header.cols)
    sm = planes[C.SUFFIX_SM]
    out = torch.empty((r1 - r0, k1 - k0), dtype=torch.bfloat16, device=sm.device)
    err = torch.zeros(1, dtype=torch.int32, device=sm.device)
    vpos, vexp = planes[C.SUFFIX_VPOS], planes[C.SUFFIX_VEXP]
    _ext().palette_decode(sm.data_ptr(), planes[C.SUFFIX_IDX].data_ptr(), header.rows, header.cols, r0, r1, k0, k1,
                          palette_bytes(header), vpos.data_ptr(), vpos.numel(), vexp.data_ptr(), out.data_ptr(),
                          out.stride(0), err.data_ptr(), _stream())
    _check_err(err, "corrupt palette tensor")
    return out


def transcode_to_palette(header: TensorHeader, planes: dict) -> tuple[TensorHeader, dict]:
    """Huffman -> palette on the GPU.  Returns (palette header, GPU planes); bit-identical to
    ``tensor_codec.transcode_to_palette`` (same grid, palette, idx, vpos, vexp)."""
    torch = _torch()
    ext = _ext()
    dev = planes[C.SUFFIX_SM].device
    rows, cols = header.rows, header.cols
    exps = decode_huffman(header, planes, exp_only=True)
    hist = torch.zeros(256, dtype=torch.int64, device=dev)
    ext.exp_histogram(exps.data_ptr(), exps.numel(), hist.data_ptr(), _stream())
    pal = choose_palette(hist.cpu().numpy())  # 16 of 256 bins: host is simplest and exact
    pal_b = bytes(pal.tobytes())
    bpr = plan.blocks_per_row(cols)
    idx = torch.empty((rows, (cols + 1) // 2), dtype=torch.uint8, device=dev)
    flags = torch.empty(rows * bpr, dtype=torch.uint8, device=dev)
    counts = torch.empty(rows, dtype=torch.int32, device=dev)
    offsets = torch.empty(rows + 1, dtype=torch.int32, device=dev)
    ext.palette_encode_pass1(exps.data_ptr(), rows, cols, pal_b, idx.data_ptr(), flags.data_ptr(),
                             counts.data_ptr(), offsets.data_ptr(), _stream())
    nv = int(offsets[rows].item()) & 0xFFFFFFFF
    vpos = torch.empty(nv, dtype=torch.int32, device=dev)
    vexp = torch.empty((nv, C.PAL_BLOCK), dtype=torch.uint8, device=dev)
    ext.palette_encode_pass2(exps.data_ptr(), rows, cols, flags.data_ptr(), offsets.data_ptr(), nv,
                             vpos.data_ptr(), vexp.data_ptr(), _stream())
    hdr = TensorHeader(encoding=C.ENC_PALETTE, rows=rows, cols=cols, rows_per_group=header.rows_per_group,
                       cols_per_chunk=header.cols_per_chunk, crc32=header.crc32, pal_size=len(pal),
                       pal_block=C.PAL_BLOCK, num_verbatim=nv, palette=pal_b.ljust(16, b"\0"))
    out = {C.SUFFIX_HDR: torch.from_numpy(hdr.pack()), C.SUFFIX_SM: planes[C.SUFFIX_SM], C.SUFFIX_IDX: idx,
           C.SUFFIX_VPOS: vpos, C.SUFFIX_VEXP: vexp}
    return hdr, out


def palette_gemm(x, header: TensorHeader, planes: dict, out=None):
    """y = x @ W^T with W palette-coded on the GPU.

    x: bf16 [M, K] CUDA (M <= 16, K % 8 == 0, row stride % 8 == 0).  Returns bf16 [M, N].
    """
    torch = _torch()
    M, K = x.shape
    if not plan.gemm_supported(M, K) or K != header.cols:
        raise ValueError(f"palette_gemm takes x [M<=16, K={header.cols}] with K % 8 == 0, got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    N = header.rows
    y = out if out is not None else torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    vpos, vexp = planes[C.SUFFIX_VPOS], planes[C.SUFFIX_VEXP]
    nv = vpos.numel()
    corr = torch.empty(max(1, nv * M), dtype=torch.float32, device=x.device)
    _ext().palette_gemm(x.data_ptr(), x.stride(0), M, planes[C.SUFFIX_SM].data_ptr(), planes[C.SUFFIX_IDX].data_ptr(),
                        N, K, palette_bytes(header), vpos.data_ptr(), nv, vexp.data_ptr(), corr.data_ptr(),
                        y.data_ptr(), y.stride(0), _stream())
    return y


def huffman_gemm(x, header: TensorHeader, planes: dict, lut=None, out=None, err=None, check: bool = True):
    """y = x @ W^T with W Huffman-coded on the GPU (fused decode, no decoded weight in memory).

    x: bf16 [M, K] CUDA (1 <= M <= 16, unit column stride).  planes: the tensor's CUDA planes
    (``__sm`` uint8 [N, K], ``__exp`` uint8, ``__off`` uint32/int32 [n_seg + 1]); lut: the uint16
    [4, 4096] decode tables (built here when None); out: optional bf16 [M, N] (row stride >= N).
    err: int32 [1] device counter that corrupt segments add to; when None a fresh one is used
    and, with check=True, read back (a sync) so corruption raises FormatError.  Returns bf16
    [M, N].  Workspace: fp32 [ceil(K / C), M, N] from the caching allocator.
    """
    torch = _torch()
    M, K = x.shape
    if K != header.cols or plan.hgemm_mtile(M) == 0:
        raise ValueError(f"huffman_gemm takes x [1<=M<=16, K={header.cols}], got {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    N, R, Cc = header.rows, header.rows_per_group, header.cols_per_chunk
    dev = x.device
    lut = huffman_lut(header, dev) if lut is None else lut
    y = out if out is not None else torch.empty((M, N), dtype=torch.bfloat16, device=dev)
    own_err = err is None
    err = torch.zeros(1, dtype=torch.int32, device=dev) if own_err else err
    part = torch.empty(plan.hgemm_workspace_elems(M, N, K, Cc), dtype=torch.float32, device=dev)
    exp = planes[C.SUFFIX_EXP]
    _ext().huffman_gemm(x.data_ptr(), x.stride(0), M, planes[C.SUFFIX_SM].data_ptr(), exp.data_ptr(), exp.numel(),
                        planes[C.SUFFIX_OFF].data_ptr(), N, K, R, Cc, lut.data_ptr(), part.data_ptr(), y.data_ptr(),
                        y.stride(0), err.data_ptr(), _stream())
    if own_err and check:
        _check_err(err, "corrupt exponent stream")
    return y
