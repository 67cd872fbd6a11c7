"""bench.loop_ops: the runtime loop's dispatched operators per tick, stage by stage."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from avatars.register import register
from bench import loop_ops
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.runtime import Runtime

pytestmark = pytest.mark.slow


def test_stage_counts_cover_a_live_tick_and_the_runtime_is_left_as_it_was(tmp_path, checkpoint_dir) -> None:
    from skimage import data

    Image.fromarray(data.astronaut()[:320, 64:384]).save(tmp_path / "face.png")
    avatar = register(tmp_path / "face.png", "face", checkpoint_dir(), cache_dir=tmp_path, progress=False)
    pose, tick, threads = SessionPipeline.pose, Runtime._tick, torch.get_num_threads()
    out = tmp_path / "ops.json"
    assert loop_ops.main(["--avatar", str(avatar), "--sessions", "2", "--seconds", "1.6", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    stages = report["ops_per_stage_per_full_tick"]
    assert report["full_ticks"] >= 1
    assert stages["per-session stitching (pose)"] > 0 and stages["window requests"] > 0
    assert report["ops_per_full_tick"] >= sum(stages.values()) > 0
    assert SessionPipeline.pose is pose and Runtime._tick is tick, "the counting wrappers are removed"
    assert torch.get_num_threads() == threads
