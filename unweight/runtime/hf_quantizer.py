"""transformers integration: ``quant_method: "unweight"`` config + HfQuantizer.

After ``register()`` (done automatically once ``import unweight`` has happened and
transformers' quantizer registry is imported, see runtime/hf_hook.py),
``AutoModelForCausalLM.from_pretrained(compressed_folder)`` / ``AutoModel.from_pretrained``
build the model on the meta device, swap in compressed modules found from the checkpoint's
tensors (runtime/loader.py convert_model), verify the checkpoint, let transformers load the
plane tensors into the modules' buffers by name, then apply the mode (default "auto").
device_map, generate and lm-eval's HFLM need nothing else.

Choosing the mode: transformers keeps the checkpoint's quantization_config over one passed to
from_pretrained for custom methods, so use ``unweight.load(path, mode=...)`` or pass a config
whose ``quantization_config["mode"]`` is set (``AutoConfig.from_pretrained`` + edit).
"""
from __future__ import annotations

import logging
import os

from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING,
                                          register_quantization_config, register_quantizer)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..format import constants as C
from ..format.errors import InputError
from . import tp

log = logging.getLogger(__name__)


class UnweightConfig(QuantizationConfigMixin):
    """The ``quantization_config`` block ``unweight compress`` writes into config.json.

    format_version: "1.0"; encoding: what compress was asked for; mode: runtime mode
    ("auto" | "huffman" | "palette" | "dense"); verify: decode+checksum pass at load.
    Unknown keys (tool_version, encoded_dtype, ...) are kept so config.json round-trips.
    """

    def __init__(self, format_version: str = C.FORMAT_VERSION, encoding: str = "huffman", mode: str = "auto",
                 verify: bool = True, **kwargs):
        kwargs.pop("quant_method", None)
        self.quant_method = C.QUANT_METHOD
        self.format_version = str(format_version)
        self.encoding = encoding
        self.mode = mode
        self.verify = verify
        for k, v in kwargs.items():
            setattr(self, k, v)
        major = self.format_version.split(".")[0]
        if major != str(C.VERSION_MAJOR):
            from ..format.errors import VersionError
            raise VersionError(f"unsupported unweight format version {self.format_version} "
                               f"(this reader knows {C.VERSION_MAJOR}.x; upgrade unweight)")

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
        from .. import _C  # noqa: F401  (the CPU codec must be importable)
        dm = kwargs.get("device_map")
        if isinstance(dm, dict) and "disk" in dm.values():
            raise InputError("unweight checkpoints cannot be disk-offloaded (device_map has 'disk')")

    def update_dtype(self, dtype):
        return dtype

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from ..format.checkpoint import CompressedCheckpoint
        from . import loader
        if not checkpoint_files:
            raise InputError("unweight: from_pretrained gave no checkpoint files")
        folder = os.path.dirname(os.path.abspath(checkpoint_files[0]))
        ck = CompressedCheckpoint(folder)
        try:
            verify = loader._env_verify(bool(getattr(self.quantization_config, "verify", True)))
            # Under torch.distributed (transformers' tensor parallelism) each rank reads and
            # decodes only its shard of every encoded tensor after loading (runtime/tp.py); here
            # only the structure and the raw tensors' checksums are checked.
            deferred = tp.distributed_world() > 1
            loader.verify_checkpoint(ck, decode=verify and not deferred)
            loader.convert_model(model, ck)
            if deferred:
                tp.defer_planes(model, ck, folder)
        finally:
            ck.close()
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        from . import loader
        mode = getattr(self.quantization_config, "mode", "auto") or "auto"
        if getattr(model, "_unweight_tp", None):
            tp.load_tp_planes(model, verify=loader._env_verify(bool(getattr(self.quantization_config, "verify",
                                                                                True))))
            mode = tp.resolve_mode(mode, model)
            before = dict(model.named_modules())
            loader.prepare(model, mode)
            tp.reinstall_styles(model, before)
            return model
        loader.prepare(model, mode)
        return model

    def is_serializable(self):
        # State dicts hold planes but not the raw tensors' checksums a reader requires:
        # write unweight checkpoints with `unweight compress`.
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
