"""Registration end to end on the packaged mediapipe path, with random official-layout checkpoints.

The weights are random, so the features are not those of a face; what is checked is that every
stage runs for real on a real photo and that the cache holds what the engine needs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from avatars.cache import load_avatar
from avatars.crop import transform_points
from avatars.register import FaceChoice, centered_mean, register
from tests.avatars.conftest import write_image, write_video
from tests.avatars.test_faces import two_astronauts

NETWORKS = ("motion_extractor", "appearance_extractor")


def test_centered_mean_clips_the_window_at_both_ends() -> None:
    values = np.arange(6, dtype=np.float32)[:, None]
    assert centered_mean(values, 3)[:, 0].tolist() == [0.5, 1, 2, 3, 4, 4.5]
    assert np.allclose(centered_mean(values, 13), values.mean())


@pytest.mark.slow
def test_a_short_video_registers_every_frame_with_a_progress_bar_and_smoothed_motion(
    tmp_path: Path, astronaut: np.ndarray, checkpoint_dir, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = write_video(tmp_path / "clip.mp4", [np.roll(astronaut, i, axis=1) for i in range(3)])
    path = register(clip, "clip", checkpoint_dir(*NETWORKS), cache_dir=tmp_path / "cache", progress=True)
    progress = capsys.readouterr().err
    assert "registering clip: 100%" in progress and "3/3" in progress

    avatar = load_avatar(path)
    assert not avatar.is_image and avatar.num_frames == 3
    assert avatar.manifest["smoothing_frames"] == 13 and avatar.manifest["source"]["fps"] == 25
    # 3 frames in a 13-frame window: every frame's smoothed motion is the mean of all three
    for key in ("pitch", "yaw", "roll", "t", "exp", "scale", "kp"):
        values = getattr(avatar, key)
        assert torch.allclose(values, values[:1].expand_as(values)), key
    assert not torch.equal(avatar.f_s[0], avatar.f_s[2])  # appearance is per frame, not smoothed
    assert not torch.equal(avatar.M_c2o[0], avatar.M_c2o[2])  # the face moved by 2 px: tracked
    shift = avatar.M_c2o[2, 0, 2] - avatar.M_c2o[0, 0, 2]
    assert 0.5 < float(shift) < 3.5


@pytest.mark.slow
def test_face_index_picks_the_smaller_astronaut_on_the_right(
    tmp_path: Path, astronaut: np.ndarray, checkpoint_dir
) -> None:
    portrait = write_image(tmp_path / "two.png", two_astronauts(astronaut))
    path = register(portrait, "right", checkpoint_dir(*NETWORKS), choice=FaceChoice(index=1), cache_dir=tmp_path)
    avatar = load_avatar(path)
    assert avatar.manifest["faces"]["box"][0] > 512 and avatar.manifest["faces"]["face_index"] == 1
    centre = transform_points(np.array([[256.0, 256.0]]), avatar.M_c2o[0].numpy())[0]
    assert centre[0] > 512
