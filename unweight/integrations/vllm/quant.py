"""vLLM quantization method "unweight": weights stay compressed in each rank's memory.

Imported by :func:`unweight.integrations.vllm.plugin.register` only (it imports vLLM).

Loading, per layer and rank:
  * create_weights registers empty *placeholder* parameters named like the checkpoint's
    planes (``weight__hdr``, ``weight__sm``, ...), so vLLM's own name mapping
    (q_proj -> qkv_proj with shard id "q", ...) routes each plane to the right layer.
  * each placeholder's weight_loader takes the plane (a lazily mapped safetensors tensor),
    keeps a reference until the tensor's planes are complete, then copies out only the
    segments of this rank's rows (column-parallel, vocab-parallel) or columns (row-parallel)
    with unweight.codec.shard.shard_planes.  The full planes are dropped.
  * process_weights_after_loading decodes each piece once (structure check + crc of the
    shard), checks the TP group's shard crcs against the stored crc32 of every tensor by
    crc32 arithmetic (no rank decodes a whole tensor), registers the pieces as buffers and
    removes the placeholders.
Layers whose weights vLLM itself handles as BF16 tensors are built unquantized and fed
decoded tensors instead (UnweightConfig._read_as_bf16): MLA's kv_b_proj, whose weight its
attention reads at load, and the tensors an architecture's loader rewrites before a layer
sees them (Llama 4's q/k).
A model quantized by another method before compression (``source_quantization_config``):
layers holding no compressed tensor get the method vLLM gives them for the original
checkpoint, built from the original's config (source_config); the config's hooks that vLLM
calls (packed modules, name mappers, kv-cache scale names) reach it too.
Forward: one ``unweight_vllm::linear`` / ``::embedding`` op call per layer, running the
shared runtime dispatch (decode into the per-device scratch, then vLLM's own GEMM; a fused
kernel where the measured policy picks one).

Modes (``quantization_config.mode``, as unweight.load's): "huffman" / "palette" keep the
shards compressed (transcoding a piece stored in the other encoding), "auto" keeps the
stored encoding (serving is where memory is short), "dense" decodes each rank's shard to
BF16 at load.  ``quantization_config.plane_order`` (or UNWEIGHT_PLANE_ORDER) "tiled" holds the
palette pieces of linear layers tile-major (ops/layout.py; the same results), "file" as
stored, and "auto" (the default) each piece in the order the dispatch table measured faster
for its shape on this GPU (a shape never timed: the nearest timed shape's; file order where
nothing applies, and on CPU).
``quantization_config.merge_siblings`` (or UNWEIGHT_MERGE_SIBLINGS) true holds a merged layer's
palette pieces (q/k/v, gate/up) as one matrix under one palette (runtime/siblings.py): one
fused launch per forward instead of one per piece and a concatenation; "auto" (the default)
only where the dispatch table measured the stack faster than the pieces apart; false never.  Every layer
logs one ``unweight layer report {json}`` line: its path, and per
piece the block of the tensor this rank holds and its bytes (an experts layer: one entry per
gate / up / down over the rank's experts, the bytes summed).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch import nn

from vllm.model_executor.layers.linear import (ColumnParallelLinear, LinearBase, LinearMethodBase,
                                               MergedColumnParallelLinear, QKVParallelLinear,
                                               ReplicatedLinear, RowParallelLinear, UnquantizedLinearMethod)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

from ...codec import shard as sh
from ...codec import tensor_codec as tc
from ...codec.shard_check import check_shard_records
from ...codec.verify import check_raw, check_records
from ...format import constants as C
from ...format.checkpoint import CompressedCheckpoint
from ...format.errors import ChecksumError, FormatError, InputError
from ...format.header import TensorHeader
from ...format.quant_config import check_format_version
from ...runtime import dispatch, scratch
from ...runtime.modes import check_mode, check_plane_order, sharded_mode
from ...runtime.policy import DispatchPolicy
from ...runtime.siblings import stack_gain, stack_weights
from ...runtime.tuning_table import load_table
from ...runtime.verify import HeldCheck, block_fault, held_shard_record, shard_record_of, verify_setting
from ...runtime.weights import hold_paired, hold_row_index
from . import ops as uvops
from .common import (PLANE_DTYPES, device_piece, gather, hold_tiled, log, missing_plane, piece_record, report_layer,
                     take_shard, tp_info)

_DEFAULT_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

# Tensors vLLM reads dense, which planes would escape: the layers holding them are built
# unquantized and fed decoded tensors (loader.py: no unweight method claims them), so vLLM does
# with them what it does with the BF16 checkpoint's.  Multi-head latent attention (DeepSeek-V2/V3,
# Kimi-K2) folds kv_b_proj's weight into its per-head matrices at load
# (get_and_maybe_dequant_weights knows only dense, FP8 and packed-integer weights); ~0.05% of such
# a model's weights.  Tensors a model's own loader rewrites on their way to their layers (Llama 4's
# q and k) are found by asking the loader, and their layers rebuilt the same way, before the load
# (rewrites.py, decode_layer_at_load).
_READ_DENSE = {"kv_b_proj": "vLLM's MLA attention reads this weight dense"}


class _GemmHolder(torch.nn.Module):
    """The module vLLM's CPU GEMM dispatch configures (it sets ``cpu_linear`` on it). Defined
    here, not inside _cpu_gemm: torch.compile cannot trace a class statement."""


def _cpu_gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """vLLM's own CPU GEMM dispatch (oneDNN on x86), so a compressed model computes with the
    same kernel, hence the same bits, as vLLM serving the BF16 original; F.linear elsewhere."""
    if x.device.type != "cpu":
        return torch.nn.functional.linear(x, w, bias)
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return torch.nn.functional.linear(x, w, bias)

    tmp = _GemmHolder()
    tmp.weight = torch.nn.Parameter(w, requires_grad=False)
    if bias is not None:
        # the sgl path may convert a bias in place; keep the caller's tensor untouched
        tmp.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(tmp, remove_weight=False)
    return tmp.cpu_linear(x, tmp.weight, tmp.bias if bias is not None else None)


uvops.set_policy(DispatchPolicy(load_table(), dense_linear=_cpu_gemm))


@torch.library.custom_op("unweight_vllm::dense_gemm", mutates_args=())
def dense_gemm(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """x [..., K] @ w [N, K]^T (+ bias) through _cpu_gemm, for a weight decoded at load (dense
    mode): [..., N] in x's dtype. An op, so that a compiled graph calls it as a whole: vLLM's
    CPU GEMM set-up cannot be traced."""
    return _cpu_gemm(x, w, bias)


@dense_gemm.register_fake
def _(x, w, bias):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def _refuse_lora() -> None:
    """LoRA layers wrap the base layer's dense weight, which compressed layers do not have
    (vLLM then fails deep inside its LoRA code): say so in one line and name the way that works."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:  # an older vLLM: nothing to ask
        return
    cfg = get_current_vllm_config_or_none()
    if cfg is not None and getattr(cfg, "lora_config", None) is not None:
        raise InputError("unweight: LoRA adapters need the base weights dense; serve this checkpoint with "
                         "--load-format unweight (decoded to bf16 at load) to use --enable-lora")


