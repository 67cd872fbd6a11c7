"""Shared fixtures of the integration tests: the real runtime on the CPU and a registered avatar.

The tests need the extras' packages; where they are missing (the base environment, whose face extra pins
protobuf 4) each module skips, saying where they run: scripts/test.sh's second environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

INTEGRATIONS_HINT = (
    "install the extras: pip install -e '.[pipecat,livekit]' (scripts/test.sh runs these tests in .venv-integrations)"
)
REPO = Path(__file__).resolve().parents[2]
REGISTER = """
import sys
from PIL import Image
from skimage import data
from avatars.register import register
folder, checkpoints = sys.argv[1], sys.argv[2]
Image.fromarray(data.astronaut()[:320, 64:384]).save(f"{folder}/face.png")
print(register(f"{folder}/face.png", "face", checkpoints, cache_dir=folder, progress=False))
"""


@pytest.fixture(scope="session")
def cpu_runtime(checkpoint_dir):
    """The real runtime on the CPU (random weights, 2 DDIM steps), shared by the integration tests."""
    from engine.audio.hubert import TorchHubertRunner
    from engine.audio.standin_hubert import build_standin
    from engine.backends.torch_backend import TorchBackend
    from engine.engine import Engine
    from engine.runtime import Runtime, RuntimeConfig

    engine = Engine(TorchBackend(checkpoint_dir(), device="cpu"), TorchHubertRunner(build_standin()), steps=2)
    with Runtime(engine, RuntimeConfig(progress=False, render_frames_per_tick=1)) as runtime:
        yield runtime


@pytest.fixture(scope="session")
def registered_avatar(checkpoint_dir, tmp_path_factory):
    """A registered avatar (a 320x320 crop of scikit-image's astronaut), loaded on the CPU. Registered by the first
    environment's interpreter (scripts/test.sh sets DITTO_FACE_PYTHON): the face extra's mediapipe needs protobuf 4,
    the integrations 5+."""
    from avatars.cache import load_avatar

    folder = tmp_path_factory.mktemp("integration-avatar")
    done = subprocess.run(
        [os.environ.get("DITTO_FACE_PYTHON", sys._base_executable), "-c", REGISTER, str(folder), str(checkpoint_dir())],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return load_avatar(done.stdout.strip().splitlines()[-1], "cpu")
