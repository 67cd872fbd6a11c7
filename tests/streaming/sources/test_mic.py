"""The microphone through sounddevice, against a PulseAudio null sink whose monitor is fed a 440 Hz tone."""

from __future__ import annotations

import contextlib
import ctypes.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.streaming.conftest import INSTALL_HINT

PULSEAUDIO, PACAT, PACTL = (shutil.which(n) for n in ("pulseaudio", "pacat", "pactl"))
ROOT = Path(__file__).resolve().parents[3]

CAPTURE = """
import json, time, numpy as np
from streaming.sources.mic import MicrophoneSource

class Session:
    def __init__(self):
        self.blocks = []
    def push_audio(self, pcm, sample_rate, channels=None, block=False):
        self.blocks.append((pcm.copy(), sample_rate, channels, time.monotonic()))

session = Session()
mic = MicrophoneSource(session).start()
deadline = time.monotonic() + 10
while not session.blocks and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(2.0)
mic.stop()
steady = [b for b in session.blocks if b[3] >= session.blocks[0][3] + 0.5]
seconds = steady[-1][3] - steady[0][3]
samples = sum(b[0].shape[0] for b in steady[1:])
x = np.concatenate([b[0].reshape(-1) for b in steady])
peak = float(np.argmax(np.abs(np.fft.rfft(x))) * 48000 / x.size)
print(json.dumps({"measured_rate": samples / seconds, "rate": session.blocks[0][1], "channels": session.blocks[0][2],
                  "peak_hz": peak, "rms": float(np.sqrt((x ** 2).mean())), "dropped": mic.blocks_dropped}))
"""


@pytest.fixture
def pulse(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private PulseAudio daemon with a null sink (+ monitor) on a unix socket; yields the client environment."""
    if not (PULSEAUDIO and PACAT and PACTL) or not ctypes.util.find_library("portaudio"):
        pytest.skip(f"pulseaudio, pulseaudio-utils and libportaudio2 are needed ({INSTALL_HINT})")
    runtime, home = tmp_path / "pulse", tmp_path / "home"
    runtime.mkdir(mode=0o700)
    home.mkdir()
    (home / ".asoundrc").write_text("pcm.!default { type pulse }\nctl.!default { type pulse }\n")
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
        "PULSE_RUNTIME_PATH": str(runtime),
        "PULSE_SERVER": f"unix:{runtime}/native",
    }
    daemon = subprocess.Popen(
        [
            PULSEAUDIO,
            "-n",
            "--daemonize=no",
            "--exit-idle-time=-1",
            "--disable-shm=yes",
            "--use-pid-file=no",
            f"--log-target=file:{tmp_path}/pulse.log",
            "-L",
            f"module-native-protocol-unix socket={runtime}/native auth-anonymous=1",
            "-L",
            "module-null-sink sink_name=nullsink rate=48000",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(100):
            if subprocess.run([PACTL, "info"], env=env, capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail("pulseaudio did not come up")
        subprocess.run([PACTL, "set-default-source", "nullsink.monitor"], env=env, check=True)
        yield env
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)


@pytest.mark.slow
def test_the_microphone_hears_the_tone_in_real_time(pulse: dict[str, str]) -> None:
    second = (0.5 * np.sin(2 * np.pi * 440 * np.arange(48_000) / 48_000)).astype("<f4").tobytes()
    player = subprocess.Popen(
        [PACAT, "--playback", "--raw", "--device=nullsink", "--format=float32le", "--rate=48000", "--channels=1"],
        stdin=subprocess.PIPE,
        env=pulse,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    playing = threading.Event()
    playing.set()

    def play() -> None:  # the tone, for as long as the capture runs (pacat takes it at its real-time pace)
        with contextlib.suppress(BrokenPipeError, ValueError):  # the player was stopped
            while playing.is_set():
                player.stdin.write(second)
                player.stdin.flush()

    feeder = threading.Thread(target=play, daemon=True)
    feeder.start()
    try:
        capture = subprocess.run(
            [sys.executable, "-c", CAPTURE],
            env={**pulse, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        playing.clear()
        player.kill()
        player.wait(10)
        feeder.join(5)
    assert capture.returncode == 0, capture.stderr
    got = json.loads(capture.stdout.strip().splitlines()[-1])
    assert got["rate"] == 48_000 and got["channels"] == 1 and got["dropped"] == 0
    assert 40_000 < got["measured_rate"] < 56_000, "blocks arrive in real time, paced by the device clock"
    assert abs(got["peak_hz"] - 440) < 5
    assert 0.25 < got["rms"] < 0.45


def test_a_missing_device_is_a_clear_error() -> None:
    if not ctypes.util.find_library("portaudio"):
        pytest.skip(f"libportaudio2 is not installed ({INSTALL_HINT})")
    from streaming.sources.mic import MicrophoneSource, MicrophoneUnavailable

    with pytest.raises(MicrophoneUnavailable, match="no such device"):
        MicrophoneSource(object(), device="no such device").start()