def _flag(env: str | None, value, default="auto"):
    """An on / off / "auto" option: the environment's word when set ("1", "true", "yes", "on";
    "0", "false", "no", "off"; "auto"), else the config's value, else `default`."""
    v = env.strip().lower() if env else value
    if v is None:
        return default
    if isinstance(v, str):
        w = v.strip().lower()
        return True if w in ("1", "true", "yes", "on") else False if w in ("0", "false", "no", "off") else w
    return bool(v)


@register_quantization_config(C.QUANT_METHOD)
class UnweightConfig(QuantizationConfig):
    """quantization_config of a checkpoint written by ``unweight compress``."""

    def __init__(self, format_version: str = C.FORMAT_VERSION, encoding: str | None = None, mode: str = "auto",
                 plane_order: str = "auto", merge_siblings: bool | str = "auto"):
        super().__init__()
        self.format_version = check_format_version(format_version)
        self.encoding = encoding
        self.mode = check_mode(mode or "auto")
        # palette linear weights held tile-major (ops/layout.py) or as stored, as unweight.load's
        self.plane_order = check_plane_order(plane_order)
        # a merged projection's palette pieces (q/k/v, gate/up) held as one stacked matrix:
        # True, False, or "auto" where the dispatch table measured the stack faster
        if merge_siblings not in (True, False, "auto"):
            raise InputError(f"merge_siblings={merge_siblings!r}: choose true, false or \"auto\"")
        self.merge_siblings = merge_siblings
        # base tensor name -> [rows, cols, encoding, R, C, stack]; filled by maybe_update_config
        self.encoded: dict[str, list] = {}
        self.model_path: str | None = None
        self.tie_word_embeddings = False
        # set by the "unweight" load format: every layer unquantized, planes decoded at load
        self.decode_at_load = False
        # the quantization config of a model quantized before compression, as vLLM's config
        # object and as written (source_config); None for a bf16 model
        self.source: QuantizationConfig | None = None
        self.source_qc: dict | None = None
        # names of the tensors stored raw in a dense float dtype; filled by maybe_update_config
        self.dense_raw: set[str] = set()

    def __repr__(self):
        return f"UnweightConfig(format_version={self.format_version}, encoding={self.encoding}, mode={self.mode})"

    def get_name(self):
        return C.QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "UnweightConfig":
        self = cls(format_version=config.get("format_version", C.FORMAT_VERSION), encoding=config.get("encoding"),
                   mode=os.environ.get("UNWEIGHT_MODE") or config.get("mode") or "auto",
                   plane_order=os.environ.get("UNWEIGHT_PLANE_ORDER") or config.get("plane_order") or "auto",
                   merge_siblings=_flag(os.environ.get("UNWEIGHT_MERGE_SIBLINGS"), config.get("merge_siblings")))
        if config.get("source_quantization_config") is not None:
            self.source_qc = config["source_quantization_config"]
            self.source = source_config(self.source_qc)
        return self

    # ------------------------------------------------- a model quantized before compression

    # A checkpoint of a model another method quantized (Kimi-K2.5's int4 experts under
    # compressed-tensors, DeepSeek-V3's fp8 blocks) holds that method's tensors as they were and
    # its bf16 matrices compressed.  The stored tensors decide each layer's method: compressed
    # weights an unweight method, weights stored dense (bf16, f16, f32: dense_raw) vLLM's
    # unquantized one, any other the method vLLM gives the layer for the original checkpoint,
    # from the original quantization config (source_config).  Not the config alone: a model may
    # build a tower without it (vLLM's Kimi-K2.5 builds its vision tower so, whose weights are
    # bf16 but match the config's targets).  vLLM's hooks on the config reach both.

    @property
    def packed_modules_mapping(self) -> dict:
        return self._packed_modules_mapping

    @packed_modules_mapping.setter
    def packed_modules_mapping(self, mapping: dict) -> None:
        # (vLLM sets the model's mapping on the config it built; the source method needs it too)
        self._packed_modules_mapping = mapping
        if getattr(self, "source", None) is not None:
            self.source.packed_modules_mapping = mapping

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.source is not None:
            self.source.apply_vllm_mapper(hf_to_vllm_mapper)

    def get_cache_scale_mapper(self):
        return self.source.get_cache_scale_mapper() if self.source is not None else super().get_cache_scale_mapper()

    def get_checkpoint_weight_mapper(self):
        return (self.source.get_checkpoint_weight_mapper() if self.source is not None
                else super().get_checkpoint_weight_mapper())

    @property
    def _ignore_unexpected_suffixes(self):
        return (self.source if self.source is not None else super())._ignore_unexpected_suffixes

    def _uncompressed_method(self, layer: nn.Module, prefix: str, names: list, unquantized):
        """The method of a layer none of whose weights (checkpoint `names`) is compressed: the
        source method's, unless every weight is stored dense; else `unquantized` (vLLM's bf16
        method, or None for vLLM's default)."""
        if self.source is not None and not all(n in self.dense_raw for n in names):
            return self._source_method(layer, prefix)
        if not self.decode_at_load:
            report_layer(prefix or "embedding", {"path": "raw-bf16"})
        return unquantized

    def _source_method(self, layer: nn.Module, prefix: str):
        """The original checkpoint's method for a layer that holds no compressed tensor."""
        method = self.source.get_quant_method(layer, prefix)
        rank, size = tp_info(layer)
        if _quantizes(method):
            report_layer(prefix, {"path": "source-quantized", "method": self.source.get_name(), "tp_rank": rank,
                                  "tp_size": size})
        elif isinstance(layer, (LinearBase, VocabParallelEmbedding)) and not self.decode_at_load:
            report_layer(prefix or "embedding", {"path": "raw-bf16", "tp_rank": rank, "tp_size": size})
        return method

    def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None):
        """Read every encoded tensor's header (small ``__hdr`` planes only) from the checkpoint.

        Runs in the main process when vLLM builds its config, so a bad checkpoint (missing
        shard, missing plane, version mismatch) stops the server here with a one-line cause,
        before any worker starts or any request can arrive.
        """
        path = model_name
        if not os.path.isdir(path):
            try:
                from huggingface_hub import snapshot_download
                path = snapshot_download(model_name, revision=revision, local_files_only=True)
            except Exception as e:  # noqa: BLE001 - turned into a one-line cause
                raise InputError(f"{model_name}: unweight needs the checkpoint on local disk "
                                 f"({type(e).__name__}); download it first") from None
        self.model_path = path
        if hf_config is not None:
            self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        cp = CompressedCheckpoint(path)
        try:
            for base, planes in cp.encoded.items():
                h = cp.header(base)
                need = tc.planes_for(h)
                missing = [s for s in need if s not in planes]
                if missing:
                    raise FormatError(f"{cp.location(base)}: compressed tensor is missing plane {missing[0]} "
                                      f"(re-run unweight compress, or copy the complete checkpoint)")
                self.encoded[base] = [h.rows, h.cols, h.encoding, h.rows_per_group, h.cols_per_chunk, h.stack]
            # Raw tensors (norms, biases, tensors left unencoded) reach the model through vLLM's
            # own loader, which checks nothing: their stored crc32 are checked here, once, so a
            # flipped bit stops the server at start instead of serving another model.
            self.dense_raw = {n for n in cp.raw if cp.info(n)[0] in ("BF16", "F16", "F32")}
            check_records(cp)
            for name in cp.raw:
                check_raw(cp, name)
                cp.release(name)
        finally:
            cp.close()
        log.info("unweight: %d compressed tensors in %s", len(self.encoded), path)
        if self.source is not None:
            self._update_source(model_name, hf_config, revision)

    def _update_source(self, model_name: str, hf_config, revision) -> None:
        """What vLLM does for the original config when it builds it: compressed-tensors is told
        the attention head counts (weight_utils.get_quant_config: for per-head scales at TP),
        then each method's own update hook runs."""
        qc = self.source_qc
        if hf_config is not None and qc.get("quant_method") == "compressed-tensors" and "config_groups" in qc:
            text = getattr(hf_config, "text_config", None) or hf_config
            heads = getattr(text, "num_attention_heads", None)
            kv = getattr(text, "num_key_value_heads", None)
            if heads is not None:
                self.source = source_config({**qc, "total_num_heads": heads,
                                             "total_num_kv_heads": kv if kv is not None else heads})
                self.source.packed_modules_mapping = self.packed_modules_mapping
        self.source.maybe_update_config(model_name, hf_config=hf_config, revision=revision)

    # -------------------------------------------------------------------- layer routing

    def _parts(self, prefix: str) -> list[tuple[str, Any]]:
        """Checkpoint names (and shard ids) that make up the vLLM layer ``prefix``."""
        head, _, last = prefix.rpartition(".")
        packed = self.packed_modules_mapping or {}
        subs = packed.get(last) or _DEFAULT_PACKED.get(last)
        if not subs:
            return [(f"{prefix}.weight", None)]
        ids = ["q", "k", "v"] if last == "qkv_proj" and len(subs) == 3 else list(range(len(subs)))
        return [(f"{head}.{s}.weight" if head else f"{s}.weight", i) for s, i in zip(subs, ids)]

    def _fused_parts(self, layer, prefix: str, parts: list) -> list:
        """`parts`, or for a QKV or merged-column layer whose checkpoint stores its parts as one
        matrix ``{prefix}.weight`` (Phi-3's qkv_proj and gate_up_proj, which vLLM's packed
        mapping maps to themselves), that matrix once per part's shard id: each part's piece is
        its section of the matrix's rows."""
        name = f"{prefix}.weight"
        names = [n for n, _ in parts]
        if name not in self.encoded or (names != [name] and all(n in self.encoded for n in names)):
            return parts
        if isinstance(layer, QKVParallelLinear):
            return [(name, sid) for sid in ("q", "k", "v")]
        if isinstance(layer, MergedColumnParallelLinear):
            return [(name, i) for i in range(len(layer.output_sizes))]
        return parts

    def _read_as_bf16(self, name: str) -> str | None:
        """Why vLLM reads checkpoint tensor `name` dense (_READ_DENSE), else None."""
        mods = name.split(".")
        return _READ_DENSE.get(mods[-2]) if len(mods) >= 2 else None

    def _embedding_name(self, layer: VocabParallelEmbedding, prefix: str) -> str | None:
        if prefix:
            name = f"{prefix}.weight"
            if name in self.encoded:
                return name
            if isinstance(layer, ParallelLMHead) and self.tie_word_embeddings:
                return self._embedding_name(layer, "")  # tied: lm_head reads the embedding
            return None
        # vLLM builds some input embeddings without a prefix: find the one encoded matrix of
        # the layer's shape that is not the output head.
        cands = [n for n, m in self.encoded.items()
                 if m[0] == layer.org_vocab_size and m[1] == layer.embedding_dim and "lm_head" not in n]
        cands.sort(key=lambda n: ("embed" not in n, n))
        return cands[0] if cands else None

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if not self.decode_at_load:
            _refuse_lora()
        if isinstance(layer, LinearBase):
            parts = self._fused_parts(layer, prefix, self._parts(prefix))
            enc = [n in self.encoded for n, _ in parts]
            if not any(enc):
                return self._uncompressed_method(layer, prefix, [n for n, _ in parts], UnquantizedLinearMethod())
            if self.decode_at_load:
                return UnquantizedLinearMethod()
            why = [r for r in (self._read_as_bf16(n) for n, _ in parts) if r]
            if why:
                rank, size = tp_info(layer)
                report_layer(prefix, {"path": "decoded-to-bf16-at-load", "reason": why[0], "tp_rank": rank,
                                      "tp_size": size})
                return UnquantizedLinearMethod()
            if all(enc):
                return UnweightLinearMethod(self, prefix, parts)
            raw = [n for (n, _), e in zip(parts, enc) if not e]
            raise InputError(f"{prefix}: merged layer mixes compressed and raw parts ({', '.join(raw)} raw); "
                             f"serve it with --load-format unweight (decodes to bf16 at load)")
        if isinstance(layer, VocabParallelEmbedding):
            name = self._embedding_name(layer, prefix)
            if name is None:
                return self._uncompressed_method(layer, prefix, [f"{prefix}.weight"], None)
            if self.decode_at_load:
                return None
            return UnweightEmbeddingMethod(self, prefix or name.rsplit(".", 1)[0], [(name, None)])
        from vllm.model_executor.layers.fused_moe import RoutedExperts
        if isinstance(layer, RoutedExperts):
            from .moe import expert_names, experts_compressed, moe_quant_method
            if not experts_compressed(self, layer, prefix):
                return self._uncompressed_method(layer, prefix, list(expert_names(layer, prefix).values()), None)
            if self.decode_at_load:
                return None  # vLLM's unquantized experts, fed decoded bf16 by the loader
            return moe_quant_method(self, layer, prefix)
        # (attention: a source method's kv-cache scales)
        return self.source.get_quant_method(layer, prefix) if self.source is not None else None


