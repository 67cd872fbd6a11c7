#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the test suite (CPU is enough).
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch first: left to itself, pip would pick a multi-GB CUDA build.
if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install --quiet "torch==2.13.0"
fi
python3 -m pip install --quiet -e ".[dev,face]"
exec python3 -m pytest "$@"
