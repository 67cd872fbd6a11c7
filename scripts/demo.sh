#!/usr/bin/env bash
# Install what the demo needs on a fresh machine, then render it: bundled speech, scikit-image's
# astronaut, random weights (not a face). GPU when there is one; a short CPU render otherwise.
# Installs into the active virtual environment, or .venv here, the releases the suite was proven with
# (constraints.txt); DITTO_UNPINNED=1 takes the newest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
# torch for this machine: PyPI's Linux torch is a multi-GB CUDA build, of no use without an NVIDIA GPU.
if ! "$python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        echo "demo: an NVIDIA GPU is here (nvidia-smi): installing PyPI's CUDA build of torch 2.13"
        "$python" -m pip install --quiet "torch==2.13.0"
    else
        echo "demo: no NVIDIA GPU (no working nvidia-smi): installing the CPU build of torch 2.13"
        "$python" -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
fi
pins=(-c constraints.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); fi
# stream: what python -m apps.serve, the README's next command, imports (aiohttp, aiortc...).
"$python" -m pip install --quiet "${pins[@]}" -e ".[face,stream]"
exec "$python" -m apps.render --demo --out "${1:-ditto_demo.mp4}"
