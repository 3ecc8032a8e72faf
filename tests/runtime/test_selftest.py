"""The fused kernels' check on each GPU before a model runs them (unweight/runtime/selftest.py).

On this CPU the check runs with stand-ins for the fused product (the CPU is treated as the
device, the shipped table's H200 entries as its measurements): a right product passes, and
each kind of wrong one (a sign, a missed verbatim patch, a second run that differs, a launch
error) takes its path out of the dispatch on that device with one warning.  The real kernels
run this check in the GPU runbook and tests/cuda/test_kernels_gpu.py.
"""
import os

import numpy as np
import pytest
import torch

from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime import dispatch, selftest
from unweight.runtime.policy import DispatchPolicy
from unweight.runtime.tuning_table import DECODE_CUBLAS, PALETTE_GEMV_MMA, TuningTable
from unweight.runtime.weights import EncodedWeight

GPU = "NVIDIA H200"
CPU = torch.device("cpu")


@pytest.fixture
def policy(monkeypatch):
    """A policy over the shipped table whose device name, on any device, is the H200's."""
    import unweight.runtime as rt
    p = DispatchPolicy(TuningTable.load(os.path.join(os.path.dirname(rt.__file__), "tuning_defaults.json")))
    monkeypatch.setattr(p, "device_name", lambda device: GPU)
    return p


_DECODED = {}


def _right(w, x, path):
    key = (id(w), w.tiled)
    if _DECODED.get(key, (None,))[0] is not w:
        _DECODED[key] = (w, dispatch.decode_new([w], w.rows, w.cols).float())
    return (x.float() @ _DECODED[key][1].T).to(torch.bfloat16)


def _weight(rows: int, cols: int, tiled: bool) -> EncodedWeight:
    """A palette weight record of that shape (no planes: the dispatch reads its shape)."""
    e = torch.empty(0, dtype=torch.uint8)
    return EncodedWeight(C.ENC_PALETTE, rows, cols, 16, 64, 0, 0, [120], e, idx=e, tiled=tiled)


def test_the_self_test_weight_has_verbatim_blocks_and_is_held_as_on_a_gpu():
    bits = selftest._weight_bits()
    enc = tc.encode(bits, "palette", threads=1)
    assert len(enc.planes[C.SUFFIX_VPOS]) >= 100  # ~1 block in 80 of 12288, plus the tails'
    for tiled in (False, True):
        w = selftest._held(bits, CPU, tiled)
        assert w.tiled == tiled
        got = dispatch.decode_new([w], w.rows, w.cols).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(got, bits)


def test_paths_to_check_are_the_tables_fused_choices_on_that_device(policy):
    todo = selftest.paths_to_check(policy, CPU)
    assert (PALETTE_GEMV_MMA, True, 1) in todo and (PALETTE_GEMV_MMA, False, 1) in todo
    assert all(p != DECODE_CUBLAS and 1 <= M <= 256 for p, _, M in todo)
    assert len(todo) == len(set(todo))
    monkey = DispatchPolicy(policy.table)
    monkey.device_name = lambda device: "a GPU the table never measured"
    assert selftest.paths_to_check(monkey, CPU) == []


def test_right_products_pass_once_per_device(policy):
    res = selftest.check_fused_paths(policy, CPU, run=_right)
    assert res and all(r["passed"] for r in res.values())
    todo = selftest.paths_to_check(policy, CPU)
    assert set(res) == set(todo) | {(p, selftest.STACK, M) for p, tiled, M in todo if not tiled}
    assert not policy._faulty
    assert selftest.check_fused_paths(policy, CPU, run=_right) == {}  # checked once


def _wrong_sign(w, x, path):
    """The largest output's sign flipped."""
    y = _right(w, x, path)
    i = int(y.float().abs().argmax())
    y.view(-1)[i] = -y.view(-1)[i]
    return y


def _no_patch(w, x, path):
    """Verbatim blocks read as their palette index 0 (a kernel that misses its patches)."""
    bits = dispatch.decode_new([w], w.rows, w.cols).view(torch.int16).numpy().view(np.uint16).copy()
    far = ((bits >> 7) & 0xFF) < 100
    bits[far] = (bits[far] & 0x807F) | (w.palette[0] << 7)
    wt = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    return (x.float() @ wt.float().T).to(torch.bfloat16)


_CALLS = []


