"""loader_rewrites and decode_rewritten on model classes written as vLLM's are (no vLLM needed):
a layer holding a tensor that the model's loader rewrites, and that its planes would pass by, is
rebuilt as a BF16 one, or the load stops naming the tensor; a loader that only adds and removes
a dimension, or copies, rewrites nothing; the model is left as it was."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from unweight.format import constants as C
from unweight.format.errors import InputError
from unweight.integrations.vllm.rewrites import (decode_rewritten, loader_rewrites, one_per_kind, stand_in,
                                                 unchanged)

HEADS, HD, HID = 4, 8, 32


class _Compressed(nn.Module):
    """A layer as unweight's methods leave it: an empty parameter per plane, none named weight."""

    def __init__(self, stem: str = "weight"):
        super().__init__()
        for suf in C.ALL_SUFFIXES:
            self.register_parameter(stem + suf, nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False))


def _permute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    # (the rotary layout change Llama 4's vLLM loader makes)
    n, k = w.shape
    return w.view(heads, n // heads // 2, 2, k).transpose(1, 2).reshape(n, k)


class _Model(nn.Module):
    """Two attention layers and a MoE layer, loaded the way vLLM's models load them: q/k/v into
    one qkv_proj by shard id, experts through a FusedMoE-style loop that adds an expert
    dimension and unbinds it; `rewrite(name, w)` is the model's own rule on the way."""

    def __init__(self, rewrite=lambda name, w: w):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(2):
            block = nn.Module()
            block.qkv_proj = _Compressed()
            block.o_proj = _Compressed()
            block.experts = _Compressed("w13_weight")
            block.experts.register_parameter(
                "w2_weight__hdr", nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False))
            self.layers.append(block)
        self.norm = nn.Parameter(torch.ones(HID))
        self.rewrite = rewrite

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            w = self.rewrite(name, w)
            if ".experts." in name:
                layer, rest = name.split(".experts.")
                expert, proj = rest.split(".")[:2]
                pname = f"{layer}.experts.{'w2_weight' if proj == 'w2' else 'w13_weight'}"
                for e, piece in enumerate(w.unsqueeze(0).unbind(), start=int(expert)):
                    if params[pname].weight_loader(params[pname], piece, pname, shard_id=proj, expert_id=e,
                                                   return_success=True):
                        loaded.add(pname)
                continue
            for part, sid in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
                if f".{part}." in name:
                    name = name.replace(part, "qkv_proj")
                    params[name].weight_loader(params[name], w, sid)
                    break
            else:
                p = params[name]
                getattr(p, "weight_loader", lambda p, w: p.data.copy_(w))(p, w)
            loaded.add(name)
        return loaded


def _tensors(model: _Model):
    """(owners, shapes) as loader.claimed_tensors and the quant config give them."""
    owners, shapes = {}, {}
    for i, block in enumerate(model.layers):
        for proj, rows in (("q_proj", HEADS * HD), ("k_proj", 2 * HD), ("v_proj", 2 * HD), ("o_proj", HID)):
            n = f"layers.{i}.self_attn.{proj}.weight"
            owners[n] = block.o_proj if proj == "o_proj" else block.qkv_proj
            shapes[n] = (rows, HID)
        for e in range(4):
            for proj, shape in (("w1", (64, HID)), ("w3", (64, HID)), ("w2", (HID, 64))):
                n = f"layers.{i}.experts.{e}.{proj}.weight"
                owners[n], shapes[n] = block.experts, shape
    return owners, shapes


def _fix_names(model):
    """The model with its load_weights seeing the checkpoint's names as the test model holds them
    (attention layers under layers.i, the checkpoint's under layers.i.self_attn); the names it
    was asked about are kept in model.asked."""
    orig = model.load_weights
    model.asked = []

    def load_weights(ws):
        for n, w in ws:
            model.asked.append(n)
            orig([(n.replace(".self_attn", ""), w)])
    model.load_weights = load_weights
    return model


def _counts(caplog) -> str:
    return [r.getMessage() for r in caplog.records if "asked about" in r.getMessage()][-1]


def test_a_loader_that_leaves_tensors_as_stored_rebuilds_nothing_and_leaves_the_model_as_it_was(caplog):
    m = _fix_names(_Model())
    before = [(n, p.shape, p.dtype) for n, p in m.named_parameters()]
    owners, shapes = _tensors(m)
    with caplog.at_level("INFO", logger="vllm.unweight"):
        assert decode_rewritten(m, owners, shapes, lambda layer, why: pytest.fail("nothing to rebuild")) == {}
    # one expert asked per layer and projection (3 x 2), both layers' attention projections (4 x 2),
    # and every stand-in reached its layer as it left
    assert sorted(m.asked) == sorted(n for n in owners if ".experts." not in n or ".experts.0." in n)
    assert "14 kinds of compressed tensor: 0 rewritten on the way to their layers, 14 unchanged, 0 skipped" in \
        _counts(caplog)
    assert [(n, p.shape, p.dtype) for n, p in m.named_parameters()] == before


