"""Before a model on a GPU may run a fused palette kernel or a row gather, the kernel is
checked on that GPU.

The load check (runtime/verify.py) proves that every weight decodes to the checkpoint's
bits, but a forward through a fused kernel never writes the weight: a kernel that read its
planes wrongly on some device would give wrong logits from a model that passed every check.
The kernels are checked through the warp emulator in CI and by the GPU runbook, yet a user's
device, driver or build may differ from those.  So the first preparation of a model on a GPU
(prepare(), vLLM's weight processing) runs each fused path the tuning table can pick there,
at both ends of each batch bucket it would run, on a small weight of its own against the same
product in float64, and a path that misses the runbook's accuracy bar is not used on that
device: its layers run decode + cuBLAS, the BF16 model's results, with one warning naming the
path.  Each file-order path runs on a matrix of a 3-D expert stack too (the views and rebased
verbatim list transformers' routed experts read), and is taken out for such matrices alone
where only that fails.

The weight: [384, 1024] BF16 N(0, 0.02) with about one 32-weight block in 80 holding a far
exponent (so verbatim blocks, which every fused kernel patches in its own way, are in every
check), held as the loaders hold a palette weight on a GPU (paired palette order, the
verbatim row index, tile-major where the table's entry is).  x: [M, 1024] BF16 N(0, 1).  The
bar (the runbook's, tests/cuda/helpers.py fused_bound): the max error against the float64
product at most twice cuBLAS BF16's own plus 2^-18 of the largest output, every output
finite, and two runs bitwise equal.  Cost: two launches and a few host syncs per (path, plane
order, batch) the table uses on the device, once per process and policy: tens of ms.

The embedding row gathers (huffman and palette) likewise never write the whole weight, so
check_gather gathers ten rows of the same weight, held as the loaders hold each encoding,
and compares their bits; a gather that differs gives way, on that device, to a decode of the
table per forward (dispatch.mark_gather_faulty).  check_slots does the same for the kernels
vLLM's palette MoE layers run on their routed experts: the decode by device ids (a failure
keeps one palette piece per expert, routed on the host) and the slots GEMV (a failure decodes
the routed experts before their matmul).
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import torch

from .. import ops
from ..codec import tensor_codec as tc
from ..format import constants as C
from ..ops import layout as ops_layout
from . import dispatch, experts, scratch
from . import kernel_plan as kp
from .expert_slots import ExpertSlots
from .policy import DispatchPolicy
from .tuning_table import DECODE_CUBLAS, TILED, bucket_bounds, split_key
from .weights import EncodedWeight, code_table, device_planes, hold_paired, hold_row_index

log = logging.getLogger(__name__)

SHAPE = (384, 1024)  # rows, cols: whole 16 x 64 tiles, K a multiple of every kernel's step
STACK = "stack"  # check_fused_paths' plane order of a matrix of a 3-D expert stack
_FAR_EVERY = 80  # about one block in this many holds a far exponent (a verbatim block)


def _weight_bits() -> np.ndarray:
    """uint16 [384, 1024]: BF16 N(0, 0.02) with a far exponent in about 1/80 of the blocks."""
    rng = np.random.default_rng(0x5E1F)
    w = (rng.standard_normal(SHAPE) * 0.02).astype(np.float32)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation: any BF16 will do
    blocks = bits.reshape(SHAPE[0], -1, C.PAL_BLOCK)
    far = rng.random(blocks.shape[:2]) < 1.0 / _FAR_EVERY
    # Exponents 60-99 (2^-67..2^-28), each too rare to enter the palette of N(0, 0.02)'s
    # exponents (~107-122): every such block is a verbatim one.
    far_exp = rng.integers(60, 100, int(far.sum())).astype(np.uint16)
    blocks[far, 0] = (blocks[far, 0] & 0x807F) | (far_exp << 7)
    return bits


_REFUSED = "refused"  # _attempt's verdict for a problem the kernel refuses


def _attempt(fn):
    """fn() -> None where the kernel was right, else why not.  A ValueError (the kernel
    refuses the problem, as it would a forward's, which then falls back) gives _REFUSED, a
    RuntimeError (a launch error) its first line."""
    try:
        return fn()
    except ValueError:
        return _REFUSED
    except RuntimeError as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__


def _held(bits: np.ndarray, device: torch.device, tiled: bool) -> EncodedWeight:
    """The palette weight of `bits` on `device` as the GPU loaders hold one."""
    enc = tc.encode(bits, "palette", threads=1)
    w = EncodedWeight.from_header(enc.header, device_planes(enc.planes, device), name="self-test weight")
    if tiled:
        w.sm, w.idx = ops_layout.tile_palette_planes(w.sm, w.idx)
        w.tiled = True
    return hold_row_index(hold_paired(w))


def _held_stack_matrix(bits: np.ndarray, device: torch.device) -> tuple:
    """(matrix 1 of a 3-D palette stack of the weight's rows cut in three, as the loaders hold
    an expert stack: its rebased verbatim list and row index, paired order; its holder, which
    owns the planes)."""
    stack = bits.reshape(3, SHAPE[0] // 3, SHAPE[1])
    enc = tc.encode(stack, "palette", threads=1)
    holder = experts.PlaneHolder()
    for suf, t in device_planes(enc.planes, device).items():
        holder.register_buffer("w" + suf, t)
    p = experts._Planes(holder, "w", enc.header)
    st = experts.ExpertStack("self-test stack", stack.shape, torch.bfloat16, [p])
    experts.prepare_planes(st)
    experts.hold_paired(st)
    return p.weight(1), holder


def paths_to_check(policy: DispatchPolicy, device: torch.device) -> list:
    """[(path, tiled, M)]: every fused path the policy's table can run on `device` (each
    entry's choice, and any path it timed faster than decode + cuBLAS, which
    DispatchPolicy.measured_faster may grant), at both ends of the entry's batch bucket and
    at the batch it was timed at (a kernel's tiling over the batch changes inside a bucket),
    without repeats."""
    name = policy.device_name(device)
    out = set()
    for key, e in policy.table.entries.items():
        dev, n, k, enc, b = split_key(key)
        if dev != name or not enc.startswith("palette"):
            continue
        M = int(e.get("M", 1))
        lo, hi = bucket_bounds(b)
        batches = {m for m in (lo, hi, M) if m is not None and 1 <= m <= kp.PMMA_MAX_M}
        chosen = policy.table.lookup(dev, n, k, enc, M)
        for path in set(e.get("times_ms", {})) | {chosen}:
            if path != DECODE_CUBLAS and (path == chosen or policy.table.faster(dev, n, k, enc, M, path)):
                out.update((path, enc.endswith(TILED), m) for m in batches)
    return sorted(out)


def _compare(y: torch.Tensor, y2: torch.Tensor, x: torch.Tensor, wt: torch.Tensor) -> dict:
    """The runbook's bar for a fused product y (bf16 [M, N]) of x [M, K] and wt [N, K]."""
    ref = x.double() @ wt.double().T
    e_c = float((x @ wt.T).double().sub(ref).abs().max())
    err = y.double().sub(ref).abs()
    finite = bool(torch.isfinite(err).all())
    e_k = float(err.max()) if finite else float("inf")
    bound = 2.0 * e_c + 2.0 ** -18 * float(ref.abs().max())
    same = bool(torch.equal(y.view(torch.int16), y2.view(torch.int16)))
    return {"max_err": e_k, "bound": bound, "finite": finite, "deterministic": same,
            "passed": finite and e_k <= bound and same}


def _due(checked: set, device: torch.device, again: bool) -> bool:
    """Whether a check kept in `checked` (device keys) is to run on `device` now (not checked
    before, or again; a GPU with the kernels built), noting it as checked."""
    key = scratch.device_key(device)
    if (key in checked and not again) or (device.type == "cuda" and not ops.cuda_kernels_built()):
        return False
    checked.add(key)
    return True


_GATHER_CHECKED: set = set()  # devices whose row-gather kernels check_gather checked
_GATHER_IDS = (0, 383, 5, 5, 200, 17, 1, 382, 96, 255)  # ends, repeats, every part of the weight


def _held_huffman(bits: np.ndarray, device: torch.device) -> EncodedWeight:
    """The huffman weight of `bits` on `device` as the GPU loaders hold one: the checkpoint
    index at the loaders' S, the decode tables built there."""
    enc = tc.encode(bits, "huffman", threads=1)
    enc = tc.with_index(enc.header, enc.planes, threads=1, chk_interval=C.LOAD_CHK_INTERVAL)
    table = code_table(enc.header, device)
    err = scratch.error_counter(device)
    lut = (ops.build_lut(table, enc.header.exp_lo, enc.header.exp_hi, err) if device.type == "cuda"
           else torch.empty(0, dtype=torch.uint16))
    return EncodedWeight.from_header(enc.header, device_planes(enc.planes, device), table, lut,
                                     name="self-test weight")


def check_gather(device, gather=None, again: bool = False) -> dict:
    """Check the embedding row-gather kernels (huffman and palette) on `device` once per
    process: rows _GATHER_IDS of the self-test weight, held as the loaders hold one, against
    its bits.  One that gives other bits is marked faulty there (dispatch.mark_gather_faulty,
    one warning): embeddings of that encoding decode their table per forward instead.
    gather(w, ids) -> bf16 rows (default: the dispatch's kernel call; a stand-in for the tests);
    again: check a device checked before (the runbook).  Returns {encoding: passed} of this
    call's checks ({} when checked before)."""
    device = torch.device(device)
    if not _due(_GATHER_CHECKED, device, again):
        return {}
    gather = gather or (lambda w, ids: dispatch._gather_piece(w, ids, scratch.error_counter(device)))
    bits = _weight_bits()
    ids = torch.tensor(_GATHER_IDS, dtype=torch.int64, device=device)
    want = bits[list(_GATHER_IDS)]
    out = {}

    def rows_of(w):
        got = gather(w, ids).view(torch.int16).cpu().numpy().view(np.uint16)
        return None if np.array_equal(got, want) else "rows other than the weight's"
    for name, w in (("palette", _held(bits, device, False)), ("huffman", _held_huffman(bits, device))):
        why = _attempt(lambda: rows_of(w))
        if why == _REFUSED:
            continue
        out[name] = why is None
        if why is not None:
            dispatch.mark_gather_faulty(device, name)
            msg = (f"unweight: the {name} row-gather kernel gave {why} on {device} in its self-test; "
                   f"{name} embeddings there decode their table at each forward instead")
            warnings.warn(msg, stacklevel=2)
            log.warning(msg)
    return out


_SLOTS_CHECKED: set = set()  # devices whose expert-slot kernels check_slots checked
_SLOTS_FAULTY: set = set()  # (device key, "decode" | "gemv") that failed there
_SLOT_IDS = (2, 0, 2, 1)  # a repeat, every expert


def slots_ok(device, what: str) -> bool:
    """Whether the expert-slot kernel `what` ("decode": ops.decode_palette_slots, "gemv":
    ops.palette_gemv_slots) may run on `device`: not failed by check_slots there."""
    return not _SLOTS_FAULTY or (scratch.device_key(device), what) not in _SLOTS_FAULTY


def mark_slots_faulty(device, what: str, why: str) -> None:
    """Take the expert-slot kernel `what` out on `device` (slots_ok), with one warning."""
    _SLOTS_FAULTY.add((scratch.device_key(device), what))
    msg = (f"unweight: the expert-slot {what} kernel gave {why} on {torch.device(device)} in its self-test; "
           + ("MoE layers there keep one palette piece per expert, routed on the host" if what == "decode" else
              "routed experts there are decoded before their matmul"))
    warnings.warn(msg, stacklevel=2)
    log.warning(msg)


def check_slots(device, slots_of=None, again: bool = False) -> dict:
    """Check the kernels vLLM's palette MoE layers run on routed experts (runtime/expert_slots.py)
    on `device` once per process: three experts cut from the self-test weight ([3, 128, 1024],
    ExpertSlots as the layers build them) decoded by device ids _SLOT_IDS against their bits,
    and the slots GEMV of those ids against the float64 products (the fused paths' bar).  A
    kernel that misses is taken out there (mark_slots_faulty).  slots_of(w, device): the
    ExpertSlots to check (a stand-in for the tests).  Returns {"decode": ok, "gemv": ok} of this
    call's checks ({} when checked before)."""
    device = torch.device(device)
    if not _due(_SLOTS_CHECKED, device, again):
        return {}
    w = _weight_bits().reshape(3, SHAPE[0] // 3, SHAPE[1])
    made = {}
    # (the slots are built by the layers' own encode on the device: a failure there is the
    # decode's too, since the layers would build theirs the same way)
    why = _attempt(lambda: made.update(slots=(slots_of or ExpertSlots.from_weights)(w, device)))
    if why is not None:
        if why != _REFUSED:
            mark_slots_faulty(device, "decode", why)
            mark_slots_faulty(device, "gemv", why)
        return {} if why == _REFUSED else {"decode": False, "gemv": False}
    slots = made["slots"]
    ids = torch.tensor(_SLOT_IDS, dtype=torch.int64, device=device)
    S, rows, cols = len(_SLOT_IDS), w.shape[1], w.shape[2]

    def decoded():
        buf = torch.empty(S * rows * cols, dtype=torch.bfloat16, device=device)
        got = slots.decode(ids, buf).view(torch.int16).cpu().numpy().view(np.uint16)
        return None if np.array_equal(got, w[list(_SLOT_IDS)]) else "experts other than the weight's"

    def products():
        x = torch.randn(S, cols, generator=torch.Generator().manual_seed(0x5107)).to(torch.bfloat16).to(device)
        y, y2 = slots.gemv(x, ids), slots.gemv(x, ids)
        wt = torch.from_numpy(w[list(_SLOT_IDS)].view(np.int16)).to(device).view(torch.bfloat16)
        bad = [q for q in (_compare(y[s:s + 1], y2[s:s + 1], x[s:s + 1], wt[s]) for s in range(S))
               if not q["passed"]]
        return None if not bad else (f"a max error of {bad[0]['max_err']:.3g} against a bound of "
                                     f"{bad[0]['bound']:.3g}" + ("" if bad[0]["deterministic"] else
                                                                 ", two runs differing"))

    out = {}
    for what, why in (("decode", _attempt(decoded)), ("gemv", _attempt(products))):
        if why == _REFUSED:
            continue
        out[what] = why is None
        if why is not None:
            mark_slots_faulty(device, what, why)
    return out


def check_fused_paths(policy: DispatchPolicy, device, run=None) -> dict:
    """Check every fused path paths_to_check lists on `device` (once per policy and device),
    each file-order one also on a matrix of a 3-D expert stack, and mark those that miss the
    bar as faulty there for that plane order (DispatchPolicy.mark_faulty: their layers take
    decode + cuBLAS, one warning each).  run(w, x2, path) -> y: the fused product (default
    dispatch.fused; a stand-in for the tests).  Returns {(path, order, M): result} of this
    call's checks, order False (file order), True (tile-major) or STACK ({} when the device
    was checked before or nothing can be fused there)."""
    device = torch.device(device)
    if policy.table is None or device.type not in ("cuda", "cpu") or policy.fused_checked(device):
        return {}
    if device.type == "cuda" and not ops.cuda_kernels_built():
        return {}
    todo = paths_to_check(policy, device)
    policy.mark_fused_checked(device)
    if not todo:
        return {}
    run = run or dispatch.fused
    bits = _weight_bits()
    rows = SHAPE[0] // 3
    wts = {order: torch.from_numpy((bits[rows:2 * rows] if order == STACK else bits).view(np.int16)).to(device)
           .view(torch.bfloat16) for order in (False, True, STACK)}
    held = {}
    g = torch.Generator().manual_seed(0x5E1F)
    results = {}
    # Each path on the weight in the plane order the table timed it in, and each file-order
    # path also on a stack's matrix (where expert stacks run it).
    for path, order, M in todo + [(p, STACK, M) for p, tiled, M in todo if not tiled]:
        if order not in held:
            held[order] = _held_stack_matrix(bits, device) if order == STACK else (_held(bits, device, order), None)
        w = held[order][0]
        x = torch.randn(M, SHAPE[1], generator=g).to(torch.bfloat16).to(device)
        r = {}

        def product():
            r.update(_compare(run(w, x, path), run(w, x, path), x, wts[order]))
        why = _attempt(product)
        if why == _REFUSED:  # the kernel refuses this batch or shape: the forward refuses it too
            continue
        if why is not None:
            r = {"passed": False, "error": why}
        results[(path, order, M)] = r
        if not r["passed"]:
            why = r.get("error") or (f"max error {r['max_err']:.3g} against a bound of {r['bound']:.3g}"
                                     + ("" if r["deterministic"] else ", two runs differ"))
            policy.mark_faulty(device, path, order is True, f"{why} at batch {M} on its self-test weight",
                               in_stack=order == STACK)
    if results:
        bad = sum(not r["passed"] for r in results.values())
        log.info("unweight: fused kernels checked on %s: %d (path, plane order, batch) checks, %d failed",
                 policy.device_name(device), len(results), bad)
    return results
