"""The two models of a comparison: resolving, loading, and refusing pairs that differ in
architecture or tokenizer."""
from __future__ import annotations

import os

from ..format.errors import FormatError, InputError

# config.json keys that may differ between an original and its compressed copy
_CONFIG_IGNORE = {"quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype",
                  "torch_dtype", "_commit_hash", "_attn_implementation_autoset", "_attn_implementation_internal"}



def _resolve_original(src: str) -> str:
    from ..sources import resolve
    path = resolve(src, what="ORIGINAL")
    if not os.path.isdir(path):
        raise InputError(f"{src}: ORIGINAL must be a model folder (config.json, tokenizer, weights)")
    return path


def _config_dict(path: str, role: str) -> dict:
    import json
    f = os.path.join(path, "config.json")
    if not os.path.isfile(f):
        raise InputError(f"{path}: no config.json (the {role} model must be a transformers model folder)")
    try:
        with open(f, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except OSError as e:
        raise InputError(f"{f}: cannot read the {role} model's config ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError both are
        raise FormatError(f"{f}: corrupt config.json of the {role} model ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise FormatError(f"{f}: corrupt config.json of the {role} model (not a JSON object)")
    return cfg


def check_weights(path: str, role: str):
    """Open the weight files' headers (no tensor is read) so that a truncated, foreign or
    missing weight file is refused before any model runs, not after the other model's whole
    evaluation.  COMPRESSED must open as an unweight checkpoint; ORIGINAL is checked only when
    it holds safetensors (transformers also reads the other serialisations it may hold)."""
    from ..codec.verify import check_records
    from ..format.checkpoint import Checkpoint, CompressedCheckpoint
    if role == "original":
        names = os.listdir(path)
        if not any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
            if not any(os.path.splitext(n)[1] in (".bin", ".pt", ".pth", ".h5", ".msgpack") for n in names):
                raise InputError(f"{path}: no weight files (the original model must be a transformers model folder)")
            return
        Checkpoint(path).close()
        return
    ck = CompressedCheckpoint(path)
    try:
        check_records(ck)
    finally:
        ck.close()


def check_causal_lm(cfg: dict, src: str):
    """Refuse a model lm-eval cannot score as a causal LM, before loading it: an encoder
    (BERT: its model_type has a causal-LM class, BertLMHeadModel, but its weights are a
    BertModel) would load with a random head and fail inside lm-eval."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal
    model_type, archs = cfg.get("model_type"), cfg.get("architectures") or []
    classes = {c for v in causal.values() for c in ((v,) if isinstance(v, str) else v)}
    if not isinstance(model_type, str) or model_type not in causal or (archs and not any(a in classes for a in archs)):
        what = ", ".join(map(str, archs)) or f"model_type {model_type!r}"
        raise InputError(f"{src}: not a causal language model ({what}); unweight eval compares causal LMs "
                         "(AutoModelForCausalLM)")


def _load_tokenizer(path: str, role: str):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot load the {role} model's tokenizer ({str(e).splitlines()[0]})") from None


def _is_unweight(cfg: dict) -> bool:
    qc = cfg.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == "unweight"


def looks_compressed(path: str) -> bool:
    """Whether `path` is a folder whose config.json says unweight (for a hint, never an error)."""
    try:
        return _is_unweight(_config_dict(path, "given"))
    except (InputError, FormatError):  # only a hint: an unreadable config is simply not one
        return False


def check_compatible(orig_cfg: dict, comp_cfg: dict, orig_tok, comp_tok):
    """Refuse to compare models of different architectures or tokenizers (InputError naming the difference)."""
    if _is_unweight(orig_cfg) and not _is_unweight(comp_cfg):
        raise InputError("ORIGINAL is an unweight-compressed checkpoint and COMPRESSED is not: the arguments "
                         "are swapped? (unweight eval ORIGINAL COMPRESSED)")
    if not _is_unweight(comp_cfg):
        raise InputError("COMPRESSED has no unweight quantization_config in config.json: "
                         "pass a folder written by `unweight compress`")
    if _is_unweight(orig_cfg):
        raise InputError("ORIGINAL is itself an unweight-compressed checkpoint: pass the uncompressed source "
                         "(or `unweight decompress` it first)")
    keys = sorted((set(orig_cfg) | set(comp_cfg)) - _CONFIG_IGNORE)
    for k in keys:
        if orig_cfg.get(k) != comp_cfg.get(k):
            raise InputError(f"the models differ in architecture: config.json {k!r} is {orig_cfg.get(k)!r} in "
                             f"ORIGINAL and {comp_cfg.get(k)!r} in COMPRESSED; refusing to compare")
    probe = "Lossless? 0.5 + ½ = 1 — naïve café 東京\n\tdone."
    checks = [("tokenizer class", type(orig_tok).__name__, type(comp_tok).__name__),
              ("special tokens", orig_tok.all_special_tokens, comp_tok.all_special_tokens),
              ("bos/eos/pad ids", (orig_tok.bos_token_id, orig_tok.eos_token_id, orig_tok.pad_token_id),
               (comp_tok.bos_token_id, comp_tok.eos_token_id, comp_tok.pad_token_id)),
              ("vocabulary", orig_tok.get_vocab(), comp_tok.get_vocab()),
              ("tokenization of a probe text", orig_tok(probe)["input_ids"], comp_tok(probe)["input_ids"])]
    for what, a, b in checks:
        if a != b:
            raise InputError(f"the models have different tokenizers ({what} differ); refusing to compare")


def _load_original(path: str, device: str):
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto",
                                                     device_map=None if device == "cpu" else device)
    except OSError as e:  # transformers' "no file named ..." and unreadable files
        raise InputError(f"{path}: cannot load the original model ({str(e).splitlines()[0]})") from None
    model.eval()
    return model


def _load_compressed(path: str, device: str, mode: str):
    from ..integrations.transformers.load import load
    from transformers import AutoModelForCausalLM
    # AutoModelForCausalLM: the same class choice as the original (config.architectures[0] for a causal LM).
    return load(path, device=device, mode=mode, model_class=AutoModelForCausalLM, dtype="auto")

