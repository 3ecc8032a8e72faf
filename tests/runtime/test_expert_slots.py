"""runtime/expert_slots.py: a layer's palette experts decoded by expert ids held in a tensor,
bit for bit the experts' weights, whatever the ids (repeats, any order, one or all), with
verbatim lists of different lengths padded by real blocks."""
import numpy as np
import pytest
import torch

from tests.conftest import bf16_gaussian
from unweight.codec import tensor_codec as tc
from unweight.format import constants as C
from unweight.runtime.expert_slots import ExpertSlots


def _experts(E=5, rows=48, cols=96, seed=0):
    rng = np.random.default_rng(seed)
    w = bf16_gaussian(rng, (E, rows, cols))
    w[1, 0, :4] = [0x7FC1, 0xFF80, 0x0001, 0x8000]  # NaN payload, -Inf, subnormal, -0: verbatim blocks
    w[3, 5, 7] = 0x0003
    w[3, 40, 90] = 0x0002  # expert 3: the longest verbatim list; experts 0, 2, 4: none
    return w


@pytest.mark.parametrize("paired", [False, True])  # True: the palette order the CUDA loaders hold
@pytest.mark.parametrize("cols", [96, 100])  # 100: each row's last block is short
def test_any_ids_decode_to_the_experts_bits(cols, paired):
    from unweight import ops
    w = _experts(cols=cols)
    slots = ExpertSlots.from_weights(w, "cpu", paired=paired)
    stored = [int(b) for b in tc.encode(w, "palette", threads=1).header.palette[:16]][: len(slots.palette)]
    assert (slots.palette != stored) == (paired and ops.paired_palette(stored) is not None)
    assert not paired or ops.palette_pairs(slots.palette) or ops.paired_palette(stored) is None
    assert slots.vpos.shape[0] == 5 and slots.vpos.shape[1] >= 2  # padded to the longest list
    nv = tc.encode(w, "palette", threads=1).header.num_verbatim
    assert slots.padding_bytes == (5 * slots.vpos.shape[1] - nv) * (4 + C.PAL_BLOCK) > 0
    assert all(bool((row[1:] > row[:-1]).all()) for row in slots.vpos.to(torch.int64))  # each list ascending
    for ids in ([3], [0, 1, 2, 3, 4], [4, 3, 3, 1], [2, 2, 2, 2, 2, 2, 2]):
        t = torch.tensor(ids)
        out = torch.full((len(ids) * 48 * cols,), float("nan"), dtype=torch.bfloat16)
        got = slots.decode(t, out)
        assert got.shape == (len(ids), 48, cols)
        assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), w[ids])


def test_layer_without_verbatim_blocks_and_held_bytes():
    rng = np.random.default_rng(1)
    w = bf16_gaussian(rng, (3, 32, 64))
    slots = ExpertSlots.from_weights(w, "cpu")
    enc = tc.encode(w, "palette", threads=1)
    if enc.header.num_verbatim == 0:
        assert slots.vpos.shape == (3, 0)
    got = slots.decode(torch.tensor([2, 0]), torch.empty(2 * 32 * 64, dtype=torch.bfloat16))
    assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), w[[2, 0]])
    planes = enc.planes[C.SUFFIX_SM].nbytes + enc.planes[C.SUFFIX_IDX].nbytes
    assert planes <= slots.held_bytes() <= planes + 3 * slots.vpos.shape[1] * (4 + C.PAL_BLOCK)
    assert slots.padding_bytes == (3 * slots.vpos.shape[1] - enc.header.num_verbatim) * (4 + C.PAL_BLOCK)
    with pytest.raises(ValueError, match="experts, rows, cols"):
        ExpertSlots.from_weights(w[0], "cpu")


