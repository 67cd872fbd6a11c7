"""python -m apps.avatars: registration from the command line on the packaged mediapipe path, random official-layout
checkpoints, listing and showing the cache, and failures that say what is wrong and leave nothing behind.

The weights are random, so the features are not those of a face; what is checked is that every
stage runs for real on a real photo and that the cache holds what the engine needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from apps.avatars import main
from avatars.cache import REGISTRATION_NETWORKS, load_avatar
from avatars.crop import transform_points
from avatars.mask import feathered_mask
from tests.avatars.conftest import write_image


@pytest.mark.slow
def test_the_astronaut_registers_from_the_command_line(
    tmp_path: Path, astronaut: np.ndarray, checkpoint_dir, capsys: pytest.CaptureFixture[str]
) -> None:
    portrait = write_image(tmp_path / "astronaut.png", astronaut)
    cache, ckpt = tmp_path / "cache", checkpoint_dir(*REGISTRATION_NETWORKS)
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
        "pitch": (1, 66),
        "yaw": (1, 66),
        "roll": (1, 66),
        "t": (1, 3),
        "exp": (1, 63),
        "scale": (1, 1),
        "kp": (1, 63),
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
    ckpt = str(checkpoint_dir(*REGISTRATION_NETWORKS))
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


def test_listing_shows_a_fifo_or_a_deeply_nested_manifest_as_unreadable(tmp_path: Path, capsys) -> None:
    import os
    import threading

    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "manifest.json")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    codes: list[int] = []
    lister = threading.Thread(target=lambda: codes.append(main(["list", "--cache-dir", str(tmp_path)])), daemon=True)
    lister.start()
    lister.join(10)
    assert codes == [0], "the listing blocked or failed"
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["deep", "fifo"]
    assert all("(unreadable manifest: register it again)" in line for line in lines)