def _flaky(w, x, path):
    _CALLS.append(1)
    y = _right(w, x, path)
    if len(_CALLS) % 2:
        y.view(torch.int16)[0, 0] ^= 1
    return y


@pytest.mark.parametrize("wrong, why", [(_wrong_sign, "max error"), (_no_patch, "max error"),
                                        (_flaky, "two runs differ")])
def test_a_wrong_path_is_not_used_on_that_device(policy, wrong, why):
    def run(w, x, path):
        return (wrong if path == PALETTE_GEMV_MMA and w.tiled else _right)(w, x, path)
    with pytest.warns(UserWarning, match=f"{PALETTE_GEMV_MMA} gave wrong results .*{why}"):
        res = selftest.check_fused_paths(policy, CPU, run=run)
    failed = {k for k, r in res.items() if not r["passed"]}
    assert failed and all(p == PALETTE_GEMV_MMA and tiled for p, tiled, _ in failed)
    assert policy.faulty(CPU, PALETTE_GEMV_MMA, True) and not policy.faulty(CPU, PALETTE_GEMV_MMA, False)


@pytest.mark.filterwarnings("ignore:unweight")
def test_a_path_wrong_on_a_stacks_matrix_is_taken_out_for_stacks_only(policy):
    def run(w, x, path):
        return (_wrong_sign if w.in_stack and path == PALETTE_GEMV_MMA else _right)(w, x, path)
    with pytest.warns(UserWarning, match="stack-matrix planes"):
        res = selftest.check_fused_paths(policy, CPU, run=run)
    assert {k for k, r in res.items() if not r["passed"]} == {
        k for k in res if k[0] == PALETTE_GEMV_MMA and k[1] == selftest.STACK}
    assert policy.faulty(CPU, PALETTE_GEMV_MMA, False, in_stack=True)
    assert not policy.faulty(CPU, PALETTE_GEMV_MMA, False) and not policy.faulty(CPU, PALETTE_GEMV_MMA, True)
    dev = torch.device("cuda", 0)
    policy.mark_faulty(dev, PALETTE_GEMV_MMA, False, "a test", in_stack=True)
    w = _weight(4096, 4096, False)
    assert policy.linear_path(w, 1, dev) == PALETTE_GEMV_MMA
    w.in_stack = True
    assert policy.linear_path(w, 1, dev) == DECODE_CUBLAS


def test_the_stack_matrix_is_held_as_the_loaders_hold_one():
    bits = selftest._weight_bits()
    w, holder = selftest._held_stack_matrix(bits, CPU)
    assert w.in_stack and (w.rows, w.cols) == (128, 1024) and w.vpos.numel() > 0
    got = dispatch.decode_new([w], w.rows, w.cols).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, bits[128:256])


@pytest.mark.filterwarnings("ignore:unweight")
def test_a_faulty_path_gives_way_to_decode_and_cublas_in_the_dispatch(policy):
    dev = torch.device("cuda", 0)  # (only named: the dispatch reads the table for it)
    tiled, file_order = _weight(4096, 4096, True), _weight(4096, 4096, False)
    assert policy.linear_path(tiled, 1, dev) == PALETTE_GEMV_MMA
    assert policy.may_fuse(dev)
    policy.mark_faulty(dev, PALETTE_GEMV_MMA, True, "a test")
    assert policy.linear_path(tiled, 1, dev) == DECODE_CUBLAS
    assert policy.linear_path(file_order, 1, dev) == PALETTE_GEMV_MMA  # the other plane order
    assert policy.linear_path(tiled, 32, dev) not in (DECODE_CUBLAS, PALETTE_GEMV_MMA)  # another path
    policy.mark_faulty(dev, PALETTE_GEMV_MMA, False, "a test")
    assert not policy.measured_faster(4096, 4096, 1, PALETTE_GEMV_MMA, dev)
    for path, tiled_, _ in selftest.paths_to_check(policy, dev):
        policy.mark_faulty(dev, path, tiled_, "a test")
    assert not policy.may_fuse(dev)


