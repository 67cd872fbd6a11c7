"""Render stage helpers that run on the device: compositing rendered crops into the avatar's frames."""

from engine.render.paste_back import PasteBack, feather_mask, sampling_grid

__all__ = ["PasteBack", "feather_mask", "sampling_grid"]
