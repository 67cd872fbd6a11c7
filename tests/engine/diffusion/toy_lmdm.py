"""A deterministic stand-in for LMDM sampling, shared by the offline-mode tests: no network, same window for the same
inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

WINDOW, MOTION = 80, 265


def toy_lmdm(cond_width: int, cond_scale: float, seed: int = 0) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """A fixed random map of (cond_frame (265,), cond (80, cond_width)) to a window (80, 265)."""
    generator = np.random.default_rng(seed)
    w_cond = generator.standard_normal((cond_width, MOTION)).astype(np.float32) * cond_scale
    w_frame = generator.standard_normal((MOTION,)).astype(np.float32) * 0.1
    ramp = np.linspace(-1, 1, WINDOW, dtype=np.float32)[:, None]

    def predict(cond_frame: np.ndarray, cond: np.ndarray) -> np.ndarray:
        return np.tanh(cond @ w_cond + ramp * float(cond_frame @ w_frame)).astype(np.float32)

    return predict
