#!/usr/bin/env python3
"""The compressed model at work: greedy generation from the original BF16 model and from the
compressed folder, side by side, and the bytes the compressed model holds.

Usage: python scripts/quickstart_demo.py COMPRESSED [--original smollm2-135m] [--tokens 20]
                                         [--prompt TEXT] [--mode huffman]

The original (a folder, or the bundled ``smollm2-135m``) loads with plain transformers in
BF16; COMPRESSED loads with ``unweight.load(..., device="cpu", mode=...)``, so its weights stay
encoded in memory and are decoded inside each forward.  Both generate greedily from the same
prompt with the original's tokenizer.  Exit status: 0 when the two token sequences are
identical, 1 when they differ, 2 on bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

DEFAULT_PROMPT = "The three primary colors are"


def _fail(msg: str, code: int = 2):
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(code)


def held_bytes(model) -> tuple[int, int]:
    """(bytes of encoded planes the model's compressed modules hold, bytes the same weights
    take in BF16).  A tied module shares its owner's planes and is counted once."""
    from unweight.runtime.modules import compressed_modules
    owners = [m for _, m in compressed_modules(model) if not m.is_tied]
    return sum(m.held_bytes() for m in owners), sum(m.decoded_bytes() for m in owners)


def generate(model, tok, prompt: str, n_tokens: int):
    """Greedy token ids (list of int) after the prompt, and the seconds it took."""
    import torch
    ids = tok(prompt, return_tensors="pt")
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return out[0, ids["input_ids"].shape[1]:].tolist(), time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compressed", help="folder written by `unweight compress`")
    ap.add_argument("--original", default="smollm2-135m", help="BF16 folder or bundled model name")
    ap.add_argument("--tokens", type=int, default=20, help="tokens to generate (greedy)")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--mode", default="huffman", choices=["huffman", "palette", "dense", "auto"])
    args = ap.parse_args(argv)
    if not os.path.isdir(args.compressed):
        _fail(f"{args.compressed}: not a folder (run `unweight compress` first)")
    if args.tokens < 1:
        _fail("--tokens must be at least 1")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        _fail(f"{e.name} is not installed: pip install 'unweight[hf]'")
    # Generation-config notices and loading bars would bury the comparison.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import unweight
    from unweight import sources

    try:
        original_dir = sources.resolve(args.original)
        compressed = unweight.load(args.compressed, device="cpu", mode=args.mode)
    except unweight.UnweightError as e:
        _fail(str(e))
    try:
        tok = AutoTokenizer.from_pretrained(original_dir)
        original = AutoModelForCausalLM.from_pretrained(original_dir, dtype=torch.bfloat16).eval()
    except (OSError, ValueError) as e:
        # transformers' messages run over several lines: folded into one.
        _fail(f"{original_dir}: cannot load the original model or its tokenizer: {' '.join(str(e).split())}")

    ref, t_ref = generate(original, tok, args.prompt, args.tokens)
    got, t_got = generate(compressed, tok, args.prompt, args.tokens)
    held, bf16 = held_bytes(compressed)

    def text(ids):
        return (args.prompt + tok.decode(ids)).replace("\n", "\\n")
    labels = ["BF16 original (transformers)", f"compressed (unweight.load, mode={args.mode})"]
    width = max(map(len, labels))
    print(f"greedy, {args.tokens} new tokens from the same prompt:")
    print(f"  {labels[0]:<{width}}  {t_ref:5.1f} s  {text(ref)}")
    print(f"  {labels[1]:<{width}}  {t_got:5.1f} s  {text(got)}")
    same = ref == got
    if same:
        print(f"identical token for token ({len(ref)} of {len(ref)} tokens)")
    else:
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
        print(f"DIFFERENT: the token sequences part at token {first}")
    print(f"compressed model holds {held / 1e6:.1f} MB of encoded weights for {bf16 / 1e6:.1f} MB of BF16 "
          f"({held / bf16:.3f}x), decoded inside each forward")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
