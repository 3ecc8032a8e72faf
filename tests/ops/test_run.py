"""ops.run: the forward's ops called past torch's dispatcher in eager mode (_ext.direct), the
op itself wherever torch must see it; the same results either way."""
from typing import List

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from unweight import ops
from unweight.ops import _ext
from tests.ops.test_ops import _huffman_args, _palette_args

SEEN = []


@torch.library.custom_op("unweight_test::scaled", mutates_args=("out",))
def _scaled(x: torch.Tensor, out: torch.Tensor, k: int, pal: List[int]) -> None:
    raise NotImplementedError


@_scaled.register_kernel("cpu")
def _scaled_cpu(x, out, k, pal):
    SEEN.append("op")
    out.copy_(x * k)


@_scaled.register_fake
def _(x, out, k, pal):
    return None


def _direct_kernel(x, out, k, pal):
    SEEN.append("direct")
    out.copy_(x * k)


scaled = _ext.direct(torch.ops.unweight_test.scaled, cpu=_direct_kernel)


class _Recorder(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        SEEN.append(str(func))
        return func(*args, **(kwargs or {}))


def _run(x):
    SEEN.clear()
    out = torch.zeros(3)
    v = out._version
    scaled(x, out, 2, [1, 2])
    return out, out._version > v, list(SEEN)


def test_eager_call_runs_the_kernel_directly_and_bumps_what_it_writes():
    out, bumped, seen = _run(torch.ones(3))
    assert seen == ["direct"] and bumped and torch.equal(out, torch.full((3,), 2.0))
    assert scaled.__name__ == "direct_scaled"


def test_a_written_argument_given_by_name_is_bumped_too():
    out = torch.zeros(3)
    v = out._version
    scaled(torch.ones(3), out=out, k=2, pal=[1])
    assert out._version > v and torch.equal(out, torch.full((3,), 2.0))


def test_the_op_runs_wherever_torch_must_see_it():
    x = torch.ones(3, requires_grad=True)
    assert _run(x)[2] == ["op"]  # autograd tracks x
    with torch.no_grad():
        assert _run(x)[2] == ["direct"]
    with _Recorder():  # a dispatch mode sees the op
        assert "unweight_test.scaled.default" in _run(torch.ones(3))[2]
    with torch.profiler.profile() as prof:  # the profiler names it
        assert _run(torch.ones(3))[2] == ["op"]
    assert any("unweight_test::scaled" in e.name for e in prof.events())
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # fake tensors: the fake implementation, no kernel
        assert _run(torch.ones(3))[2] == []
    assert _run(torch.ones(3).to("meta"))[2] == []  # a device without a direct kernel: the op


def test_a_tensor_subclass_among_the_arguments_takes_the_op():
    class Sub(torch.Tensor):
        pass
    SEEN.clear()
    out = torch.zeros(3).as_subclass(Sub)
    scaled(torch.ones(3), out, 2, [1])
    assert SEEN == ["op"]


def test_a_jit_trace_records_the_op():
    def f(x):
        out = torch.zeros(3)
        scaled(x, out, 2, [1])
        return out
    SEEN.clear()
    tr = torch.jit.trace(f, torch.ones(3), check_trace=False)
    assert SEEN == ["op"] and "unweight_test::scaled" in str(tr.graph)


def test_run_and_the_ops_give_the_same_bits():
    w, h, p, args = _huffman_args()
    ops.run.decode_huffman(*args)
    a = args[5].clone()
    args[5].zero_()
    torch.ops.unweight.decode_huffman(*args)
    assert torch.equal(a.view(torch.int16), args[5].view(torch.int16))
    assert torch.equal(a.view(torch.int16), w.view(torch.int16))
    w, h, p, args = _palette_args()
    ops.run.decode_palette(*args)
    assert torch.equal(args[4].view(torch.int16), w.view(torch.int16))


@pytest.mark.parametrize("name", ops.run.__all__)
def test_every_runner_wraps_its_op_and_its_registered_kernels(name):
    call = getattr(ops.run, name)
    assert call.op is getattr(torch.ops.unweight, name)
    assert call.kernels and all(fn.__name__ == f"_{name}_{dev}" for dev, fn in call.kernels.items())
