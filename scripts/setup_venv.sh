#!/usr/bin/env bash
# Create (or refresh) the project-local virtual environment in .venv.
# torch goes in first, the build chosen on purpose: left to `pip install -e .`, a bare torch
# requirement takes the index's default, on Linux x86_64 a multi-GB CUDA build even on a
# machine without a GPU. ARDEA_TORCH picks it:
#   auto (default): cuda where `nvidia-smi -L` lists a GPU, else cpu;
#   cpu:  a CPU wheel of torch==$ARDEA_TORCH_VERSION found locally (pip's find-links, a
#         wheel cache), else from PyTorch's CPU index (download.pytorch.org/whl/cpu);
#   cuda: torch==$ARDEA_TORCH_VERSION from the configured index (PyPI: CUDA 12 on Linux).
# A torch already installed in .venv is kept. pyproject.toml asks only for torch>=2.6, so
# users are not pinned to this one version.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
stamp=$VENV/.ardea-installed
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    exit 0
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    torch_spec="torch==${ARDEA_TORCH_VERSION:-2.13.0}"
    build=${ARDEA_TORCH:-auto}
    if [ "$build" = auto ]; then
        build=cpu
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            build=cuda
        fi
    fi
    echo "[setup] installing $torch_spec first, the $build build (ARDEA_TORCH=cpu|cuda chooses)"
    case "$build" in
        cpu)  # a local CPU wheel (then its dependencies from the index), else PyTorch's
            if "$VENV/bin/python" -m pip install --quiet --no-index --no-deps "$torch_spec" \
                2>/dev/null; then
                "$VENV/bin/python" -m pip install --quiet "$torch_spec"
            else
                "$VENV/bin/python" -m pip install --quiet "$torch_spec" \
                    --index-url https://download.pytorch.org/whl/cpu \
                    --extra-index-url https://pypi.org/simple
            fi ;;
        cuda)
            "$VENV/bin/python" -m pip install --quiet "$torch_spec" ;;
        *)
            echo "[setup] ARDEA_TORCH=$build: choose auto, cpu or cuda" >&2
            exit 2 ;;
    esac
fi
echo "[setup] installing ardea and its dependencies"
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"
# tinker-cookbook, for the Tinker API's recipe tests: alone, its dependencies are in [dev]
# (pyproject.toml says why)
"$VENV/bin/python" -m pip install --quiet --no-deps "tinker-cookbook==0.6.1"
touch "$stamp"
