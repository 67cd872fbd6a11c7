"""The integration tests need the extras' packages; where they are missing (the base environment, whose face extra
pins protobuf 4) each module skips, saying where they run: scripts/test.sh's second environment."""

from __future__ import annotations

INTEGRATIONS_HINT = "install the extras: pip install -e '.[pipecat,livekit]' (scripts/test.sh runs these tests in .venv-integrations)"
