"""transformers integration: ``quant_method: "unweight"`` config + HfQuantizer.

After ``register()`` (done automatically once transformers' quantizer registry is imported,
in any process of an environment where unweight is installed, see hook.py and startup.py),
``AutoModelForCausalLM.from_pretrained(compressed_folder)`` / ``AutoModel.from_pretrained``
build the model on the meta device, verify the checkpoint (codec/verify.py), swap in
compressed modules found from the checkpoint's tensors (runtime/convert.py), let
transformers load the plane tensors into the modules' buffers by name, refuse a partial
load (a stored tensor not consumed, a parameter left at its initial value), then apply the
mode (runtime/prepare.py, default "auto").  device_map, generate and lm-eval's HFLM need
nothing else.

Choosing the mode: transformers keeps the checkpoint's quantization_config over one passed to
from_pretrained for custom methods, so use ``unweight.load(path, mode=...)`` or pass a config
whose ``quantization_config["mode"]`` is set (``AutoConfig.from_pretrained`` + edit).
"""
from __future__ import annotations

import logging
import os

import torch

from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING,
                                          register_quantization_config, register_quantizer)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ...format import constants as C
from ...format.errors import FormatError, InputError
from ...format.quant_config import check_format_version, refuse_source_quantization

# The loading machinery (codec, runtime, torch ops) is imported inside the methods that use it:
# register() runs in every process that imports transformers' quantizer registry (hook.py),
# and should cost that process only these few light modules, not the ~0.15 s of op
# registration that loading a compressed model needs.

log = logging.getLogger(__name__)


class UnweightConfig(QuantizationConfigMixin):
    """The ``quantization_config`` block ``unweight compress`` writes into config.json.

    format_version: "1.0"; encoding: what compress was asked for; mode: runtime mode
    ("auto" | "huffman" | "palette" | "dense"); verify: decode+checksum pass at load;
    plane_order: "auto", "file" or "tiled", the order palette matmul weights are held in (prepare);
    merge_siblings: stack sibling projections (prepare); l2_prefetch: prefetch each matmul's
    weight into L2 (prepare).  The last five are load options (unweight.load sets them).
    Unknown keys (tool_version, encoded_dtype, ...) are kept so config.json round-trips.
    """

    def __init__(self, format_version: str = C.FORMAT_VERSION, encoding: str = "huffman", mode: str = "auto",
                 verify: bool = True, plane_order: str = "auto", **kwargs):
        kwargs.pop("quant_method", None)
        self.quant_method = C.QUANT_METHOD
        self.format_version = str(format_version)
        self.encoding = encoding
        self.mode = mode
        self.verify = verify
        self.plane_order = plane_order
        for k, v in kwargs.items():
            setattr(self, k, v)
        check_format_version(self.format_version)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["quant_method"] = C.QUANT_METHOD
        return d


