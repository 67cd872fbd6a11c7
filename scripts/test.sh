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
integration_pins=(-c constraints-integrations.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); integration_pins=(); fi
python3 -m pip install --quiet "${pins[@]}" -e ".[dev,face]"
# pipecat and LiveKit Agents need protobuf >= 5, the face extra's mediapipe protobuf < 5: pip cannot put both in one
# environment. The integrations get a second one on top of this (it sees torch and the test tools from here).
python3 -m venv --system-site-packages .venv-integrations
.venv-integrations/bin/python -m pip install --quiet "${integration_pins[@]}" -e ".[pipecat,livekit]"
status=0
python3 -m pytest "$@" || status=$?
# The same options (not paths) for tests/integrations, where their packages are.
options=()
for arg in "$@"; do [[ "$arg" == -* ]] && options+=("$arg"); done
.venv-integrations/bin/python -m pytest "${options[@]}" tests/integrations || status=$?
exit "$status"