def source_config(source_qc) -> QuantizationConfig:
    """vLLM's config object for the method that quantized a model before compression, built
    from the quantization_config the original checkpoint carried (kept by ``unweight compress``
    as ``source_quantization_config``).  InputError for a method this vLLM does not know."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    method = source_qc.get("quant_method") if isinstance(source_qc, dict) else None
    if method == C.QUANT_METHOD or method not in QUANTIZATION_METHODS:
        raise InputError(f"unweight checkpoint: the model was quantized with {method!r} before compression, which "
                         f"this vLLM does not serve; run `unweight decompress` and serve the original checkpoint")
    return get_quantization_config(method).from_config(dict(source_qc))


def _quantizes(method) -> bool:
    """Whether a source method computes with quantized weights (else: vLLM's bf16 one, or none)."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    return method is not None and not isinstance(
        method, (UnquantizedLinearMethod, UnquantizedEmbeddingMethod, UnquantizedFusedMoEMethod))


# ------------------------------------------------------------------------------ shared machinery


class _UnweightMethodBase(QuantizeMethodBase):
    """Placeholder params at create time, per-rank pieces after load, one op per forward."""

    # Planes stay on the load device as they are; nothing needs the target device early.
    requires_device_loading = True

    def __init__(self, config: UnweightConfig, prefix: str, parts: list):
        self.config = config
        self.prefix = prefix
        self.parts = parts  # [(checkpoint name, shard id)]
        self.shard_ids = [sid for _, sid in parts]
        # one stored matrix holding every part as a section of rows (Phi-3's qkv_proj and
        # gate_up_proj): each part's piece is cut from it, and the group checks it as a whole
        self.fused = len(parts) > 1 and len({n for n, _ in parts}) == 1

    # ---- create

    def _register_placeholders(self, layer: nn.Module, out_rows: int, cols: int):
        layer._uw_pending = {}
        layer._uw_pieces = {}
        layer._uw_out_rows = int(out_rows)
        layer._uw_cols = int(cols)
        layer._uw_method = self
        for suf in C.ALL_SUFFIXES:
            # empty: vLLM's device context puts it on the load device; holds nothing
            p = nn.Parameter(torch.empty(0, dtype=PLANE_DTYPES[suf]), requires_grad=False)
            p.weight_loader = self._make_loader(layer, suf)
            layer.register_parameter("weight" + suf, p)
        self._check_shapes_early(layer)

    def _check_shapes_early(self, layer):
        """Fail at model construction (before reading weights) when TP cannot split the grid."""
        rank, size = tp_info(layer)
        for name, sid in self.parts:
            m = self.config.encoded.get(name)
            if m is not None:
                h = TensorHeader(encoding=m[2], rows=m[0], cols=m[1], rows_per_group=m[3], cols_per_chunk=m[4],
                                 crc32=0)
                self._shard_range(layer, h, sid, name)

    def _make_loader(self, layer, suffix):
        def load(param, loaded_weight, shard_id=None):
            if shard_id is None:
                shard_id = getattr(loaded_weight, "shard_id", None)
            # a fused matrix's planes come once (vLLM's loaders give a whole stored tensor no
            # shard id): every part's piece is cut from them
            for sid in (self.shard_ids if self.fused and shard_id is None else [shard_id]):
                layer._uw_pending.setdefault(sid, {})[suffix] = loaded_weight
                self._maybe_finish_piece(layer, sid)
        return load

    # ---- shard geometry

    def _shard_range(self, layer, h: TensorHeader, shard_id, name: str):
        """(rows, cols) of this rank's block of the checkpoint tensor, its shape checked against
        the model's.  Any block: one off the segment grid is decoded from the segments that
        hold it and encoded anew (take_shard)."""
        rank, size = tp_info(layer)
        what = f"{name} [{h.rows}x{h.cols}, {h.encoding_name} grid {h.rows_per_group}x{h.cols_per_chunk}]"
        if isinstance(layer, VocabParallelEmbedding):
            si = layer.shard_indices
            a, b = si.org_vocab_start_index, si.org_vocab_end_index
            if h.rows != layer.org_vocab_size or h.cols != layer.embedding_dim:
                raise InputError(f"{what}: model expects [{layer.org_vocab_size}x{layer.embedding_dim}]")
            return (a, b), None
        if isinstance(layer, RowParallelLinear):
            if h.cols != layer.input_size or h.rows != layer.output_size:
                raise InputError(f"{what}: model expects [{layer.output_size}x{layer.input_size}]")
            return None, sh.tp_shard_range(h.cols, size, rank, what=what, axis="cols")
        if self.fused and isinstance(layer, QKVParallelLinear):
            hs, vs = layer.head_size, layer.v_head_size
            q, kv = layer.total_num_heads * hs, layer.total_num_kv_heads
            if h.rows != q + kv * (hs + vs) or h.cols != layer.input_size:
                raise InputError(f"{what}: model expects [{q + kv * (hs + vs)}x{layer.input_size}] (q, k and v "
                                 "stored as one matrix)")
            if shard_id == "q":
                n, off = layer.num_heads * hs, rank * layer.num_heads * hs
            else:
                width = vs if shard_id == "v" else hs
                n = layer.num_kv_heads * width
                off = q + (kv * hs if shard_id == "v" else 0) + (rank // layer.num_kv_head_replicas) * n
            return (off, off + n), None
        if self.fused and isinstance(layer, MergedColumnParallelLinear):
            total = sum(layer.output_sizes)
            if h.rows != total or h.cols != layer.input_size:
                raise InputError(f"{what}: model expects [{total}x{layer.input_size}] ({len(layer.output_sizes)} "
                                 "parts stored as one matrix)")
            off = sum(layer.output_sizes[:shard_id])
            a, b = sh.tp_shard_range(layer.output_sizes[shard_id], size, rank, what=what, axis="rows")
            return (off + a, off + b), None
        if isinstance(layer, QKVParallelLinear):
            hs = layer.v_head_size if shard_id == "v" else layer.head_size
            if shard_id == "q":
                n, idx, total = layer.num_heads * hs, rank, layer.total_num_heads
            else:
                n, idx, total = layer.num_kv_heads * hs, rank // layer.num_kv_head_replicas, layer.total_num_kv_heads
            if h.rows != total * hs or h.cols != layer.input_size:
                raise InputError(f"{what}: model expects [{total * hs}x{layer.input_size}]")
            a, b = idx * n, idx * n + n
            return (a, b), None
        if isinstance(layer, MergedColumnParallelLinear):
            full = layer.output_sizes[shard_id]
            if h.rows != full or h.cols != layer.input_size:
                raise InputError(f"{what}: model expects [{full}x{layer.input_size}]")
            return sh.tp_shard_range(full, size, rank, what=what, axis="rows"), None
        if isinstance(layer, ColumnParallelLinear):
            if h.rows != layer.output_size or h.cols != layer.input_size:
                raise InputError(f"{what}: model expects [{layer.output_size}x{layer.input_size}]")
            return sh.tp_shard_range(h.rows, size, rank, what=what, axis="rows"), None
        if isinstance(layer, ReplicatedLinear):
            return None, None
        raise InputError(f"{self.prefix}: unweight has no tensor-parallel rule for {type(layer).__name__}; "
                         f"use --load-format unweight")

    def _maybe_finish_piece(self, layer, shard_id):
        name = dict((sid, n) for n, sid in self.parts).get(shard_id, self.parts[0][0])
        piece = take_shard(layer._uw_pending[shard_id], name, lambda h: self._shard_range(layer, h, shard_id, name))
        if piece is not None:
            layer._uw_pieces[shard_id] = piece
            del layer._uw_pending[shard_id]  # drop the references to the full (mapped) planes

    # ---- after load

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        rank, size = tp_info(layer)
        for sid, pend in layer._uw_pending.items():
            raise missing_plane(pend, dict((s, n) for n, s in self.parts).get(sid, self.parts[0][0]))
        missing = [n for n, sid in self.parts if sid not in layer._uw_pieces]
        if missing:
            raise FormatError(f"{self.prefix}: no planes of {missing[0]} were found in the checkpoint "
                              "(a missing safetensors shard, or a --load-format that does not read the "
                              "checkpoint, e.g. dummy)")
        dev = next((p.device for p in layer.parameters(recurse=False)), torch.device("cpu"))
        where = verify_setting()
        verify = where is not None
        mode = sharded_mode(self.config.mode, layer._uw_pieces[self.shard_ids[0]]["header"].encoding_name)
        # On a GPU each piece is checked as held (runtime/verify.py): decoded there by the decoder
        # a forward runs and hashed there, the records then gathered as the host's are; a dense
        # layer's pieces by the rows of the weight decoded below.  Elsewhere: the host codec.
        on_device = where == "held" and HeldCheck.on_device(dev)
        if on_device and mode != "dense":
            scratch.reserve(dev, layer._uw_out_rows * layer._uw_cols)
        weights, report, dense_checks, checks = [], [], [], []
        for sid in self.shard_ids:
            pc = layer._uw_pieces[sid]
            if verify and not on_device:  # (the host decodes the rank's block once)
                checks.append((pc, piece_record(pc)[1], None))
            w = device_piece(pc["header"], pc["planes"], dev, mode, pc["name"])
            # Tile-major only where the pieces feed matmuls alone: not an embedding (its row
            # gather reads file order), which a tied lm_head computes with.
            if mode != "dense" and (not isinstance(layer, VocabParallelEmbedding)
                                    or isinstance(layer, ParallelLMHead)):
                w = hold_tiled(w, self.config.plane_order, uvops.current_policy())
            if on_device and mode != "dense":
                mine = held_shard_record(w, pc["rows"], pc["cols"], pc["full_header"].cols, uvops.current_policy())
                # on a mismatch: this rank's device, or the planes? (the host decodes them too)
                checks.append((pc, mine, lambda pc=pc, mine=mine: block_fault(pc["name"], dev, mine,
                                                                              lambda: piece_record(pc)[1])))
            elif on_device:
                dense_checks.append((pc, sum(x.rows for x in weights)))
            weights.append(w)
            held = sum(int(t.numel() * t.element_size()) for t in uvops.piece_planes(w, _EMPTY) if t is not None)
            hs = pc["header"]
            report.append({"name": pc["name"], "shard_id": sid, "encoding": w.encoding_name,
                           "full_shape": [pc["full_header"].rows, pc["full_header"].cols],
                           "rows": list(pc["rows"]), "cols": list(pc["cols"]), "held_shape": [hs.rows, hs.cols],
                           "held_bytes": held, "full_planes_bytes": pc["full_bytes"],
                           "plane_order": "tiled" if w.tiled else "file",
                           "bf16_shard_bytes": hs.rows * hs.cols * 2, "recoded": pc["recoded"]})
        self._check_group(layer, checks)
        for suf in C.ALL_SUFFIXES:
            delattr(layer, "weight" + suf)
        del layer._uw_pieces, layer._uw_pending
        record = {"tp_rank": rank, "tp_size": size, "verified": verify, "mode": mode}
        if self._stacks(weights, mode, layer, dev):
            # One matrix of the pieces' rows under one palette (runtime/siblings.py): one fused
            # launch and no concatenation per forward; decode + GEMM gives the same bits.
            stacked = stack_weights(weights, uvops.current_policy())
            weights = [hold_tiled(hold_row_index(hold_paired(stacked)) if dev.type == "cuda" else stacked,
                                  self.config.plane_order, uvops.current_policy())]
            w = weights[0]
            record["stacked"] = {"rows": w.rows, "plane_order": "tiled" if w.tiled else "file",
                                 "held_bytes": sum(int(t.numel() * t.element_size())
                                                   for t in uvops.piece_planes(w, _EMPTY) if t is not None)}
        if mode == "dense":
            w = dispatch.decode_new(weights, layer._uw_out_rows, layer._uw_cols, uvops.current_policy())
            self._check_group(layer, [(pc, shard_record_of(w[r0:r0 + pc["header"].rows], pc["rows"], pc["cols"],
                                                           pc["full_header"].cols), None) for pc, r0 in dense_checks])
            layer.register_buffer("uw_dense", w, persistent=False)
            layer._uw_n, layer._uw_meta = 0, []
            for r in report:
                r["held_bytes"] = r["bf16_shard_bytes"]
            record["path"] = "decoded-to-bf16-at-load"
        else:
            tensors, meta = [], []
            for i, w in enumerate(weights):
                for j, t in enumerate(uvops.piece_planes(w, torch.empty(0, dtype=torch.uint8, device=dev))):
                    layer.register_buffer(f"uw_{i}_{j}", t, persistent=False)
                    tensors.append(t)
                meta.extend(uvops.piece_meta(w))
            layer._uw_n, layer._uw_meta = len(tensors), meta
            scratch.reserve(dev, layer._uw_out_rows * layer._uw_cols)
            record["path"] = "compressed"
            # (a matmul: not an embedding's row gather, but a head computing logits)
            if uvops.current_policy() is not None and (not isinstance(layer, VocabParallelEmbedding)
                                                       or isinstance(layer, ParallelLMHead)):
                uvops.current_policy().report_unmeasured([(w, dev) for w in weights])
            uvops.check_kernels(dev)  # the kernels its forwards may run, once per device
        held = record["stacked"]["held_bytes"] if "stacked" in record else sum(r["held_bytes"] for r in report)
        bf16 = sum(r["bf16_shard_bytes"] for r in report)
        report_layer(self.prefix, {**record, "pieces": report, "held_bytes": held, "bf16_bytes": bf16})
        log.info("unweight: %s -> %s (%s, rank %d/%d holds %s, %.3fx of its bf16 shard)", self.prefix,
                 "compressed in memory" if mode != "dense" else "decoded to bf16 at load", report[0]["encoding"],
                 rank, size, ", ".join(f"{r['name'].rsplit('.', 2)[-2]} rows {r['rows']} cols {r['cols']}"
                                       for r in report), held / max(1, bf16))

    def _stacks(self, weights: list, mode: str, layer, dev) -> bool:
        """Whether a merged layer's palette pieces are held as one stack: merge_siblings True, or
        "auto" and the dispatch table measured the stack faster than the pieces apart
        (DispatchPolicy.stack_gain, at batch 1 in the order the stack would be held in)."""
        want = self.config.merge_siblings
        if (not want or mode != "palette" or len(weights) < 2 or isinstance(layer, VocabParallelEmbedding)
                or any(w.is_huffman for w in weights)):
            return False
        if want is True:
            return True
        gain = stack_gain([w.rows for w in weights], weights[0].cols, self.config.plane_order,
                          uvops.current_policy(), dev)
        return gain is not None and gain > 1.0

    def _check_group(self, layer, checks: list) -> None:
        """Check the TP group's blocks of each tensor against its stored crc32.  checks: [(piece,
        this rank's shard record of it, None or a callable giving the DeviceFaultError that
        explains a mismatch)].  Each piece's records are gathered and checked on their own; a
        fused matrix's (every part a section of one stored tensor) all together, since only
        all the parts' blocks of all ranks tile the tensor."""
        for group in ([checks] if self.fused and checks else [[c] for c in checks]):
            pc = group[0][0]
            records = [r for rank in gather(layer, [mine for _, mine, _ in group]) for r in rank]
            try:
                check_shard_records(records, pc["full_header"], pc["name"])
            except ChecksumError as e:
                fault = next((f for f in (why() for _, _, why in group if why is not None) if f is not None), None)
                raise (fault or e) from None

    def _planes(self, layer) -> list:
        return [getattr(layer, f"uw_{i // uvops.PLANES_PER_PIECE}_{i % uvops.PLANES_PER_PIECE}")
                for i in range(layer._uw_n)]

    def _linear(self, layer, x, bias):
        if hasattr(layer, "uw_dense"):
            return torch.ops.unweight_vllm.dense_gemm(x, layer.uw_dense, bias)
        return torch.ops.unweight_vllm.linear(x, self._planes(layer), layer._uw_meta, bias, layer._uw_out_rows,
                                              layer._uw_cols)


_EMPTY = torch.empty(0, dtype=torch.uint8)


class UnweightLinearMethod(_UnweightMethodBase, LinearMethodBase):
    """Linear layer whose rank-local weight is kept as compressed pieces."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        self._register_placeholders(layer, sum(output_partition_sizes), input_size_per_partition)

    def apply(self, layer, x, bias=None):
        return self._linear(layer, x, bias)


def decode_layer_at_load(layer: nn.Module, reason: str) -> bool:
    """Rebuild `layer`, a linear layer built with an unweight method whose weights have not been
    read yet, as the BF16 layer vLLM builds without unweight: its plane placeholders removed and
    its weight created as the layer's constructor creates an unquantized one, so that the load
    feeds it decoded tensors (loader.claimed_tensors no longer claims its parts) through the
    model's own loader, rewrites included.  Reports the layer decoded, for `reason`.  False, and
    nothing done, for any other layer."""
    qm = getattr(layer, "quant_method", None)
    if not (isinstance(layer, LinearBase) and isinstance(qm, UnweightLinearMethod)):
        return False
    for suf in C.ALL_SUFFIXES:
        layer._parameters.pop("weight" + suf, None)
    for attr in ("_uw_pending", "_uw_pieces", "_uw_out_rows", "_uw_cols", "_uw_method"):
        layer.__dict__.pop(attr, None)
    method = UnquantizedLinearMethod()
    layer.quant_method = method
    # (as LinearBase's constructors call it: ReplicatedLinear with its whole input and its own
    # loader; the others with their partition and the v2 loader, which vLLM pairs with this method)
    replicated = isinstance(layer, ReplicatedLinear)
    method.create_weights(layer=layer,
                          input_size_per_partition=layer.input_size if replicated else layer.input_size_per_partition,
                          output_partition_sizes=layer.output_partition_sizes, input_size=layer.input_size,
                          output_size=layer.output_size, params_dtype=layer.params_dtype,
                          weight_loader=layer.weight_loader if replicated else layer.weight_loader_v2)
    rank, size = tp_info(layer)
    report_layer(qm.prefix, {"path": "decoded-to-bf16-at-load", "reason": reason, "tp_rank": rank, "tp_size": size})
    log.info("unweight: %s -> decoded to bf16 at load (%s)", qm.prefix, reason)
    return True


def compress_embedding_at_load(config: UnweightConfig, model: nn.Module, layer: nn.Module, path: str) -> str | None:
    """Hold compressed an embedding or output head that vLLM built without a quantization config
    (Gemma 2's input embedding, StableLM's and Mixtral's), whose weights have not been read yet
    and whose checkpoint tensor is encoded: its BF16 weight removed and the unweight method's
    plane placeholders created as the layer's constructor creates a quantized layer's, so the
    load feeds it planes.  A weight another module shares (a head tied to it) is left as it is.
    Returns the checkpoint name it now takes, else None (nothing done)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    if not isinstance(layer, VocabParallelEmbedding) or type(layer.quant_method) is not UnquantizedEmbeddingMethod:
        return None
    weight = getattr(layer, "weight", None)
    if config.decode_at_load or not isinstance(weight, nn.Parameter):
        return None
    if any(m is not layer and getattr(m, "weight", None) is weight for m in model.modules()):
        return None
    name = config._embedding_name(layer, path)
    if name is None or name != f"{path}.weight":  # (only the tensor of its own name: no guess)
        return None
    del layer._parameters["weight"]
    method = UnweightEmbeddingMethod(config, path, [(name, None)])
    layer.quant_method = method
    method.create_weights(layer, layer.input_size_per_partition, layer.output_partition_sizes, layer.input_size,
                          layer.output_size, params_dtype=layer.params_dtype, weight_loader=layer.weight_loader)
    log.info("unweight: %s -> held compressed (vLLM builds it without a quantization config)", path)
    return name


class UnweightEmbeddingMethod(_UnweightMethodBase):
    """Vocab-parallel embedding / lm_head kept as the rank's compressed vocab rows."""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        self._register_placeholders(layer, sum(output_partition_sizes), input_size_per_partition)

    def tie_weights(self, layer, embed_tokens):
        # lm_head computes with the embedding's pieces; it holds no copy of its own.
        layer._uw_tied_to = embed_tokens
        for suf in C.ALL_SUFFIXES:
            if hasattr(layer, "weight" + suf):
                delattr(layer, "weight" + suf)
        layer._uw_method = None
        return layer

    def process_weights_after_loading(self, layer):
        if getattr(layer, "_uw_tied_to", None) is not None:
            report_layer(self.prefix, {"path": "compressed (tied to the embedding)"})
            return
        super().process_weights_after_loading(layer)

    def _src(self, layer):
        return getattr(layer, "_uw_tied_to", None) or layer

    def embedding(self, layer, input_):
        src = self._src(layer)
        if hasattr(src, "uw_dense"):
            return torch.nn.functional.embedding(input_, src.uw_dense)
        return torch.ops.unweight_vllm.embedding(input_, self._planes(src), src._uw_meta, src._uw_out_rows,
                                                 src._uw_cols)

    def apply(self, layer, x, bias=None):
        return self._linear(self._src(layer), x, bias)
