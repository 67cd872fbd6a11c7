"""A live session's latency mode: how often its windows are sampled and when their frames are released.

``faithful`` is the reference's online mode: a 200 ms HuBERT hop, a window per hop (overlap 75),
and each window's last five frames held until the next window has cross-faded them. ``low``
samples a window every 120 ms (overlap 77, the HuBERT hop three frames, the chunk the same
6480 samples, so the same compiled encoder) and releases a window's frames at once: the next
window's offset from the last frame shown fades out over the frames not yet shown, so the
picture never jumps. It costs 5/3 as many LMDM windows per session.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.timebase import HOP_FRAMES, SEQ_FRAMES


@dataclass(frozen=True)
class LatencyMode:
    """``hop_frames``: video frames per HuBERT hop; ``overlap``: the default window overlap; ``early_release``: frames
    leave before the next window's cross-fade."""

    name: str
    hop_frames: int
    overlap: int
    early_release: bool


FAITHFUL = LatencyMode("faithful", hop_frames=HOP_FRAMES, overlap=SEQ_FRAMES - HOP_FRAMES, early_release=False)
LOW = LatencyMode("low", hop_frames=3, overlap=SEQ_FRAMES - 3, early_release=True)
MODES = {mode.name: mode for mode in (FAITHFUL, LOW)}


def latency_mode(name: str) -> LatencyMode:
    """The mode called ``name``; a ValueError naming the modes otherwise."""
    try:
        return MODES[name]
    except (KeyError, TypeError):
        raise ValueError(f"latency must be one of {sorted(MODES)}, got {name!r}") from None
