"""The generated newsroom anchor: a 1920x1080 studio shot whose real face, a fifth of the height, registration finds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from avatars.anchor import FACE_CENTRE_X, HEIGHT, WIDTH, anchor_frame, main
from avatars.cache import load_avatar
from avatars.faces import load_face_models
from avatars.register import register
from engine.render.paste_back import PasteBack


@pytest.fixture(scope="module")
def anchor() -> np.ndarray:
    return anchor_frame()


def test_the_anchor_is_a_full_hd_frame_made_the_same_every_time(anchor: np.ndarray) -> None:
    assert anchor.shape == (HEIGHT, WIDTH, 3) and anchor.dtype == np.uint8
    assert np.array_equal(anchor, anchor_frame())


def test_the_packaged_detector_finds_one_face_a_fifth_of_the_frame_high_left_of_centre(anchor: np.ndarray) -> None:
    faces, detector = load_face_models(None).detect(anchor)
    assert len(faces) == 1 and "BlazeFace" in detector
    (face,) = faces
    assert 0.15 < face.height / HEIGHT < 0.3
    centre_x = (face.box[0] + face.box[2]) / 2
    assert abs(centre_x / WIDTH - FACE_CENTRE_X) < 0.03


def test_the_command_writes_the_frame_losslessly_and_says_how_to_register_it(
    tmp_path: Path, anchor: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "anchor1080.png"
    assert main([str(out)]) == 0
    assert np.array_equal(np.asarray(Image.open(out)), anchor)
    assert f"python -m apps.avatars register {out} --name anchor1080" in capsys.readouterr().out


@pytest.mark.slow
def test_registration_crops_the_small_face_and_pastes_back_into_the_full_frame(tmp_path: Path, checkpoint_dir) -> None:
    portrait = tmp_path / "anchor1080.png"
    main([str(portrait)])
    checkpoints = checkpoint_dir("motion_extractor", "appearance_extractor")
    path = register(portrait, "anchor1080", checkpoints, cache_dir=tmp_path)
    avatar = load_avatar(path)
    assert tuple(avatar.frames.shape[1:3]) == (HEIGHT, WIDTH), "the full studio frame, not the crop"
    paste = PasteBack(avatar.frames, avatar.M_c2o)
    rows, cols = len(paste.rows), len(paste.cols)
    assert 0.25 < rows / HEIGHT < 0.5 and rows == pytest.approx(cols, abs=2), "the 512 crop lands on the face only"
