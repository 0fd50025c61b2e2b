#!/usr/bin/env bash
# Create (or refresh) the project-local virtual environment in .venv.
# torch goes in first: where no torch is installed, a bare `torch` requirement
# would pull a multi-GB CUDA build, while `torch==2.13.0` takes the CPU wheel
# that this kind of machine keeps on disk. Elsewhere the project only asks for
# torch>=2.6, so users are not pinned to that one version.
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
    echo "[setup] installing torch (CPU build) first"
    "$VENV/bin/python" -m pip install --quiet "torch==${ARDEA_TORCH_VERSION:-2.13.0}" \
        || "$VENV/bin/python" -m pip install --quiet torch \
            --index-url https://download.pytorch.org/whl/cpu
fi
echo "[setup] installing ardea and its dependencies"
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"
# tinker-cookbook, for the Tinker API's recipe tests: alone, its dependencies are in [dev]
# (pyproject.toml says why)
"$VENV/bin/python" -m pip install --quiet --no-deps "tinker-cookbook==0.6.1"
touch "$stamp"
