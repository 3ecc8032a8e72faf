"""``--load-format unweight``: decode every compressed tensor to BF16 at load.

The fallback path: any architecture vLLM supports, on any platform vLLM runs on (CPU
included), because the model is built unquantized and sees ordinary BF16 tensors under their
original names; vLLM's own loaders then shard them for tensor parallelism.  Each rank decodes
the whole tensors it is handed (that is the price of the fallback; the quantization path is
the one that keeps weights compressed).  Every decode is crc-verified.

The quantization path (``--load-format auto`` on an unweight checkpoint) uses the same
decoding for the layers a model builds without a quantization config (a vision tower's, for
one; an embedding or head built so is held compressed instead, quant.compress_embedding_at_load):
vLLM's default loader is wrapped so that a compressed tensor no unweight method claims reaches
the model decoded, under its own name.  vLLM's expert-parallel weight
filter is given the planes' tensor names, and under expert parallelism the stream skips other
ranks' experts' planes unread whether the filter is on or not, and the planes of the expert
stacks their methods read themselves.  Before the load starts, the model's own loader is asked
whether it would rewrite a tensor whose planes pass it by; such a tensor's layer is rebuilt as a
BF16 one and fed the decoded tensor (rewrites.py).
"""
from __future__ import annotations

from collections.abc import Generator

import torch
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from ...codec import tensor_codec as tc
from ...format import constants as C
from ...format.checkpoint import split_name
from ...format.header import TensorHeader
from . import quant
from .common import SKIP_UNREAD, log, missing_plane, moe_ranks, report_layer
from .rewrites import decode_rewritten

LOAD_FORMAT = "unweight"


def decode_planes_iterator(weights, where: str = "", keep=frozenset(),
                           elsewhere=None) -> Generator[tuple[str, torch.Tensor], None, None]:
    """(name, tensor) stream of a compressed checkpoint -> (name, tensor) with encoded tensors
    decoded to bf16 [N, K] (host) under their original names; raw tensors, and the planes of
    the encoded tensors named in `keep` or for which elsewhere(name) is true, pass through.

    The planes of one tensor are stored next to each other in its shard, so at most one
    tensor's planes are held at a time (apart from interleaved orders, which still work).
    """
    pending: dict[str, dict] = {}
    for name, t in weights:
        base, suf = split_name(name)
        if suf is None or base in keep or (elsewhere is not None and elsewhere(base)):
            yield name, t
            continue
        pl = pending.setdefault(base, {})
        pl[suf] = t
        if C.SUFFIX_HDR not in pl:
            continue
        h = TensorHeader.parse(pl[C.SUFFIX_HDR].numpy(), base)
        need = tc.planes_for(h)
        if any(s not in pl for s in need):
            continue
        w = tc.decode(h, {s: pl[s].numpy() for s in need}, where=base)
        del pending[base]
        report_layer(base, {"path": "decoded-to-bf16-at-load", "encoding": h.encoding_name})
        log.info("unweight: %s -> decoded to bf16 at load (%s)", base, h.encoding_name)
        yield base, torch.from_numpy(w).view(torch.bfloat16)
    for base, pl in pending.items():
        raise missing_plane(pl, base)


@register_model_loader(LOAD_FORMAT)
class UnweightDecodingLoader(DefaultModelLoader):
    """DefaultModelLoader over safetensors whose weight stream decodes unweight planes."""

    def __init__(self, load_config: LoadConfig):
        # DefaultModelLoader only knows its own formats; the files are plain safetensors.
        load_config.load_format = "safetensors"
        super().__init__(load_config)

    def create_model(self, vllm_config, model_config, prefix: str = ""):
        qc = vllm_config.quant_config
        if isinstance(qc, quant.UnweightConfig):
            qc.decode_at_load = True  # every layer built unquantized (plain bf16 parameters)
        return super().create_model(vllm_config, model_config, prefix)

    def get_all_weights(self, model_config, model):
        yield from decode_planes_iterator(super().get_all_weights(model_config, model),
                                          elsewhere=built_elsewhere(model))