def test_a_launch_error_marks_the_path_and_a_refusal_skips_it(policy):
    def run(w, x, path):
        if x.size(0) > 4:
            raise ValueError("this kernel takes batch 1-4")
        if path == PALETTE_GEMV_MMA:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        return _right(w, x, path)
    with pytest.warns(UserWarning, match="illegal memory access"):
        res = selftest.check_fused_paths(policy, CPU, run=run)
    assert all(M <= 4 for _, _, M in res)
    assert {r.get("error") for (p, _, _), r in res.items() if p == PALETTE_GEMV_MMA} == {
        "CUDA error: an illegal memory access was encountered"}
    assert policy.faulty(CPU, PALETTE_GEMV_MMA, True) and policy.faulty(CPU, PALETTE_GEMV_MMA, False)


def test_no_table_no_check():
    assert selftest.check_fused_paths(DispatchPolicy(None), CPU, run=_right) == {}


@pytest.fixture
def fresh_gather_state(monkeypatch):
    monkeypatch.setattr(selftest, "_GATHER_CHECKED", set())
    monkeypatch.setattr(dispatch, "_GATHER_FAULTY", set())


def test_row_gathers_pass_once_per_device(fresh_gather_state):
    assert selftest.check_gather(CPU) == {"palette": True, "huffman": True}
    assert selftest.check_gather(CPU) == {}
    assert not dispatch.gather_faulty(CPU, "palette") and not dispatch.gather_faulty(CPU, "huffman")


def test_a_wrong_gather_gives_way_to_the_decoded_table(fresh_gather_state):
    def gather(w, ids):
        rows = dispatch._gather_piece(w, ids)
        if w.is_huffman:
            rows.view(torch.int16)[3, 7] ^= 1 << 7  # one exponent bit of one row
        return rows
    with pytest.warns(UserWarning, match="huffman row-gather kernel gave rows other than the weight's"):
        assert selftest.check_gather(CPU, gather) == {"palette": True, "huffman": False}
    assert dispatch.gather_faulty(CPU, "huffman") and not dispatch.gather_faulty(CPU, "palette")
    # The device path with the gather marked faulty: the decoded table's rows, and an id out of
    # range a zero row counted as one error, as the gather kernels do.
    bits = selftest._weight_bits()
    w = selftest._held_huffman(bits, CPU)
    ids = torch.tensor([[3, 383], [0, 384]])
    err = dispatch.scratch.error_counter(CPU)
    before = int(err.item())
    got = dispatch._embedding_cuda([w], ids, w.rows, w.cols).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got[0], bits[[3, 383]]) and np.array_equal(got[1, 0], bits[0])
    assert not got[1, 1].any() and int(err.item()) == before + 1


@pytest.fixture
def fresh_slots_state(monkeypatch):
    monkeypatch.setattr(selftest, "_SLOTS_CHECKED", set())
    monkeypatch.setattr(selftest, "_SLOTS_FAULTY", set())


def test_expert_slot_kernels_pass_once_per_device(fresh_slots_state):
    assert selftest.check_slots(CPU) == {"decode": True, "gemv": True}
    assert selftest.check_slots(CPU) == {}
    assert selftest.slots_ok(CPU, "decode") and selftest.slots_ok(CPU, "gemv")


@pytest.mark.parametrize("what", ["decode", "gemv"])
def test_a_wrong_expert_slot_kernel_is_taken_out(fresh_slots_state, what):
    from unweight.runtime.expert_slots import ExpertSlots

    class Wrong(ExpertSlots):
        def decode(self, ids, out):
            w = super().decode(ids, out)
            if what == "decode":
                w.view(torch.int16)[1, 2, 3] ^= 1
            return w

        def gemv(self, x, ids):
            y = super().gemv(x, ids)
            if what == "gemv":
                y[2, 9] = -y[2, 9] if y[2, 9] != 0 else 1
            return y

    with pytest.warns(UserWarning, match=f"expert-slot {what} kernel gave"):
        res = selftest.check_slots(CPU, Wrong.from_weights)
    assert res == {"decode": what != "decode", "gemv": what != "gemv"}
    assert selftest.slots_ok(CPU, "decode") == (what != "decode")
    assert selftest.slots_ok(CPU, "gemv") == (what != "gemv")
    assert selftest.slots_ok(torch.device("cuda", 0), what)  # another device


def test_expert_slots_that_cannot_be_built_take_both_kernels_out(fresh_slots_state):
    def broken(w, device):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.warns(UserWarning, match="illegal memory access"):
        assert selftest.check_slots(CPU, broken) == {"decode": False, "gemv": False}
    assert not selftest.slots_ok(CPU, "decode") and not selftest.slots_ok(CPU, "gemv")