@pytest.mark.parametrize("rule, ops, layer", [
    # Llama 4 / Mistral format: q and k rows permuted for the rotary layout, keyed on ".weight"
    (lambda n, w: _permute_rows(w, HEADS) if n.endswith("q_proj.weight") else w, "view, transpose, reshape", "qkv"),
    # GPT-2's Conv1D: transposed (a square matrix keeps its shape, so no shape check sees it)
    (lambda n, w: w.t() if n.endswith("o_proj.weight") else w, "t", "o"),
    (lambda n, w: w.to(torch.float16) if n.endswith("v_proj.weight") else w, "to", "qkv"),
    # a model that cuts its rank's block itself; arithmetic
    (lambda n, w: w.chunk(2, dim=0)[1] if "experts" in n and n.endswith("w1.weight") else w, "chunk", "experts"),
    (lambda n, w: w * 2 if n.endswith("w2.weight") else w, "mul", "experts"),
])
def test_a_layer_whose_tensor_the_loader_rewrites_is_rebuilt_as_bf16_or_the_load_stops(rule, ops, layer):
    m = _fix_names(_Model(rule))
    before = [n for n, _ in m.named_parameters()]
    owners, shapes = _tensors(m)
    # The planes' names escape such a rule: why the loader is asked with the tensor's own name.
    plane = torch.empty(3, dtype=torch.uint8)
    assert all(rule(n + C.SUFFIX_SM, plane) is plane for n in owners)
    rewritten = loader_rewrites(m, owners, shapes)
    assert rewritten and all(", ".join(o).startswith(ops) for o in rewritten.values()), rewritten
    # every name of a rewritten kind: each layer's, each expert's (though one expert was asked)
    assert sorted(rewritten) == sorted(n for n in owners if rule(n, stand_in(n, shapes[n])).ops)
    rebuilt = []
    paths = {m.layers[i].qkv_proj: f"layers.{i}.qkv_proj" for i in (0, 1)}
    paths.update({m.layers[i].o_proj: f"layers.{i}.o_proj" for i in (0, 1)})
    if layer != "experts":
        got = decode_rewritten(m, owners, shapes, lambda lay, why: rebuilt.append((paths[lay], why)) or True)
        assert sorted(got) == [f"layers.{i}.{layer}_proj" for i in (0, 1)] and [p for p, _ in rebuilt] == sorted(got)
        assert all(why.startswith("vLLM's loader of _Model rewrites ") and f"at load ({ops}" in why
                   for _, why in rebuilt)
    else:  # (experts cannot be rebuilt as BF16 ones: the load stops, in one line)
        with pytest.raises(InputError) as e:
            decode_rewritten(m, owners, shapes, lambda lay, why: False)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("vLLM's loader of _Model rewrites layers.0.experts.0.w") and \
            f"on its way to layers.0.experts ({ops}" in msg and "--load-format unweight" in msg, msg
    assert [n for n, _ in m.named_parameters()] == before


def test_copies_and_round_trips_are_not_rewrites():
    rules = [lambda n, w: w.clone(), lambda n, w: w.contiguous().detach(), lambda n, w: w.to(torch.bfloat16),
             lambda n, w: w.view(-1).view(w.shape), lambda n, w: w.t().t(), lambda n, w: w.data,
             lambda n, w: w.to(device="cpu"), lambda n, w: w.cpu().to("cpu", torch.bfloat16)]
    for rule in rules:
        m = _fix_names(_Model(rule))
        owners, shapes = _tensors(m)
        assert loader_rewrites(m, owners, shapes) == {}
    s = stand_in("x", (4, 6))
    assert unchanged(s) and unchanged(s.unsqueeze(0).unbind()[0]) and not unchanged(s.t().contiguous())
    assert not unchanged(s[1:]) and not unchanged(s.flip(0)) and not unchanged(s.clone().t())
    assert not unchanged(s.to("cpu", torch.float16)) and s.to("cpu").device.type == "meta"


def test_a_tensor_taken_to_another_layer_stops_the_load():
    m = _fix_names(_Model())
    owners, shapes = _tensors(m)
    owners["layers.1.self_attn.o_proj.weight"] = m.layers[0].o_proj  # (planes held by layer 0's o_proj)
    with pytest.raises(InputError, match=r"takes layers.1.self_attn.o_proj.weight to layers.1.o_proj, "
                                         r"not to layers.0.o_proj,"):
        loader_rewrites(m, owners, shapes)


def test_a_loader_that_fails_on_one_stand_in_is_asked_about_the_others_alone(caplog):
    def rule(n, w):
        if n.endswith("v_proj.weight"):
            w.item()  # (what a meta tensor cannot do)
        return _permute_rows(w, 2) if n.endswith("k_proj.weight") else w

    class _Batched(_Model):
        def load_weights(self, weights):  # (one call for the whole stream, as vLLM's loaders take it)
            return super().load_weights((n.replace(".self_attn", ""), w) for n, w in weights)
    m = _Batched(rule)
    owners, shapes = _tensors(m)
    with caplog.at_level("INFO", logger="vllm.unweight"):
        assert sorted(loader_rewrites(m, owners, shapes)) == [f"layers.{i}.self_attn.k_proj.weight" for i in (0, 1)]
    assert "14 kinds of compressed tensor: 2 rewritten on the way to their layers, 10 unchanged, 2 skipped" in \
        _counts(caplog)


def test_skipped_names_are_not_asked_and_one_name_is_asked_per_kind():
    m = _fix_names(_Model())
    owners, shapes = _tensors(m)
    skip = {n for n in owners if ".experts.0." in n or ".experts.1." in n}
    assert loader_rewrites(m, owners, shapes, skip=skip) == {}
    assert {n for n in m.asked if ".experts." in n} == {f"layers.{i}.experts.2.{p}.weight" for i in (0, 1)
                                                         for p in ("w1", "w2", "w3")}
    assert one_per_kind(["m.layers.10.experts.3.w1.weight", "m.layers.2.experts.11.w1.weight",
                         "m.layers.2.experts.2.w1.weight", "m.layers.2.experts.2.w2.weight", "lm_head.weight"]) == [
        "lm_head.weight", "m.layers.2.experts.2.w1.weight", "m.layers.2.experts.2.w2.weight",
        "m.layers.10.experts.3.w1.weight"]
