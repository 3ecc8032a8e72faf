"""The single dispatch point between compressed weights and the ops that run them.

Every compressed layer, a transformers module (runtime/modules.py) or a vLLM layer
(integrations/vllm), is a list of EncodedWeight pieces stacked along rows (one piece, or the
q/k/v pieces of a merged projection) plus the padded row count the layer presents.

    linear(pieces, x, bias, out_rows, cols, policy)  ->  y [..., out_rows]
    embedding(pieces, ids, out_rows, cols)           ->  e [..., cols]
    decode_into(pieces, out, out_rows, cols, policy) ->  the decoded [out_rows, cols] weight

The baseline is "decode into the per-device scratch (runtime/scratch.py), then the policy's
dense GEMM"; the policy (runtime/policy.py) may pick a fused kernel on CUDA for each piece
(by the piece's shape: the q, k and v pieces of one layer may go different ways, their
outputs side by side), and a fused launcher that refuses the problem falls back to the
baseline with one warning.  A layer no piece of which takes a fused kernel is decoded whole
and multiplied once.  Nothing here allocates a weight, syncs with the host or polls the error counter,
so forwards are CUDA-graph capturable.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import ops
from ..format.header import TensorHeader
from . import kernel_plan as kp
from . import scratch
from .policy import (DECODE_CUBLAS, GEMV_PATHS, PALETTE_GEMM, PALETTE_GEMM_WG, PALETTE_GEMM_WIDE, PALETTE_GEMM_XS,
                     PALETTE_GEMV_MMA_QUEUE, DispatchPolicy)
from .weights import EncodedWeight

__all__ = ["linear", "linear_group", "embedding", "decode_into", "decode_new", "fused", "use_decoders", "decoder_variant",
           "palette_variant"]

_DECODE_ONLY = DispatchPolicy(None)

# Copy layout of each fused path: ops.palette_matmul's (stage_tiles, x_shared, wgmma).
_LAYOUT = {PALETTE_GEMM: (1, False, False), PALETTE_GEMM_WIDE: (kp.PMMA_SUB_WIDE, False, False),
           PALETTE_GEMM_XS: (1, True, False), PALETTE_GEMM_WG: (1, True, True)}


# The CUDA decoder each encoding runs: a variant of kernel_plan.HUFF_VARIANTS / PAL_VARIANTS,
# 0 for the policy's choice (the variant its table measured fastest for the weight, else the
# extension's default).  Every variant writes the same bits; use_decoders() fixes one
# process-wide so that a benchmark can time them end to end.
_DECODERS = {"huffman": 0, "palette": 0}


def use_decoders(huffman: str | int | None = None, palette: str | int | None = None) -> dict:
    """Set the CUDA decoder variants by name ("chain", "ahead", "ahead2", "ring", "ring_wide",
    "ring_max", "pair"; "vec8", "wide") or number (0: the policy's measured choice, else the extension's
    default); None leaves one as it is.  Returns the previous setting, which
    use_decoders(**previous) restores.  A forward captured in a CUDA graph keeps the variant
    it was captured with."""
    prev = dict(_DECODERS)
    for enc, v, names in (("huffman", huffman, kp.HUFF_VARIANTS), ("palette", palette, kp.PAL_VARIANTS)):
        if v is None:
            continue
        if isinstance(v, str):
            if v not in names:
                raise ValueError(f"unknown {enc} decoder {v!r}; one of {sorted(names)}")
            v = names[v]
        if v != 0 and v not in names.values():
            raise ValueError(f"unknown {enc} decoder variant {v}")
        _DECODERS[enc] = int(v)
    return prev


def palette_variant() -> int:
    """The palette decoder variant use_decoders fixed (0: the extension's default), for decodes
    that no weight's measurement covers (runtime/expert_slots.py)."""
    return _DECODERS["palette"]


def decoder_variant(w: EncodedWeight | TensorHeader, device: torch.device, policy: DispatchPolicy | None) -> int:
    """The CUDA decoder variant w (a weight, or the header of one being transcoded at load) is
    decoded with on `device`: the one use_decoders fixed, else the policy's measured choice,
    else 0 (the extension's default)."""
    return _DECODERS[w.encoding_name] or (policy.decoder(w, device) if policy is not None else 0)


def decoder_name(w: EncodedWeight | TensorHeader, device: torch.device, policy: DispatchPolicy | None) -> str:
    """The name (kernel_plan.HUFF_VARIANTS / PAL_VARIANTS) of the decoder decoder_variant picks."""
    huff = w.encoding_name == "huffman"
    v = decoder_variant(w, device, policy) or (kp.HUFF_DEFAULT_VARIANT if huff else kp.PAL_DEFAULT_VARIANT)
    return next((n for n, x in (kp.HUFF_VARIANTS if huff else kp.PAL_VARIANTS).items() if x == v), str(v))


def _decode_piece(w: EncodedWeight, out: Tensor, err: Tensor, policy: DispatchPolicy | None) -> None:
    v = decoder_variant(w, out.device, policy)
    if w.is_huffman:
        ops.run.decode_huffman(w.sm, w.exp, w.off, w.table, w.lut, out, err, w.rows, w.cols,
                               w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi, w.chk,
                               w.chk_interval, v)
    else:
        ops.run.decode_palette(w.sm, w.idx, w.vpos, w.vexp, out, err, w.rows, w.cols, w.palette, v,
                               w.tiled)


def decode_into(pieces: list, out: Tensor, out_rows: int, cols: int, policy: DispatchPolicy | None = None) -> Tensor:
    """Decode the pieces, stacked, into the first out_rows*cols words of `out` (bf16, the
    pieces' device); rows past the pieces (vocab padding) are zero.  Returns the
    [out_rows, cols] view.  policy: picks each piece's CUDA decoder variant from its
    measurements (None: the extension's default; the same bits either way)."""
    w = out[: out_rows * cols].view(out_rows, cols)
    err = scratch.error_counter(w.device)
    r = 0
    for p in pieces:
        _decode_piece(p, w[r:r + p.rows], err, policy)
        r += p.rows
    if r < out_rows:
        w[r:].zero_()
    return w


def decode_new(pieces: list, out_rows: int, cols: int, policy: DispatchPolicy | None = None) -> Tensor:
    """The decoded weight as a new bf16 [out_rows, cols] tensor (load-time dense conversion)."""
    dev = pieces[0].device
    return decode_into(pieces, torch.empty(out_rows * cols, dtype=torch.bfloat16, device=dev), out_rows, cols,
                       policy)


def fused(w: EncodedWeight, x2: Tensor, path: str = PALETTE_GEMM) -> Tensor:
    """y = x2 @ W^T through the fused palette GEMM (`path`: PALETTE_GEMM, PALETTE_GEMM_WIDE for
    its two-tile copy stages, or PALETTE_GEMM_XS for x shared per CTA; the same bits; or
    PALETTE_GEMM_WG, x shared per CTA and multiplied by wgmma, sm_90a) or, with
    PALETTE_GEMV, the palette GEMV (batch 1..4; its own order of sums), or PALETTE_GEMV_DEEP /
    PALETTE_GEMV_STAGED, its variants with more loads in flight (the GEMV's bits), or
    PALETTE_GEMV_MMA, the tensor-core GEMV (batch 1..32; tensor-core sums), or
    PALETTE_GEMV_MMA_STAGED / PALETTE_GEMV_MMA_PREFETCH, its loads through shared-memory rings
    or ahead of an L2 prefetch (its bits), or PALETTE_GEMV_MMA_BULK, its steps fetched by the
    copy engine (its bits; sm_90+, tile-major weights only), or PALETTE_GEMV_MMA_QUEUE, its steps
    in units handed out from a queue (its own unit count's sums).  x2: bf16
    [M, cols] unit column stride, on W's CUDA device.
    The split partials and arrival counters are views of the device's scratch, sized for every
    batch the kernel takes, so only a layer shape's first fused forward can grow them.  Raises
    what the op raises when the kernel refuses."""
    if (path not in _LAYOUT and path not in GEMV_PATHS) or w.is_huffman:
        raise ValueError(f"no fused kernel {path!r} for a {w.encoding_name} weight")
    dev = x2.device
    if path == PALETTE_GEMV_MMA_QUEUE:
        ws = scratch.workspace(dev, ops.palette_gemv_queue_workspace_max(w.rows, w.cols, dev))
        cnt = scratch.counters(dev, ops.palette_gemv_queue_counters(w.rows))
        return ops.run.palette_gemv_queue(x2, w.sm, w.idx, w.vpos, w.vexp, ws, cnt, w.rows, w.cols,
                                          w.palette, ops.palette_gemv_queue_units(w.rows, w.cols, dev),
                                          w.tiled, w.vrow)
    if path in GEMV_PATHS:
        v = GEMV_PATHS[path]
        return ops.run.palette_gemv(x2, w.sm, w.idx, w.vpos, w.vexp, w.rows, w.cols, w.palette,
                                    ops.palette_gemv_parts(w.rows, w.cols, dev, v), v, w.tiled, w.vrow)
    stage_tiles, x_shared, wgmma = _LAYOUT[path]
    splits = ops.palette_splits(w.rows, w.cols, dev, x2.size(0), wgmma)
    ws = scratch.workspace(dev, ops.palette_workspace_max(w.rows, w.cols, dev))
    cnt = scratch.counters(dev, ops.palette_counters_elems(w.rows))
    return ops.run.palette_matmul(x2, w.sm, w.idx, w.vpos, w.vexp, ws, cnt, w.rows, w.cols, w.palette,
                                  splits, stage_tiles, x_shared, tiled=w.tiled, wgmma=wgmma, vrow=w.vrow)


class _RedecodingLinear(torch.autograd.Function):
    """y = x @ W.T + b for an x (or b) that autograd tracks: the forward is the one an untracked
    x gets (fused kernel or decode + GEMM), so grad mode never changes the result.  The decoded
    weight lives in the scratch, which the next layer overwrites, so saving it for the backward
    would fail there (torch's "modified by an inplace operation"); the backward decodes it
    again instead, so a backward through compressed layers keeps no decoded weight per layer."""

    @staticmethod
    def forward(ctx, x, bias, pieces, out_rows, cols, policy):
        ctx.pieces, ctx.out_rows, ctx.cols, ctx.policy = pieces, out_rows, cols, policy
        ctx.has_bias = bias is not None
        return _linear(pieces, x, bias, out_rows, cols, policy)

    @staticmethod
    def backward(ctx, gy):
        gx = gb = None
        if ctx.needs_input_grad[0]:
            w = decode_into(ctx.pieces, scratch.weights(gy.device, ctx.out_rows * ctx.cols), ctx.out_rows, ctx.cols,
                            ctx.policy)
            gx = gy.matmul(w if w.dtype == gy.dtype else w.to(gy.dtype))
        if ctx.has_bias and ctx.needs_input_grad[1]:
            gb = gy.reshape(-1, gy.shape[-1]).sum(0)
        return gx, gb, None, None, None, None


def linear(pieces: list, x: Tensor, bias: Tensor | None, out_rows: int, cols: int,
           policy: DispatchPolicy | None = None) -> Tensor:
    """y = x @ W.T + b.  x: [..., cols] on the pieces' device; y: [..., out_rows] in x's dtype
    (a non-bf16 x, e.g. a model cast to fp32, multiplies with a converted copy of W).  When
    autograd tracks x or b, the same y with a backward that gives their gradients (the
    compressed weight itself takes none)."""
    policy = policy or _DECODE_ONLY
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return _RedecodingLinear.apply(x, bias, pieces, out_rows, cols, policy)
    return _linear(pieces, x, bias, out_rows, cols, policy)


def _rows(x: Tensor, M: int, cols: int) -> Tensor:
    """x [..., cols] as the [M, cols] rows a fused kernel takes (unit column stride)."""
    x2 = x.reshape(M, cols)
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def _linear(pieces: list, x: Tensor, bias: Tensor | None, out_rows: int, cols: int,
            policy: DispatchPolicy) -> Tensor:
    """linear() without autograd: the fused kernel for each piece the policy picks one for,
    else decode + GEMM.  A layer whose pieces all take decode + GEMM is decoded whole and
    multiplied once: the original model's bits."""
    if x.dtype == torch.bfloat16 and out_rows == sum(p.rows for p in pieces):
        M = x.numel() // cols if cols else 0
        paths = [policy.linear_path(p, M, x.device) for p in pieces]  # decode + cuBLAS off CUDA
        if any(path != DECODE_CUBLAS for path in paths):
            x2 = _rows(x, M, cols)
            ys, r = [], 0
            for p, path in zip(pieces, paths):
                ys.append(_piece_linear(p, x2, None if bias is None else bias[r:r + p.rows], path, policy))
                r += p.rows
            y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
            return y.view(*x.shape[:-1], out_rows)
    w = decode_into(pieces, scratch.weights(x.device, out_rows * cols), out_rows, cols, policy)
    if w.dtype != x.dtype:
        w = w.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
    return policy.dense_linear(x, w, bias)


def linear_group(w: EncodedWeight, x: Tensor, rows: list, biases: list, policy: DispatchPolicy | None = None):
    """The outputs of stacked sibling projections (runtime/siblings.py) on one input: x [..., cols]
    bf16 on w's device, w the stacked [sum(rows), cols] palette weight, biases one per member
    (or None) -> [y_i [..., rows[i]]], column views of one result where no bias is added; None
    where the group cannot run (another dtype, a tracked x): each member then runs alone.
    A fused kernel multiplies the whole stack once; decode + GEMM decodes it once and multiplies
    member by member, so each member gets the original model's bits."""
    policy = policy or _DECODE_ONLY
    cols = w.cols
    if x.dtype != torch.bfloat16 or x.shape[-1] != cols or (torch.is_grad_enabled() and x.requires_grad):
        return None
    M = x.numel() // cols if cols else 0
    lead = x.shape[:-1]
    path = policy.linear_path(w, M, x.device)
    if path != DECODE_CUBLAS:
        try:
            y = fused(w, _rows(x, M, cols), path)
        except (ValueError, RuntimeError) as e:
            policy.refuse(w, M, x.device, path, str(e))
        else:
            outs, r = [], 0
            for n, b in zip(rows, biases):
                o = y[:, r:r + n]
                outs.append((o if b is None else o + b.to(o.dtype)).view(*lead, n))
                r += n
            return outs
    wd = decode_into([w], scratch.weights(x.device, w.rows * cols), w.rows, cols, policy)
    outs, r = [], 0
    for n, b in zip(rows, biases):
        outs.append(policy.dense_linear(x, wd[r:r + n], b))
        r += n
    return outs


def _piece_linear(w: EncodedWeight, x2: Tensor, bias: Tensor | None, path: str, policy: DispatchPolicy) -> Tensor:
    """x2 @ W^T (+ b) for one piece: bf16 x2 [M, cols] -> [M, w.rows].  The fused kernel when
    `path` names one and it takes the problem (a refusal is remembered: decode + GEMM from then
    on); otherwise the piece decoded into the scratch and the policy's GEMM.  Pieces of a
    merged projection (vLLM's q/k/v, gate/up) each get the path measured for their shape."""
    if path != DECODE_CUBLAS:
        try:
            y = fused(w, x2, path)
        except (ValueError, RuntimeError) as e:
            policy.refuse(w, x2.size(0), x2.device, path, str(e))
        else:
            return y if bias is None else y + bias.to(y.dtype)
    wd = decode_into([w], scratch.weights(x2.device, w.rows * w.cols), w.rows, w.cols, policy)
    return policy.dense_linear(x2, wd, bias)


def _gather_piece(w: EncodedWeight, ids: Tensor, err: Tensor | None = None) -> Tensor:
    if w.is_huffman:
        return ops.run.gather_rows_huffman(ids, w.sm, w.exp, w.off, w.table, w.rows, w.cols,
                                           w.rows_per_group, w.cols_per_chunk, w.exp_lo, w.exp_hi,
                                           w.lut, err, w.chk, w.chk_interval)
    if w.tiled:  # the row-gather kernel reads file order; a runtime tiles only matmul weights
        raise ValueError(f"row gather needs file-order palette planes; {w.name or 'this weight'} is tile-major")
    return ops.run.gather_rows_palette(ids, w.sm, w.idx, w.vpos, w.vexp, w.rows, w.cols, w.palette, err, w.vrow)


# (device key, encoding name) whose row-gather kernel failed its check on that device
# (runtime/selftest.py check_gather): its embeddings decode the table there instead.
_GATHER_FAULTY: set = set()


def mark_gather_faulty(device, encoding: str) -> None:
    """Embeddings of `encoding` ("huffman" | "palette") on `device` stop using its row-gather
    kernel: each forward decodes the table into the scratch and gathers from it (correct, and
    a table's decode per forward)."""
    _GATHER_FAULTY.add((scratch.device_key(device), encoding))


def gather_faulty(device, encoding: str) -> bool:
    """Whether mark_gather_faulty took that encoding's row gather out on `device`."""
    return bool(_GATHER_FAULTY) and (scratch.device_key(device), encoding) in _GATHER_FAULTY


def _embedding_decoded(pieces: list, ids: Tensor, out_rows: int, cols: int, err: Tensor) -> Tensor:
    """The rows from the table decoded into the scratch, with the gather kernels' handling of
    ids out of range (a zero row, one count each in err)."""
    table = decode_into(pieces, scratch.weights(ids.device, out_rows * cols), out_rows, cols)
    flat = ids.reshape(-1).to(torch.int64)
    bad = (flat < 0) | (flat >= out_rows)
    err.add_(bad.sum(dtype=torch.int32).view(1))
    rows = F.embedding(flat.clamp(0, max(out_rows - 1, 0)), table)
    return torch.where(bad[:, None], torch.zeros_like(rows), rows).view(*ids.shape, cols)


def _embedding_cuda(pieces: list, ids: Tensor, out_rows: int, cols: int) -> Tensor:
    """The device path: row-gather kernels that take the ids on the device, so neither the
    table is decoded nor the ids read back (no host sync; CUDA-graph capturable).  An id out of
    range gives a zero row and counts one error in the device's counter, where F.embedding
    would stop the context with a device-side assert."""
    err = scratch.error_counter(ids.device)
    if _GATHER_FAULTY and any(gather_faulty(ids.device, p.encoding_name) for p in pieces):
        return _embedding_decoded(pieces, ids, out_rows, cols, err)
    if len(pieces) == 1 and out_rows == pieces[0].rows:
        return _gather_piece(pieces[0], ids, err).view(*ids.shape, cols)
    flat = ids.reshape(-1).to(torch.int64)
    err.add_(((flat < 0) | (flat >= out_rows)).sum(dtype=torch.int32).view(1))
    out = torch.zeros((flat.numel(), cols), dtype=torch.bfloat16, device=ids.device)
    r = 0
    for p in pieces:
        # Every id goes to every piece (a boolean selection would need its count on the host):
        # ids of other pieces read row 0, and the where() keeps only this piece's rows.
        mine = (flat >= r) & (flat < r + p.rows)
        rows = _gather_piece(p, torch.where(mine, flat - r, torch.zeros_like(flat)), err)
        out = torch.where(mine[:, None], rows, out)
        r += p.rows
    return out.view(*ids.shape, cols)


def embedding(pieces: list, ids: Tensor, out_rows: int, cols: int) -> Tensor:
    """Rows of the stacked pieces.  ids: integer [...], each in [0, out_rows); rows past the
    pieces (vocab padding) are zero.  Returns bf16 [..., cols]."""
    if ids.device.type == "cuda":
        return _embedding_cuda(pieces, ids, out_rows, cols)
    if ids.device.type != "cpu":
        # No row-gather kernel for this device: decode the table into scratch and gather there.
        return F.embedding(ids, decode_into(pieces, scratch.weights(ids.device, out_rows * cols), out_rows, cols))
    # The CPU kernels raise on bad data and leave the counter alone, but inductor cannot lower a
    # call whose mutable argument is None ("getitem is not an OpOverload"): pass the counter.
    err = scratch.error_counter(ids.device)
    if len(pieces) == 1 and out_rows == pieces[0].rows:
        return _gather_piece(pieces[0], ids, err).view(*ids.shape, cols)
    flat = ids.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= out_rows):
        raise IndexError(f"index out of range in self (embedding of {out_rows} rows)")
    out = torch.zeros((flat.numel(), cols), dtype=torch.bfloat16)
    r = 0
    for p in pieces:
        sel = (flat >= r) & (flat < r + p.rows)
        if bool(sel.any()):
            out[sel] = _gather_piece(p, flat[sel] - r, err)
        r += p.rows
    return out.view(*ids.shape, cols)
