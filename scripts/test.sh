#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the test suite (CPU is enough).
# Installs the releases the suite was proven with (constraints.txt); DITTO_UNPINNED=1 takes the newest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch first (PyTorch's CPU index): PyPI's Linux torch is a multi-GB CUDA build.
if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
fi
pins=(-c constraints.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); fi
python3 -m pip install --quiet "${pins[@]}" -e ".[dev,face]"
exec python3 -m pytest "$@"
