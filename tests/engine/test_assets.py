"""Bundled demo inputs: the speech clip ships inside the package and loads as 16 kHz float32."""

from __future__ import annotations

from importlib.resources import files

import numpy as np

from engine.assets import DEMO_SPEECH, demo_audio, demo_portrait


def test_demo_speech_is_a_short_16k_clip_shipped_in_the_package() -> None:
    resource = files("engine.assets").joinpath(DEMO_SPEECH)
    assert resource.is_file()
    assert len(resource.read_bytes()) < 150_000
    audio, rate = demo_audio()
    assert rate == 16000
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 2.5 < audio.size / rate < 4.5
    assert 0.5 < np.abs(audio).max() <= 1.0
    assert np.sqrt(np.mean(audio**2)) > 0.05  # speech, not silence


def test_demo_portrait_is_the_astronaut_rgb_image() -> None:
    portrait = demo_portrait()
    assert portrait.shape == (512, 512, 3) and portrait.dtype == np.uint8
    assert portrait.std() > 20
