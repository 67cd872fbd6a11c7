"""Reading sources: size limits, gray and alpha handling, videos, and files that are no media."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from avatars.errors import MediaError
from avatars.images import MAX_SIDE, as_rgb8, fit_size, load_media
from tests.avatars.conftest import write_image, write_video


def test_fit_size_limits_the_longest_side_to_1920_and_floors_to_even() -> None:
    assert fit_size(3000, 4000) == (1440, 1920)
    assert fit_size(4001, 1001) == (1920, 480)  # 1001*1920/4001 = 480.4 -> 480
    assert fit_size(513, 301) == (512, 300)  # small: only made even
    assert fit_size(512, 512) == (512, 512)


def test_a_huge_image_is_resized_to_the_max_side(tmp_path: Path, astronaut: np.ndarray) -> None:
    big = np.tile(astronaut, (2, 5, 1))[:1000, :2501]  # 2501 x 1000
    media = load_media(write_image(tmp_path / "big.png", np.ascontiguousarray(big)))
    assert media.is_image and len(media.frames) == 1
    assert media.frames[0].shape == (768, MAX_SIDE, 3)  # 1000*1920/2501 = 767.7 -> 768
    assert media.original_size == (1000, 2501)


def test_grayscale_images_become_three_equal_channels(tmp_path: Path, astronaut: np.ndarray) -> None:
    gray = astronaut.mean(axis=2).astype(np.uint8)
    frame = load_media(write_image(tmp_path / "gray.png", gray)).frames[0]
    assert frame.shape == (512, 512, 3) and frame.dtype == np.uint8
    assert np.array_equal(frame[:, :, 0], gray) and np.array_equal(frame[:, :, 0], frame[:, :, 2])


def test_rgba_images_are_composited_over_white(tmp_path: Path, astronaut: np.ndarray) -> None:
    rgba = np.dstack([astronaut, np.full(astronaut.shape[:2], 255, np.uint8)])
    rgba[:100, :, 3] = 0  # transparent top band
    rgba[100:110, :, 3] = 128
    frame = load_media(write_image(tmp_path / "cutout.png", rgba)).frames[0]
    assert np.all(frame[:100] == 255)
    assert np.array_equal(frame[110:], astronaut[110:])
    half = np.rint(astronaut[100:110] * (128 / 255) + 255 * (127 / 255))
    assert np.abs(frame[100:110].astype(int) - half).max() <= 1


def test_sixteen_bit_pictures_keep_their_high_byte() -> None:
    deep = (np.arange(4 * 4, dtype=np.uint16).reshape(4, 4) * 4000).astype(np.uint16)
    assert np.array_equal(as_rgb8(deep)[:, :, 1], (deep >> 8).astype(np.uint8))


def test_a_video_gives_all_its_frames(tmp_path: Path, astronaut: np.ndarray) -> None:
    frames = [np.roll(astronaut, i, axis=1) for i in range(3)]
    media = load_media(write_video(tmp_path / "clip.mp4", frames))
    assert not media.is_image and media.fps == 25
    assert len(media.frames) == 3 and media.frames[0].shape == (512, 512, 3)
    assert np.abs(media.frames[1].astype(int) - frames[1]).mean() < 4  # lossy but the same picture


def test_files_that_are_not_media_get_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.png"
    text.write_text("this is not a picture\n")
    with pytest.raises(MediaError, match="not an image or a video"):
        load_media(text)
    with pytest.raises(MediaError, match="no such file"):
        load_media(tmp_path / "missing.jpg")
    broken = tmp_path / "broken.png"
    good = write_image(tmp_path / "good.png", np.zeros((64, 64, 3), np.uint8)).read_bytes()
    broken.write_bytes(good[: len(good) // 2])
    with pytest.raises(MediaError, match="damaged or truncated"):
        load_media(broken)