class UnweightHfQuantizer(HfQuantizer):
    """Loads unweight checkpoints with weights kept compressed (pre-quantized only)."""

    requires_calibration = True  # there is no on-the-fly "quantize" path: compress offline
    quantization_config: UnweightConfig

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._ck = None

    def validate_environment(self, *args, **kwargs):
        # transformers calls this with the device_map passed to from_pretrained, and again with
        # the map it computes for "auto" / "balanced" / "sequential" (where max_memory may send
        # modules to disk).
        dm = kwargs.get("device_map")
        places = dm.items() if isinstance(dm, dict) else [("", dm)] if isinstance(dm, (str, torch.device)) else []
        for module, dev in places:
            where = f"puts {module} on" if module else "is"
            if str(dev) == "disk":
                raise InputError(f"unweight checkpoints cannot be offloaded to disk (the device_map {where} 'disk'; "
                                 "give max_memory room for the compressed model, or pass device_map='cpu')")
            if str(dev) == "meta":
                # The planes are checked and prepared after loading: on meta they hold no bytes.
                raise InputError(f"unweight checkpoints cannot be loaded onto the meta device (the device_map {where} "
                                 "'meta'); build the model with from_config under torch.device('meta') for shapes")

    def update_dtype(self, dtype):
        # The encoded weights decode to bfloat16. A model built in another dtype would hold them
        # among float32 (or float16) norms: not the original model in that dtype, and in dense
        # mode a dtype error at the first forward (see runtime.modules.refuse_dtype_cast).
        if dtype is not None and dtype != torch.bfloat16:
            raise InputError(f"unweight checkpoints load in bfloat16, the dtype their weights are stored in; got "
                             f"dtype={dtype} (pass dtype=torch.bfloat16 or 'auto', or decompress the checkpoint "
                             "to load it in another dtype)")
        return dtype

    def update_weight_conversions(self, weight_conversions, *args, **kwargs):
        # The plane keys (``<name>__hdr`` ...) pass through transformers' converters under their
        # own names (runtime.experts.whole_names); convert_model places them.  The base method
        # takes the model as a second argument in recent transformers, none in 5.17.
        from ...runtime.experts import whole_names
        return whole_names(super().update_weight_conversions(weight_conversions, *args, **kwargs))

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from ...codec.verify import verify_checkpoint
        from ...format.checkpoint import CompressedCheckpoint
        from ...runtime import convert
        from ...runtime.verify import verify_setting
        from . import ep, tp
        if not checkpoint_files:
            raise InputError("unweight: from_pretrained gave no checkpoint files")
        folder = os.path.dirname(os.path.abspath(checkpoint_files[0]))
        refuse_source_quantization(getattr(self.quantization_config, "source_quantization_config", None), folder)
        ck = CompressedCheckpoint(folder)
        try:
            where = verify_setting(bool(getattr(self.quantization_config, "verify", True)))
            # The encoded tensors are checked once placed, where they are held (prepare's verify:
            # a GPU decodes and hashes its own weights; under torch.distributed, transformers'
            # tensor parallelism, each rank its blocks), unless UNWEIGHT_VERIFY=host asks for the
            # CPU pass: over the files here, or over each rank's blocks as tp.py reads them.
            # Here always: the structure and the raw tensors' checksums.
            deferred = tp.distributed_world() > 1
            verify, host = where is not None, where == "host"
            verify_checkpoint(ck, decode=host and not deferred)
            # (how many encoded tensors the check after placing must reach; under tensor
            # parallelism each rank checks its block of each and the group combines them)
            model._unweight_held_check = len(ck.encoded) if verify and not host else 0
            convert.convert_model(model, ck)
            if deferred:
                ep.quiet_stack_rules(model)
                tp.refuse_unserved_layouts(model)
                # (other ranks' per-expert tensors are checked where they are held)
                left = ep.keep_local_experts(model, ck, folder)
                model._unweight_held_check = max(0, model._unweight_held_check - left)
                tp.check_experts(model)
                tp.defer_planes(model, ck, folder)
        finally:
            ck.close()
        convert.capture_loading_info(model)
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        from ...runtime import convert
        from ...runtime.prepare import prepare
        from ...runtime.verify import verify_setting
        from . import ep, tp
        loading = getattr(model, "_unweight_loading", None)
        if loading is not None:
            convert.check_loading(model, *loading)
        mode = getattr(self.quantization_config, "mode", "auto") or "auto"
        order = getattr(self.quantization_config, "plane_order", "auto") or "auto"
        expect = int(getattr(model, "_unweight_held_check", 0) or 0)
        if getattr(model, "_unweight_tp", None):
            # The blocks are checked as held after prepare (held_check) unless the host pass was
            # asked for (UNWEIGHT_VERIFY=host: each rank decodes its blocks here) or none was.
            host = not expect and verify_setting(bool(getattr(self.quantization_config, "verify", True))) is not None
            tp.load_tp_planes(model, verify=host)
            ep.load_local_stacks(model, tp.device_of(model), verify=host)
            if host:
                tp.host_check_experts(model)
            mode = tp.resolve_mode(mode, model)
            before = dict(model.named_modules())
            # transformers' TP plan shards each projection on its own: stacking would mix the shards
            info = prepare(model, mode, plane_order=order, merge_siblings=False,
                           verify=tp.held_check(model) if expect else False)
            tp.reinstall_styles(model, before)
        else:
            merge = getattr(self.quantization_config, "merge_siblings", "auto")
            info = prepare(model, mode, plane_order=order, merge_siblings=merge if merge in (True, False) else "auto",
                           l2_prefetch=bool(getattr(self.quantization_config, "l2_prefetch", False)),
                           verify=expect > 0)
        if expect:
            # Dense fallbacks were decoded, and checked, where convert placed them; tensors the
            # model's own loader drops are not part of the model.
            plan = getattr(model, "_unweight_plan", {}) or {}
            done = info["verified_tensors"] + len(plan.get("dense_fallback", [])) + len(plan.get("ignored", []))
            if done < expect:
                raise FormatError(f"unweight: the load check reached {done} of the checkpoint's {expect} encoded "
                                  "tensors; set UNWEIGHT_VERIFY=host to check them on the CPU before loading")
        return model

    def is_serializable(self):
        # State dicts hold planes but not the raw tensors' checksums a reader requires:
        # write unweight checkpoints with `unweight compress`.  transformers asks here only in
        # save_pretrained, and its refusal points to this logger for the reason.
        log.warning("unweight: a model loaded from a compressed checkpoint is not saved again: the compressed "
                    "folder it came from is its checkpoint (copy it), and `unweight decompress` writes the BF16 "
                    "original")
        return False

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def register() -> bool:
    """Register config + quantizer with transformers (idempotent).  True when registered."""
    if C.QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(C.QUANT_METHOD)(UnweightConfig)
    if C.QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(C.QUANT_METHOD)(UnweightHfQuantizer)
    return True


# Importing this module registers, whichever import brought transformers' registry in first
# (hook.py defers to this line when the registry's import came from the imports above).
register()
