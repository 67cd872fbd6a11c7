#!/usr/bin/env bash
# Install what the demo needs on a fresh machine, then render it: bundled speech, scikit-image's
# astronaut, random weights (not a face). GPU when there is one; a short CPU render otherwise.
# Installs the releases the suite was proven with (constraints.txt); DITTO_UNPINNED=1 takes the newest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import torch" 2>/dev/null; then
    python3 -m pip install --quiet "torch==2.13.0"
fi
pins=(-c constraints.txt)
if [[ "${DITTO_UNPINNED:-}" == 1 ]]; then pins=(); fi
python3 -m pip install --quiet "${pins[@]}" -e ".[face]"
exec python3 -m engine.render --demo --out "${1:-ditto_demo.mp4}"
