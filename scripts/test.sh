#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the test suite (CPU is enough).
# Installs the releases the suite was proven with (constraints.txt); DITTO_UNPINNED=1 takes the newest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
# A CPU build of torch first (PyTorch's CPU index): PyPI's Linux torch is a multi-GB CUDA build.
if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
fi
# The streaming tests drive real nginx-rtmp, Chromium and PulseAudio (Debian packages; they skip, saying why, without them).
bash scripts/install_system_deps.sh || echo "could not install the streaming tests' system packages; those tests will skip" >&2
pins=(-c constraints.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); fi
python3 -m pip install --quiet "${pins[@]}" -e ".[dev,face]"
exec python3 -m pytest "$@"