def built_elsewhere(model: torch.nn.Module):
    """None, or a test of checkpoint names: true for a tensor of a layer this model does not
    build here, which vLLM's loaders skip by name (so its planes pass by undecoded: decoding
    them would cost the whole decode of what is skipped):

    * a layer of another pipeline stage, or a tower --language-model-only leaves out
      (models.utils.is_pp_missing_parameter's placeholders);
    * a numbered layer its container does not hold: DeepSeek-V3's multi-token-prediction
      layer (model.layers.61) in the main model, every other layer in the draft model that
      holds only that one (vLLM skips them by index, get_spec_layer_idx_from_weight_name).

    Names are mapped to vLLM's as the model's loader maps them (hf_to_vllm_mapper); a name
    that maps elsewhere, or to nothing, is decoded."""
    from vllm.model_executor.models.utils import get_pp_missing_layer_names
    missing = tuple(get_pp_missing_layer_names(model))
    numbered = {n: set(m._modules) for n, m in model.named_modules()
                if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)) and m._modules}
    if not missing and not numbered:
        return None
    mapper = getattr(model, "hf_to_vllm_mapper", None)

    def elsewhere(name: str) -> bool:
        mapped = mapper.map_name(name) if mapper is not None else name
        if mapped is None:
            return False
        if missing and mapped.startswith(missing):
            return True
        parts = mapped.split(".")
        for j in range(1, len(parts) - 1):
            held = numbered.get(".".join(parts[:j]))
            if held is not None and parts[j].isdigit() and parts[j] not in held:
                return True
        return False
    return elsewhere


def claimed_tensors(model: torch.nn.Module) -> dict:
    """{checkpoint name: layer} of the encoded tensors the model's unweight methods take as
    planes through the model's loader, each with the layer whose method takes it (a tied output
    head takes none: it computes with its embedding's)."""
    from .moe import UnweightFusedMoEMethod, UnweightStackedMoEMethod
    out = {}
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if isinstance(qm, quant._UnweightMethodBase) and getattr(m, "_uw_tied_to", None) is None:
            out.update((n, m) for n, _ in qm.parts)
        elif isinstance(qm, UnweightFusedMoEMethod) and not isinstance(qm, UnweightStackedMoEMethod):
            out.update((n, m) for n in qm.names.values())
    return out


def _unweight_config(model: torch.nn.Module):
    """The UnweightConfig the model's unweight methods were built with, else None."""
    for m in model.modules():
        cfg = getattr(getattr(m, "quant_method", None), "config", None)
        if isinstance(cfg, quant.UnweightConfig):
            return cfg
    return None


def _stored_shapes(config) -> dict:
    """{checkpoint name: stored shape} of the encoded tensors an unweight config lists."""
    if config is None:
        return {}
    return {n: (e[5], e[0], e[1]) if e[5] else (e[0], e[1]) for n, e in config.encoded.items()}


def stacked_tensors(model: torch.nn.Module) -> dict:
    """{checkpoint name: (method, layer)} of the expert stacks the model's unweight methods take
    straight from the weight stream (moe.UnweightStackedMoEMethod.take_plane)."""
    from .moe import UnweightStackedMoEMethod
    out = {}
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if isinstance(qm, UnweightStackedMoEMethod):
            out.update({n: (qm, m) for n in qm.stacks.values()})
    return out


def _hand_stacks(weights, stacks: dict):
    """The weight stream less the planes of `stacks` ({name: (method, layer)}), which go to
    their methods as they pass."""
    for name, t in weights:
        base, suf = split_name(name)
        if suf is not None and base in stacks:
            method, layer = stacks[base]
            method.take_plane(layer, base, suf, t)
            continue
        yield name, t


_DEFAULT_GET_ALL_WEIGHTS = DefaultModelLoader.get_all_weights


