"""Per-frame LMDM conditions [hubert 1024 | emotion 8 | eye_open 2 | eye_ball 6 | keypoints 63], checked against D."""

from __future__ import annotations

import pytest
import torch

from engine.motion.conditions import CONDITION_DIM, ConditionBuilder, emotion_table, emotion_vector, mirror_index


def test_single_emotion_is_a_sharp_softmax() -> None:
    vector = emotion_vector(4)
    assert vector[4].item() == pytest.approx(0.99766, abs=1e-5)
    assert vector[0].item() == pytest.approx(0.000335, abs=1e-6)
    assert vector.sum().item() == pytest.approx(1.0)
    torch.testing.assert_close(emotion_vector("Neutral"), vector)


def test_emotion_sets_and_per_frame_lists() -> None:
    pair = emotion_vector([3, 4])
    assert pair[3].item() == pytest.approx(pair[4].item()) and pair[3].item() > 0.49
    table = emotion_table([[4], [3, 4], ["happy"]])
    assert table.shape == (3, 8) and table[2].argmax().item() == 3
    assert emotion_table([3, 4]).shape == (1, 8)
    with pytest.raises(ValueError, match="0..7"):
        emotion_vector(8)
    with pytest.raises(ValueError, match="unknown emotion"):
        emotion_vector("bored")


def test_mirror_index_ping_pongs_and_clamps_negatives() -> None:
    assert mirror_index(torch.arange(-2, 9), 3).tolist() == [0, 0, 0, 1, 2, 2, 1, 0, 0, 1, 2]


def test_conditions_are_laid_out_in_order() -> None:
    g = torch.Generator().manual_seed(0)
    kp, eye_open, eye_ball = torch.randn(63, generator=g), torch.rand(2, generator=g), torch.randn(6, generator=g)
    builder = ConditionBuilder(kp, eye_open, eye_ball, width=1103, emotion="happy")
    hubert = torch.randn(2, 80, 1024, generator=g)
    cond = builder(hubert, start=-10)
    assert cond.shape == (2, 80, CONDITION_DIM)
    assert torch.equal(cond[..., :1024], hubert)
    torch.testing.assert_close(cond[..., 1024:1032], emotion_vector(3).expand(2, 80, 8))
    assert torch.equal(cond[..., 1032:1034], eye_open.expand(2, 80, 2))
    assert torch.equal(cond[..., 1034:1040], eye_ball.expand(2, 80, 6))
    assert torch.equal(cond[..., 1040:], kp.expand(2, 80, 63))


def test_per_frame_avatar_tables_follow_the_window_start() -> None:
    eye_open = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    builder = ConditionBuilder(torch.zeros(63), eye_open, torch.zeros(6), width=1103, emotion=[[0], [1]])
    cond = builder(torch.zeros(2, 4, 1024), start=torch.tensor([-2, 2]))
    assert cond[0, :, 1032].tolist() == [0, 0, 0, 2], "the silence before the stream uses avatar frame 0"
    assert cond[1, :, 1032].tolist() == [4, 4, 2, 0], "avatar frames ping-pong"
    assert cond[1, :, 1024:1032].argmax(-1).tolist() == [0, 1, 0, 1], "per-frame emotions cycle"
    builder.set_emotion(6)
    assert builder(torch.zeros(1, 2, 1024), start=0)[0, :, 1024:1032].argmax(-1).tolist() == [6, 6]


def test_width_mismatch_with_the_checkpoint_is_explained() -> None:
    with pytest.raises(ValueError, match=r"expects 1059-wide conditions.*1103"):
        ConditionBuilder(torch.zeros(63), torch.zeros(2), torch.zeros(6), width=1059)
    builder = ConditionBuilder(torch.zeros(63), torch.zeros(2), torch.zeros(6), width=1103)
    with pytest.raises(ValueError, match="hubert features"):
        builder(torch.zeros(80, 1024), start=0)
    with pytest.raises(ValueError, match="eye_ball"):
        ConditionBuilder(torch.zeros(63), torch.zeros(2), torch.zeros(5), width=1103)
