"""Bundled demo inputs: a short synthetic English speech clip and a public-domain portrait.

``demo_speech.wav`` was synthesised with espeak-ng 1.51 (voice en-us, 180 words/min, saying
"Good evening. This is the Ditto live engine, on random weights.") and converted with sox to
16 kHz mono 16-bit, silence trimmed, peak -1 dBFS. The portrait is scikit-image's
``astronaut`` (Eileen Collins, NASA, public domain).
"""

from __future__ import annotations

import wave
from importlib.resources import files
from pathlib import Path

import numpy as np

DEMO_SPEECH = "demo_speech.wav"


def demo_audio() -> tuple[np.ndarray, int]:
    """The bundled speech clip as (float32 samples in [-1, 1], 16000)."""
    with wave.open(str(files(__name__).joinpath(DEMO_SPEECH)), "rb") as clip:
        if clip.getsampwidth() != 2 or clip.getnchannels() != 1:
            raise ValueError(f"{DEMO_SPEECH} must be 16-bit mono PCM")
        pcm = np.frombuffer(clip.readframes(clip.getnframes()), dtype="<i2")
        return pcm.astype(np.float32) / 32768.0, clip.getframerate()


def demo_portrait() -> np.ndarray:
    """scikit-image's astronaut photo, (512, 512, 3) uint8 RGB; needs the ``face`` extra (scikit-image)."""
    try:
        from skimage import data
    except ImportError as exc:
        raise ImportError("demo_portrait() needs scikit-image: pip install 'ditto-live[face]'") from exc
    return data.astronaut()


def write_demo_portrait(directory: str | Path) -> Path:
    """Save the demo portrait as ``astronaut.png`` in ``directory`` (registration reads image files)."""
    from PIL import Image

    path = Path(directory) / "astronaut.png"
    Image.fromarray(demo_portrait()).save(path)
    return path
