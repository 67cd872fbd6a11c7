"""A generated newsroom anchor: a 1920x1080 studio shot with a real face a fifth of the picture high.

Benchmarks and tests of broadcast outputs need what a newsroom sends: the full studio frame, the face
small in it (Ditto renders the 512 crop and pastes it back, so the stream is 1080p). Nothing is
downloaded: the face is scikit-image's astronaut photo (head and shoulders, feathered), the studio is
drawn here (a graded backdrop, a wall screen, a desk). ``python -m avatars.anchor OUT.png`` writes it
for ``python -m apps.avatars register OUT.png --name anchor1080``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

WIDTH, HEIGHT = 1920, 1080
FACE_FRACTION = 0.2
"""The face's height over the frame's: a studio medium shot."""
ASTRONAUT_FACE = (177, 66, 272, 178)
"""The astronaut's face box (x0, y0, x1, y1) in scikit-image's 512x512 photo."""
PORTRAIT = (90, 0, 370, 420)
"""The head and shoulders cut from the photo (x0, y0, x1, y1)."""
MATTE = (((225, 100), (76, 92)), ((222, 400), (128, 250)))
"""The ellipses (centre, semi-axes) in photo pixels that keep the head and shoulders, not the flag nor the shuttle."""
FACE_CENTRE_X = 0.36
"""Where the face sits across the frame: left of centre, the wall screen on the right."""


def studio(width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """(H, W, 3) uint8 RGB: a blue graded backdrop with light bands, a wall screen on the right, a floor."""
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    top, bottom = np.array([18, 34, 78], np.float32), np.array([6, 12, 30], np.float32)
    picture = top + (bottom - top) * ys + 40 * np.exp(-(((xs - 0.3) / 0.25) ** 2)) * (1 - ys)
    picture = np.broadcast_to(picture, (height, width, 3)).copy()
    for band in (0.12, 0.5, 0.88):
        picture[:, :, 2] += 30 * np.exp(-(((xs[0, :, 0] - band) / 0.01) ** 2))[None, :]
    x0, y0, x1, y1 = int(0.62 * width), int(0.14 * height), int(0.94 * width), int(0.58 * height)
    screen = np.linspace(0, 1, x1 - x0, dtype=np.float32)[None, :, None]
    picture[y0:y1, x0:x1] = np.array([10, 70, 140], np.float32) + np.array([90, 60, 40], np.float32) * screen
    picture[y0 + (y1 - y0) * 2 // 3 : y1 - 12, x0 + 24 : x1 - 24] = (200, 30, 40)
    cv2.rectangle(picture, (x0, y0), (x1, y1), (170, 175, 185), 8)
    picture[int(0.78 * height) :] *= 0.6
    return np.clip(picture, 0, 255).astype(np.uint8)


def head_and_shoulders(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """The astronaut's head and shoulders scaled by ``scale``, and its feathered matte ((h, w) float32 in [0, 1])."""
    from skimage import data

    x0, y0, x1, y1 = PORTRAIT
    cut = data.astronaut()[y0:y1, x0:x1]
    size = (round((x1 - x0) * scale), round((y1 - y0) * scale))
    person = cv2.resize(cut, size, interpolation=cv2.INTER_CUBIC)
    height, width = person.shape[:2]
    matte = np.zeros((height, width), np.float32)
    for (cx, cy), (ax, ay) in MATTE:
        centre = (round((cx - x0) * scale), round((cy - y0) * scale))
        cv2.ellipse(matte, centre, (round(ax * scale), round(ay * scale)), 0, 0, 360, 1.0, -1)
    feather = max(3, round(height * 0.03)) | 1
    return person, cv2.GaussianBlur(matte, (0, 0), feather / 2)


def anchor_frame(width: int = WIDTH, height: int = HEIGHT, face_fraction: float = FACE_FRACTION) -> np.ndarray:
    """(H, W, 3) uint8 RGB studio shot whose face is ``face_fraction`` of the frame high, behind a desk."""
    picture = studio(width, height).astype(np.float32)
    scale = face_fraction * height / (ASTRONAUT_FACE[3] - ASTRONAUT_FACE[1])
    person, matte = head_and_shoulders(scale)
    face_x = (ASTRONAUT_FACE[0] + ASTRONAUT_FACE[2]) / 2 - PORTRAIT[0]
    left = round(FACE_CENTRE_X * width - face_x * scale)
    top = round(0.22 * height - (ASTRONAUT_FACE[1] - PORTRAIT[1]) * scale)
    rows = slice(max(top, 0), min(top + person.shape[0], height))
    cols = slice(max(left, 0), min(left + person.shape[1], width))
    cut = (slice(rows.start - top, rows.stop - top), slice(cols.start - left, cols.stop - left))
    alpha = matte[cut][..., None]
    picture[rows, cols] = alpha * person[cut] + (1 - alpha) * picture[rows, cols]
    desk = np.array([[0.08, 0.74], [0.66, 0.74], [0.72, 1.0], [0.02, 1.0]]) * (width, height)
    cv2.fillPoly(picture, [desk.round().astype(np.int32)], (58, 62, 74))
    cv2.line(picture, tuple(desk[0].round().astype(int)), tuple(desk[1].round().astype(int)), (150, 155, 170), 6)
    return np.clip(picture, 0, 255).astype(np.uint8)


def main(argv: list[str] | None = None) -> int:
    """Write the anchor portrait as a PNG."""
    parser = argparse.ArgumentParser(prog="python -m avatars.anchor", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    Image.fromarray(anchor_frame()).save(args.out)
    print(
        f"wrote {args.out} ({WIDTH}x{HEIGHT}); register it with\n"
        f"  python -m apps.avatars register {args.out} --name anchor1080"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