def _get_all_weights(self, model_config, model):
    """DefaultModelLoader.get_all_weights for unweight checkpoints: encoded tensors that no
    unweight method claims (layers built without a quantization config) arrive decoded, and
    under expert parallelism the tensors of unread_tensors are skipped unread."""
    SKIP_UNREAD.clear()  # (this load's, not an earlier model's in the same process)
    weights = _DEFAULT_GET_ALL_WEIGHTS(self, model_config, model)
    if getattr(model_config, "quantization", None) != C.QUANT_METHOD:
        yield from weights
        return
    stacks = stacked_tensors(model)
    SKIP_UNREAD.update(unread_tensors(model))
    try:
        yield from decode_planes_iterator(_hand_stacks(weights, stacks) if stacks else weights,
                                          keep=claimed_tensors(model), elsewhere=built_elsewhere(model))
    finally:
        SKIP_UNREAD.clear()


def unread_tensors(model: torch.nn.Module) -> set:
    """Checkpoint names of the encoded tensors this rank's weight stream need not read, under
    expert parallelism: the other ranks' per-expert tensors (compressed experts take no
    redundant experts: vLLM's EPLB is refused for them), and the expert stacks whose methods
    read their own experts' segments themselves."""
    from .moe import UnweightFusedMoEMethod, UnweightStackedMoEMethod, _local_experts
    out = set()
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if isinstance(qm, UnweightStackedMoEMethod):
            if qm.self_read:
                out.update(qm.stacks.values())
        elif isinstance(qm, UnweightFusedMoEMethod) and moe_ranks(m)[3] > 1:
            local = set(_local_experts(m))
            out.update(name for (e, _), name in qm.names.items() if e not in local)
    return out


DefaultModelLoader.get_all_weights = _get_all_weights

_DEFAULT_LOAD_WEIGHTS = DefaultModelLoader.load_weights


def _load_weights(self, model, model_config):
    """DefaultModelLoader.load_weights for unweight checkpoints: first, before a byte is read,
    embeddings vLLM built without a quantization config take their compressed tensors
    (quant.compress_embedding_at_load); then the model's own loader is asked which compressed
    tensors it would rewrite on their way to their layers (planes would pass such a rewrite by),
    and their layers are rebuilt as BF16 ones, fed decoded tensors (rewrites.decode_rewritten,
    quant.decode_layer_at_load).  Here and not in the weight stream: the model's load_weights
    lists its parameters before reading the stream."""
    if getattr(model_config, "quantization", None) == C.QUANT_METHOD:
        config = _unweight_config(model)
        if config is not None:
            for path, m in list(model.named_modules()):
                quant.compress_embedding_at_load(config, model, m, path)
        decode_rewritten(model, claimed_tensors(model), _stored_shapes(config), quant.decode_layer_at_load,
                         skip=unread_tensors(model))
    return _DEFAULT_LOAD_WEIGHTS(self, model, model_config)


DefaultModelLoader.load_weights = _load_weights


def _plane_aware(skip):
    """vLLM's expert-parallel weight filter (``enable_ep_weight_filter``: each rank skips the
    other ranks' per-expert tensors before reading them) judging an encoded tensor's planes by
    the tensor's own name: ``...experts.7.down_proj.weight__sm`` as ``...experts.7.down_proj.weight``.
    vLLM's rule takes only names ending in ``.weight``, so without this every rank would read
    every expert's planes from the files and drop the others' (the MoE layer report's
    ``other_ranks_planes``), where with BF16 files it reads only its own experts.  With the
    filter on or off, the planes of common.SKIP_UNREAD's tensors are skipped: under expert
    parallelism a rank reads neither other ranks' experts nor the stacks it reads itself."""
    if getattr(skip, "unweight_planes", False):
        return skip

    def should_skip_weight(weight_name: str, local_expert_ids) -> bool:
        base, suffix = split_name(weight_name)
        if suffix is not None and base in SKIP_UNREAD:
            return True
        return skip(base if suffix else weight_name, local_expert_ids)
    should_skip_weight.unweight_planes = True
    return should_skip_weight


try:  # (a vLLM without the filter reads every expert's tensors, BF16 and planes alike)
    from vllm.model_executor.model_loader import weight_utils as _weight_utils
    if hasattr(_weight_utils, "should_skip_weight"):
        _weight_utils.should_skip_weight = _plane_aware(_weight_utils.should_skip_weight)
except ImportError:
    pass
