"""Registration end to end on the packaged mediapipe path, with random official-layout checkpoints.

The weights are random, so the features are not those of a face; what is checked is that every
stage runs for real on a real photo and that the cache holds what the engine needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from avatars.__main__ import main
from avatars.cache import load_avatar
from avatars.crop import transform_points
from avatars.mask import feathered_mask
from avatars.register import FaceChoice, centered_mean, register
from tests.avatars.conftest import write_image, write_video
from tests.avatars.test_faces import two_astronauts

NETWORKS = ("motion_extractor", "appearance_extractor")


def test_centered_mean_clips_the_window_at_both_ends() -> None:
    values = np.arange(6, dtype=np.float32)[:, None]
    assert centered_mean(values, 3)[:, 0].tolist() == [0.5, 1, 2, 3, 4, 4.5]
    assert np.allclose(centered_mean(values, 13), values.mean())


@pytest.mark.slow
def test_the_astronaut_registers_from_the_command_line(
    tmp_path: Path, astronaut: np.ndarray, checkpoint_dir, capsys: pytest.CaptureFixture[str]
) -> None:
    portrait = write_image(tmp_path / "astronaut.png", astronaut)
    cache, ckpt = tmp_path / "cache", checkpoint_dir(*NETWORKS)
    args = ["register", str(portrait), "--name", "astro", "--checkpoints", str(ckpt), "--cache-dir", str(cache)]
    assert main([*args, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "face path: packaged (mediapipe BlazeFace short-range" in out and "512x512" in out

    avatar = load_avatar("astro", "cpu", cache_dir=cache, checkpoints=ckpt)
    assert avatar.is_image and avatar.num_frames == 1
    assert avatar.f_s.shape == (1, 32, 16, 64, 64) and avatar.f_s.dtype == torch.float32
    assert torch.isfinite(avatar.f_s).all() and avatar.f_s.std() > 0
    shapes = {k: tuple(getattr(avatar, k).shape) for k in ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")}
    assert shapes == {
        "pitch": (1, 66), "yaw": (1, 66), "roll": (1, 66), "t": (1, 3), "exp": (1, 63), "scale": (1, 1), "kp": (1, 63)
    }
    assert torch.equal(avatar.sc, avatar.kp[0])
    assert torch.equal(avatar.frames[0], torch.from_numpy(astronaut))
    assert torch.equal(avatar.mask_crop, torch.from_numpy(feathered_mask()))
    # the crop centre lands on the face (Haar box 177..272 x 66..161), a bit above its middle (vy = -0.125)
    centre = transform_points(np.array([[256.0, 256.0]]), avatar.M_c2o[0].numpy())[0]
    assert 200 < centre[0] < 250 and 80 < centre[1] < 140
    assert (0.3 < avatar.eye_open).all() and (avatar.eye_open < 2).all()  # open eyes
    faces = avatar.manifest["faces"]
    assert faces["kind"] == "packaged" and faces["detector_used"] == "mediapipe BlazeFace short-range"
    assert avatar.manifest["checkpoints"]["random_weights"] is False

    assert main(["list", "--cache-dir", str(cache)]) == 0
    assert "astro" in capsys.readouterr().out
    assert main(["show", "astro", "--cache-dir", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)["source"]["sha256"] == avatar.manifest["source"]["sha256"]


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


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        (lambda a: np.full((480, 640, 3), 128, np.uint8), [], "no face found"),
        (lambda a: a, ["--face-box", "10,10,30,30"], "only 30 px across"),
        (lambda a: a, ["--face-box", "400,400,200,200"], "outside the 512x512 source"),
        (lambda a: a, ["--face-index", "3"], "--face-index 3: the source has 1 face"),
        (None, [], "not an image or a video"),
    ],
)
def test_bad_sources_fail_clearly_and_leave_no_cache(
    tmp_path: Path, astronaut: np.ndarray, checkpoint_dir, capsys: pytest.CaptureFixture[str], make, extra, message
) -> None:
    source = tmp_path / "source.png"
    if make is None:
        source.write_bytes(b"\x00garbage" * 100)
    else:
        write_image(source, make(astronaut))
    cache = tmp_path / "cache"
    ckpt = str(checkpoint_dir(*NETWORKS))
    assert main(["register", str(source), "--name", "x", "--checkpoints", ckpt, "--cache-dir", str(cache), *extra]) == 1
    assert message in capsys.readouterr().err
    assert not cache.exists() or list(cache.iterdir()) == []


def test_without_checkpoints_random_weights_are_generated_and_announced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gray = write_image(tmp_path / "gray.png", np.full((256, 256, 3), 128, np.uint8))
    cache = tmp_path / "cache"
    assert main(["register", str(gray), "--name", "x", "--cache-dir", str(cache)]) == 1  # no face, after the banner
    err = capsys.readouterr().err
    assert "RANDOM weights" in err and "NOT" in err and "no face found" in err
    written = sorted(p.name for p in (cache / ".random-checkpoints").iterdir())
    assert written == ["appearance_extractor.pth", "motion_extractor.pth"]
    assert main(["list", "--cache-dir", str(cache)]) == 0
    assert "no avatars" in capsys.readouterr().out  # the checkpoint folder is not an avatar