def test_an_id_outside_the_stack_is_a_format_error_on_cpu():
    from unweight.format.errors import FormatError
    slots = ExpertSlots.from_weights(_experts(), "cpu")
    with pytest.raises(FormatError, match="outside the stack"):
        slots.decode(torch.tensor([1, 5]), torch.empty(2 * 48 * 96, dtype=torch.bfloat16))


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("paired", [False, True])
def test_gemv_is_each_slots_expert_product(paired):
    """ExpertSlots.gemv on CPU (the op's reference): slot s is x[s] @ W[ids[s]]^T in fp32 with one
    rounding, bit for bit, for repeated and unordered ids, in either palette order; a bad id is
    a FormatError."""
    from unweight.format.errors import FormatError
    w = _experts(cols=128)
    slots = ExpertSlots.from_weights(w, "cpu", paired=paired)
    rng = np.random.default_rng(2)
    ids = torch.tensor([3, 0, 3, 4, 1, 1])
    x = torch.from_numpy(bf16_gaussian(rng, (6, 128))).view(torch.bfloat16)
    want = torch.einsum("sk,snk->sn", x.float(), torch.from_numpy(w[ids.numpy()]).view(torch.bfloat16).float())
    assert np.array_equal(_bits(slots.gemv(x, ids)), _bits(want.to(torch.bfloat16)))
    with pytest.raises(FormatError, match="outside the stack"):
        slots.gemv(x[:2], torch.tensor([0, 9]))


def test_routed_forward_is_the_swiglu_moe_within_bf16_rounding():
    """routed_forward against the routed experts computed densely in fp64 from the decoded
    weights: within a few bf16 ulps of the output's scale (its products and activation round
    to bf16 where a dense experts kernel would); shapes that make no SwiGLU MoE are refused."""
    from unweight.runtime.expert_slots import routed_forward
    rng = np.random.default_rng(3)
    E, H, inter, T, k = 6, 64, 128, 3, 2
    w13 = bf16_gaussian(rng, (E, 2 * inter, H))
    w2 = bf16_gaussian(rng, (E, H, inter))
    s13, s2 = ExpertSlots.from_weights(w13, "cpu"), ExpertSlots.from_weights(w2, "cpu")
    x = torch.from_numpy(bf16_gaussian(rng, (T, H))).view(torch.bfloat16) * 20
    topk_ids = torch.tensor([[1, 4], [0, 1], [5, 5]])
    topk_weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.9, 0.1]])
    out = routed_forward(s13, s2, x, topk_weights, topk_ids)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16
    f13 = torch.from_numpy(w13).view(torch.bfloat16).double()
    f2 = torch.from_numpy(w2).view(torch.bfloat16).double()
    want = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(topk_ids[t, j])
            h = f13[e] @ x[t].double()
            want[t] += float(topk_weights[t, j]) * (f2[e] @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    scale = want.abs().max()
    assert float((out.double() - want).abs().max()) <= 0.02 * float(scale)
    with pytest.raises(ValueError, match="SwiGLU"):
        routed_forward(s2, s13, x, topk_weights, topk_ids)


@pytest.mark.parametrize("chunk", [1, 1 << 30])  # the lists' exponents gathered an expert at a time, or at once
def test_lists_hold_own_blocks_then_the_first_others_with_their_exponents(chunk):
    w = _experts(cols=100)
    enc = tc.encode(w, "palette", threads=1)
    slots = ExpertSlots.from_weights(torch.from_numpy(w).view(torch.bfloat16), "cpu", chunk_weights=chunk)
    assert np.array_equal(slots.sm.numpy(), enc.planes[C.SUFFIX_SM])
    assert np.array_equal(slots.idx.numpy(), enc.planes[C.SUFFIX_IDX])
    E, rows, cols = w.shape
    bpr = -(-cols // C.PAL_BLOCK)
    vpos = enc.planes[C.SUFFIX_VPOS].astype(np.int64)
    width = slots.vpos.shape[1]
    pad = np.zeros((E, rows, bpr * C.PAL_BLOCK), np.uint8)
    pad[..., :cols] = (w >> 7) & 0xFF
    for e in range(E):
        own = vpos[(vpos >= e * rows * bpr) & (vpos < (e + 1) * rows * bpr)] - e * rows * bpr
        others = np.setdiff1d(np.arange(rows * bpr), own)[: width - len(own)]
        want = np.sort(np.concatenate([own, others]))
        assert slots.vpos[e].to(torch.int64).numpy().tolist() == want.tolist()
        assert np.array_equal(slots.vexp[e].numpy(), pad[e].reshape(-1, C.PAL_BLOCK)[want])
