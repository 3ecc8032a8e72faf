"""A small synthetic Llama (bf16) whose head counts divide by 2.  Every side is a multiple of
256, so the writer's grid splits each matrix 2, 4 and 8 ways on both axes (docs/FORMAT.md,
"Index cost and the writer's grid"), at hidden sizes under 1024 too."""
from __future__ import annotations

import os

PROMPTS = [[1, 17, 230, 5, 901, 44], [3, 3, 3, 3], [600, 12, 999, 250, 8, 77, 1000, 2]]


def make_llama(dst: str, *, tie: bool = False, heads: int = 8, kv_heads: int = 2, seed: int = 0,
               hidden: int = 1024, ffn: int = 2048) -> str:
    """Write a 2-layer Llama [hidden, ffn, vocab 1024] in bf16 to dst; return dst."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      tie_word_embeddings=tie, initializer_range=0.05, bos_token_id=1, eos_token_id=2,
                      torch_dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # norms at 1.0 are exact in any format; give them some spread
        for n, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p, dtype=torch.float32))
    os.makedirs(dst, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)
    return dst


def make_moe(dst: str, arch: str, *, seed: int = 0, mtp: bool = False) -> str:
    """Write a tiny 2-layer MoE in bf16 to dst (transformers saves per-expert 2-D tensors); arch
    "qwen3_moe" or "mixtral": hidden 256, 8 experts of intermediate 256, top-2, 8 heads / 4 KV
    heads, vocab 1024; every side a multiple of 256.  "deepseek_v3" (Kimi-K2's architecture):
    multi-head latent attention (q LoRA rank 256, kv LoRA rank 512 and 64 rope dims as in
    DeepSeek-V3, 8 heads of 64 + 64 dims: vLLM's reference CPU MLA decode kernel, the one
    machines without AMX run, takes only a 512 + 64 latent) and, after one dense layer, a MoE
    layer of 8 routed experts of intermediate 256 (top-2 of 2 groups, sigmoid scores with a
    correction bias, as "noaux_tc") and one shared expert.  "llama4_text": Llama 4's layout, the
    experts of every layer stored as the 3-D stacks ``feed_forward.experts.gate_up_proj``
    [8, 256, 512] and ``down_proj`` [8, 256, 256] (top-1, router weights applied on the input),
    beside a shared expert.  "llama4": the same language model as Llama 4 Scout's published
    checkpoint holds it, under ``language_model.``, beside a one-layer vision tower (hidden 256)
    and its projector (Llama4ForConditionalGeneration). mtp ("deepseek_v3"): the checkpoint also
    holds a multi-token-prediction layer after the last one, as DeepSeek-V3's does
    (model.layers.2: a copy of layer 1's tensors with its eh_proj and norms), which the model
    itself does not build.  Returns dst."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    common = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                  vocab_size=1024, max_position_embeddings=512, num_experts_per_tok=2, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    if arch == "qwen3_moe":
        cfg = AutoConfig.for_model("qwen3_moe", intermediate_size=512, moe_intermediate_size=256, num_experts=8,
                                   head_dim=32, **common)
    elif arch == "mixtral":
        cfg = AutoConfig.for_model("mixtral", intermediate_size=256, num_local_experts=8, **common)
    elif arch in ("llama4_text", "llama4"):
        common.update(num_experts_per_tok=1)
        cfg = AutoConfig.for_model("llama4_text", head_dim=32, intermediate_size=256, intermediate_size_mlp=512,
                                   num_local_experts=8, interleave_moe_layer_step=1, rope_scaling=None, **common)
        if arch == "llama4":
            # (the pixel shuffle's 0.5 ratio makes 4 x 256 = 1024 features per patch group: the
            # adapter's input, which transformers names intermediate_size)
            vision = dict(hidden_size=256, num_hidden_layers=1, num_attention_heads=4, intermediate_size=1024,
                          image_size=112, patch_size=14, projector_input_dim=256, projector_output_dim=256,
                          vision_output_dim=256)
            cfg = AutoConfig.for_model("llama4", text_config=cfg.to_dict(), vision_config=vision,
                                       image_token_index=1000, boi_token_index=1001, eoi_token_index=1002,
                                       tie_word_embeddings=False, torch_dtype="bfloat16")
    elif arch == "deepseek_v3":
        common["num_key_value_heads"] = 8
        cfg = AutoConfig.for_model("deepseek_v3", intermediate_size=512, moe_intermediate_size=256,
                                   n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2,
                                   topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid",
                                   routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=256, kv_lora_rank=512,
                                   qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, rope_scaling=None,
                                   **common)
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    if arch == "llama4":
        from transformers import Llama4ForConditionalGeneration
        model = Llama4ForConditionalGeneration(cfg)
    else:
        model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1:  # norms: some spread, as in make_llama
                p.copy_(1.0 + 0.1 * torch.randn_like(p, dtype=torch.float32))
            else:
                p.copy_(0.05 * torch.randn_like(p, dtype=torch.float32))
    model = model.to(torch.bfloat16)
    os.makedirs(dst, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)
    if mtp:
        from safetensors.torch import load_file, save_file
        f = os.path.join(dst, "model.safetensors")
        sd = load_file(f)
        n, h = cfg.num_hidden_layers, cfg.hidden_size
        sd.update({k.replace(f"model.layers.{n - 1}.", f"model.layers.{n}."): v.clone() for k, v in sd.items()
                   if k.startswith(f"model.layers.{n - 1}.")})
        sd[f"model.layers.{n}.eh_proj.weight"] = (0.05 * torch.randn(h, 2 * h)).to(torch.bfloat16)
        for norm in ("enorm", "hnorm"):
            sd[f"model.layers.{n}.{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
        save_file(sd, f, metadata={"format": "pt"})
    return dst


def make_phi3(dst: str, *, kv_heads: int = 1, seed: int = 0) -> str:
    """Write a 2-layer Phi-3 [hidden 512, 8 heads of 64, ffn 1024, vocab 1024] in bf16 to dst,
    whose checkpoint holds q, k and v as one matrix ``qkv_proj`` [(8 + 2 kv_heads) x 64, 512] and
    gate and up as one ``gate_up_proj`` [2048, 512], as Phi-3's do; return dst.  One KV head
    by default: at TP 2 both ranks hold the same k and v rows."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("phi3", vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                               num_attention_heads=8, num_key_value_heads=kv_heads, max_position_embeddings=512,
                               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                               torch_dtype="bfloat16")
    torch.manual_seed(seed)
    save_spread(AutoModelForCausalLM.from_config(cfg), dst)
    return dst


def save_spread(model, dst: str) -> None:
    """Save `model` in bf16 to dst with its norms away from 1.0 (exact in any format) and its
    matrices at a trained model's spread (N(0, 0.05)), from torch's current seed."""
    import torch

    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p, dtype=torch.float32))
            else:
                p.normal_(0.0, 0.05)
    os.makedirs(dst, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)




KIMI_INT4_EXPERTS = (r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight",
                     ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"])
"""Kimi-K2.5's published split: routed experts int4, everything else (its ignore list) bf16."""
QUANTIZED_MLP = (r".*\.mlp\.(gate|up|down)_proj\.weight", ["lm_head", "re:.*self_attn.*"])
"""A dense model's MLP quantized, its attention, embeddings and head bf16."""


def quantize_compressed_tensors(src: str, dst: str, split=KIMI_INT4_EXPERTS, scheme: str = "w4a16", *,
                                group: int = 32) -> str:
    """Copy the bf16 model in src to dst with the matrices that `split`'s pattern matches
    quantized in compressed-tensors' format, the rest left bf16 and named by the config's ignore
    list (`split`'s second item).  scheme "w4a16": "pack-quantized" as Kimi-K2.5's published
    checkpoint holds its experts, symmetric int4 in groups of `group` along each row
    (``weight_packed`` int32 [rows, cols / 8], ``weight_scale`` bf16 [rows, cols / group],
    ``weight_shape`` int64 [2]; packed by compressed-tensors' own packer, a vLLM dependency).
    "w8a8": "int-quantized", int8 ``weight`` [rows, cols] with a per-row F32 ``weight_scale``
    [rows, 1] and activations quantized per token at run time.  Returns dst."""
    import json
    import re
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    pattern, ignore = split
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    for f in sorted(os.listdir(src)):
        if not f.endswith(".safetensors"):
            continue
        out = {}
        for name, w in load_file(os.path.join(src, f)).items():
            if not re.fullmatch(pattern, name):
                out[name] = w
                continue
            base, (rows, cols) = name[: -len(".weight")], w.shape
            if scheme == "w8a8":
                scale = (w.float().abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-8)
                out[name] = torch.round(w.float() / scale).clamp(-128, 127).to(torch.int8)
                out[f"{base}.weight_scale"] = scale
                continue
            from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
            g = w.float().reshape(rows, cols // group, group)
            scale = (g.abs().amax(dim=2) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
            q = torch.round(g / scale.float().unsqueeze(2)).clamp(-8, 7).to(torch.int8).reshape(rows, cols)
            out[f"{base}.weight_packed"] = pack_to_int32(q, 4)
            out[f"{base}.weight_scale"] = scale
            out[f"{base}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
        save_file(out, os.path.join(dst, f), metadata={"format": "pt"})
    if scheme == "w8a8":
        group_0 = {"targets": ["Linear"], "output_activations": None,
                   "weights": {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False,
                               "strategy": "channel"},
                   "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True,
                                         "strategy": "token"}}
    else:
        group_0 = {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                   "weights": {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False, "strategy": "group",
                               "group_size": group, "actorder": None, "observer": "minmax", "observer_kwargs": {}}}
    with open(os.path.join(dst, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "quantization_status": "compressed",
        "format": "int-quantized" if scheme == "w8a8" else "pack-quantized", "config_groups": {"group_0": group_0},
        "ignore": list(ignore), "kv_cache_scheme": None}
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return dst
