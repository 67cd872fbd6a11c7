"""Reading a portrait source: a still image or a short video, as RGB uint8 frames of a bounded size.

Frames are limited to a longest side of 1920 px (aspect kept) and floored to even dimensions,
as the reference does, because the paste-back output has the source frame's size and H.264
needs even dimensions. Grayscale is expanded to RGB; an alpha channel is composited over white.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from avatars.errors import MediaError

MAX_SIDE = 1920
MAX_VIDEO_FRAMES = 300
_MIN_SIDE = 16


@dataclass(frozen=True)
class Media:
    """Decoded source frames (each (H,W,3) uint8 RGB, all the same size) and where they came from."""

    frames: list[np.ndarray]
    is_image: bool
    fps: float | None
    original_size: tuple[int, int]


def fit_size(height: int, width: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """The (height, width) a frame is resized to: longest side at most ``max_side``, both even."""
    if max(height, width) > max_side:
        if height > width:
            height, width = max_side, int(round(width * max_side / height))
        else:
            height, width = int(round(height * max_side / width)), max_side
    return height - height % 2, width - width % 2


def as_rgb8(array: np.ndarray) -> np.ndarray:
    """Any decoded picture (gray, gray+alpha, RGB, RGBA; 8 or 16 bit) as (H,W,3) uint8 RGB.

    Alpha is composited over white, so a cut-out portrait keeps a clean background.
    """
    a = np.asarray(array)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * 255
    elif a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.integer):
            raise MediaError(f"unsupported pixel type {a.dtype}; save the picture as 8- or 16-bit PNG or JPEG")
        a = (a.astype(np.uint32) >> 8).astype(np.uint8) if a.max(initial=0) > 255 else a.astype(np.uint8)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 2, 3, 4):
        raise MediaError(f"unsupported picture shape {a.shape}; expected gray, gray+alpha, RGB or RGBA")
    if a.shape[2] in (2, 4):
        color, alpha = a[:, :, :-1].astype(np.float32), a[:, :, -1:].astype(np.float32) / 255.0
        a = np.rint(color * alpha + 255.0 * (1.0 - alpha)).astype(np.uint8)
    if a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    return np.ascontiguousarray(a)


def resize_frame(frame: np.ndarray, max_side: int = MAX_SIDE) -> np.ndarray:
    """Resize one RGB frame to ``fit_size`` (area interpolation when shrinking); unchanged if it fits."""
    height, width = frame.shape[:2]
    new_h, new_w = fit_size(height, width, max_side)
    if (new_h, new_w) == (height, width):
        return frame
    shrink = new_h * new_w < height * width
    return cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def _read_image(path: Path) -> np.ndarray | None:
    """The picture in ``path`` as RGB uint8 (EXIF orientation applied), or None if it is no image."""
    try:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            if img.mode == "P":
                img = img.convert("RGBA" if "transparency" in img.info else "RGB")
            elif img.mode == "1":
                img = img.convert("L")
            elif img.mode not in ("L", "LA", "RGB", "RGBA", "I", "I;16", "I;16B", "I;16L"):
                img = img.convert("RGB")
            return as_rgb8(np.asarray(img))
    except UnidentifiedImageError:
        return None
    except Image.DecompressionBombError as exc:
        raise MediaError(f"{path}: the image is too large to decode safely ({exc}); downscale it first") from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise MediaError(f"{path}: the image is damaged or truncated ({exc}); re-export it as PNG or JPEG") from exc


def _read_video(path: Path, max_side: int) -> tuple[list[np.ndarray], float | None, tuple[int, int]] | None:
    """All frames of the first video stream in ``path``, resized; None if it is no video."""
    import av  # only videos need FFmpeg

    try:
        container = av.open(str(path))
    except av.error.FFmpegError:
        return None
    with container:
        if not container.streams.video:
            return None
        stream = container.streams.video[0]
        fps = float(stream.average_rate) if stream.average_rate else None
        frames: list[np.ndarray] = []
        original: tuple[int, int] = (0, 0)
        try:
            for frame in container.decode(stream):
                if len(frames) == MAX_VIDEO_FRAMES:
                    raise MediaError(
                        f"{path}: the video has more than {MAX_VIDEO_FRAMES} frames; a source video is a short clip "
                        f"with the mouth closed: trim it (e.g. ffmpeg -i IN -t 10 OUT.mp4)"
                    )
                rgb = frame.to_ndarray(format="rgb24")
                original = rgb.shape[:2]
                frames.append(resize_frame(rgb, max_side))
        except av.error.FFmpegError as exc:
            if not frames:
                raise MediaError(_not_media(path, str(exc))) from exc
    if not frames:
        raise MediaError(f"{path}: the video stream has no frames")
    return frames, fps, original


def _not_media(path: Path, reason: str = "") -> str:
    """The error text for a file that decodes neither as an image nor as a video."""
    detail = f" ({reason})" if reason else ""
    return (
        f"{path}: not an image or a video that can be decoded{detail}; give a portrait photo "
        f"(PNG, JPEG, ...) or a short video (MP4, MOV, ...)"
    )


def load_media(path: str | Path, max_side: int = MAX_SIDE) -> Media:
    """Decode an image or a video file into RGB uint8 frames limited to ``max_side``."""
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"{path}: no such file")
    image = _read_image(path)
    if image is not None:
        if min(image.shape[:2]) < _MIN_SIDE:
            raise MediaError(f"{path}: the image is only {image.shape[1]}x{image.shape[0]} px; use a real portrait")
        return Media([resize_frame(image, max_side)], True, None, image.shape[:2])
    video = _read_video(path, max_side)
    if video is None:
        raise MediaError(_not_media(path))
    frames, fps, original = video
    return Media(frames, False, fps, original)
