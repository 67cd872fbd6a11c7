#!/usr/bin/env bash
# Set up this checkout on a fresh machine and run the test suite (CPU is enough). Options go to both pytest runs as
# given (bash scripts/test.sh -x -k push --timeout 300). Installs into the active virtual environment, or .venv here.
# Installs the releases the suite was proven with (constraints.txt); DITTO_UNPINNED=1 takes the newest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh
# A CPU build of torch first (PyTorch's CPU index): PyPI's Linux torch is a multi-GB CUDA build.
if ! "$python" -c "import torch" 2>/dev/null; then
    "$python" -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
fi
# The streaming tests drive real nginx-rtmp, Chromium and PulseAudio (Debian packages; they skip, saying why, without them).
bash scripts/install_system_deps.sh || echo "could not install the streaming tests' system packages; those tests will skip" >&2
pins=(-c constraints.txt)
integration_pins=(-c constraints-integrations.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); integration_pins=(); fi
"$python" -m pip install --quiet "${pins[@]}" -e ".[dev,face]"
# pipecat and LiveKit Agents need protobuf >= 5, the face extra's mediapipe protobuf < 5: pip cannot put both in one
# environment. The integrations get a second one whose own packages come first and which sees this one's behind them
# (a .pth line), so torch and the test tools are installed once. Its tests register their avatar with this one.
"$python" -m venv .venv-integrations
here=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
there=$(.venv-integrations/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$here" > "$there/ditto-main-environment.pth"
# --no-warn-conflicts: pip would report the first environment's mediapipe against this one's protobuf, which it never imports.
.venv-integrations/bin/python -m pip install --quiet --no-warn-conflicts "${integration_pins[@]}" -e ".[pipecat,livekit]"
export DITTO_FACE_PYTHON
DITTO_FACE_PYTHON=$("$python" -c 'import sys; print(sys.executable)')
status=0
# The tree's habits (pyproject.toml's [tool.ruff]): lint and format are checked before the tests, which run either way.
"$python" -m ruff check . || status=$?
"$python" -m ruff format --check . || status=$?
"$python" -m pytest "$@" || status=$?
# The same arguments for the integrations; conftest.py limits that run to tests/integrations. Its "no tests collected"
# (5: the arguments named only other tests) is not a failure.
integrations=0
DITTO_TESTS=integrations .venv-integrations/bin/python -m pytest "$@" || integrations=$?
if [[ "$integrations" != 0 && "$integrations" != 5 ]]; then status=$integrations; fi
exit "$status"
