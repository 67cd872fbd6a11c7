"""Controls: the reference's defaults, every field validated with an error that names it, immutable and JSON-ready."""

from __future__ import annotations

import dataclasses
import json

import msgpack
import numpy as np
import pytest
import torch

from engine.controls import (
    FIELD_NAMES,
    MAX_TABLE_VALUE,
    STITCH_CONTROLS,
    WINDOW_CONTROLS,
    ControlError,
    Controls,
    check_changes,
    stitch_controls,
)
from engine.motion.conditions import emotion_vector
from engine.motion.stitching import StitchControls


def test_the_defaults_are_the_reference_codes_and_change_nothing() -> None:
    controls = Controls()
    assert (controls.pitch, controls.yaw, controls.roll) == (0.0, 0.0, 0.0)  # no delta_pitch/yaw/roll
    assert (controls.pitch_scale, controls.yaw_scale, controls.roll_scale) == (1.0, 1.0, 1.0)
    assert controls.expression is None and controls.vad_alpha == 1.0 and controls.clip_range is None
    assert controls.emotion == "neutral"  # emo = 4
    assert (
        controls.blink and controls.blink_gaps == 0 and controls.blink_table is None
    )  # delta_eye_open_n 0, no delta_eye_arr
    assert (controls.fade_in, controls.fade_out, controls.fade_keys) == (0, 0, ("exp",))
    assert (controls.fix_kp_cond, controls.fix_kp_cond_dims) == (0, None)
    assert stitch_controls(controls) == StitchControls()
    assert set(WINDOW_CONTROLS) | set(STITCH_CONTROLS) < set(FIELD_NAMES)


def test_controls_are_frozen_values_that_normalise_what_they_are_given() -> None:
    controls = Controls(yaw=5, expression=torch.full((21, 3), 0.01), emotion=["Happy", 6], blink_gaps=[30, 90])
    assert controls.yaw == 5.0 and isinstance(controls.yaw, float)
    assert len(controls.expression) == 63 and np.allclose(controls.expression, 0.01)
    assert controls.emotion == ("happy", 6) and controls.blink_gaps == (30, 90)
    with pytest.raises(dataclasses.FrozenInstanceError):
        controls.yaw = 1.0
    assert hash(controls) == hash(Controls(**{f: getattr(controls, f) for f in FIELD_NAMES}))
    assert controls.replace(yaw=-5).changed(controls) == ("yaw",)
    assert json.loads(json.dumps(controls.to_dict()))["emotion"] == ["happy", 6]


def test_every_emotion_form_of_the_reference_becomes_its_table() -> None:
    torch.testing.assert_close(Controls(emotion=3).emotion_rows(), emotion_vector(3)[None])
    torch.testing.assert_close(Controls(emotion=["happy", "neutral"]).emotion_rows(), emotion_vector([3, 4])[None])
    assert Controls(emotion=[[0], [1, 2]]).emotion_rows().shape == (2, 8)
    table = np.eye(8, dtype=np.float32)[:3]
    torch.testing.assert_close(Controls(emotion=table).emotion_rows(), torch.from_numpy(table))
    assert Controls(emotion=table.tolist()).emotion == Controls(emotion=torch.from_numpy(table)).emotion


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("pitch", 91, "pitch must be within [-90, 90]"),
        ("roll", float("inf"), "roll must be within"),
        ("yaw", True, "yaw must be a number"),
        ("yaw_scale", -0.1, "yaw_scale must be within [0, 3]"),
        ("vad_alpha", 1.5, "vad_alpha must be within [0, 1]"),
        ("expression", np.zeros(64), "expression must be 63 values"),
        ("expression", [float("nan")] * 63, "expression holds NaN"),
        ("emotion", "calm", "unknown emotion 'calm'"),
        ("emotion", 8, "emotion label must be 0..7"),
        ("emotion", [], "non-empty list"),
        ("emotion", list(range(8)), "a label set holds 1 to 7 labels"),
        ("emotion", np.zeros((2, 7)), "an (m,8) table"),
        ("blink", "yes", "blink must be true or false"),
        ("blink_gaps", -1, "set blink to false"),
        ("blink_gaps", [40, 0], "at least 1 frame"),
        ("blink_table", np.zeros((15, 62)), "(K,63) table"),
        ("fade_in", 2.5, "fade_in must be a whole number of frames"),
        ("fade_target", "s", "fade_target must be one of source, first"),
        ("fade_keys", ["exp", "exp"], "distinct motion parts"),
        ("clip_range", np.zeros((1, 265)), "needs two rows"),
        ("clip_range", np.zeros((2, 264)), "(2,265) rows of min and max"),
        ("fix_kp_cond", -1, "fix_kp_cond must be a whole number"),
        ("fix_kp_cond_dims", (0, 300), "0 ≤ start < stop ≤ 265"),
        ("fade_in", 10**30, "fade_in must be a whole number of frames in [0, 90000]"),
        ("fade_out", 90_001, "fade_out must be a whole number of frames in [0, 90000]"),
        pytest.param("fix_kp_cond", 10**5000, "an integer of over 4300 digits", id="fix_kp_cond-5000-digits"),
        ("blink_gaps", 10**9, "blink_gaps must be at most 90000"),
        ("blink_gaps", [40, 10**9], "blink_gaps must be a whole number of frames in [0, 90000]"),
        pytest.param("yaw", 10**400, "yaw must be within [-90, 90], got a number too large", id="yaw-400-digits"),
        pytest.param("pitch_scale", -(10**400), "pitch_scale must be within [0, 3]", id="pitch_scale-400-digits"),
        ("yaw", "5", "yaw must be a number, got '5'"),
        ("yaw", [5], "yaw must be a number"),
        ("expression", [10**400] * 63, "expression must be 63 values (21 keypoints × xyz) of numbers"),
        ("expression", {"x": 1}, "expression must be 63 values"),
        ("clip_range", [[10**400] * 265] * 2, "clip_range must be"),
        ("fade_target", np.array([]), "fade_target must be one of source, first"),
        ("fade_target", ["source"], "fade_target must be one of source, first"),
        ("fade_keys", 7, "fade_keys must list distinct motion parts"),
        ("emotion", {"happy": 1}, "emotion must be a name"),
        ("emotion", 2.5, "emotion must be a name"),
        ("blink", 1, "blink must be true or false"),
    ],
)
def test_bad_values_name_the_field_and_what_it_accepts(field: str, value, message: str) -> None:
    with pytest.raises(ControlError) as error:
        Controls().replace(**{field: value})
    assert message in str(error.value)


def test_the_clip_range_keeps_rows_zero_and_one_as_the_reference_does() -> None:
    rows = np.stack([-np.ones(265), np.ones(265), np.full(265, 9.0), np.full(265, -9.0)])
    clip = Controls(clip_range=rows).clip_range
    assert clip == (tuple([-1.0] * 265), tuple([1.0] * 265))
    assert torch.equal(stitch_controls(Controls(clip_range=rows)).clip, torch.tensor(rows[:2], dtype=torch.float32))


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "blink_table",
            np.zeros((251, 63)),
            "blink_table must be a (K,63) table, K ≥ 1, at most 250 rows of 63; it holds more than 15750 values",
        ),
        ("blink_table", [[0.0] * 63] * 65_000, "it holds more than 15750 values"),
        ("blink_table", [[0.0] * 10_000_000], "it holds more than 15750 values"),
        ("blink_table", [[]] * 1_000_000, "it holds more than 15750 values"),
        (
            "emotion",
            np.zeros((9001, 8)),
            "emotion must be an (m,8) table, at most 9000 rows of 8; it holds more than 72000 values",
        ),
        ("emotion", [[0.125] * 8] * 9001, "emotion holds 9001 rows; at most 9000"),
        ("emotion", [["happy"]] * 9001, "emotion holds 9001 rows; at most 9000"),
        ("blink_gaps", [60] * 1001, "blink_gaps holds 1001 gaps; at most 1000"),
        (
            "expression",
            [0.0] * 10_000_000,
            "expression must be 63 values (21 keypoints × xyz); it holds more than 63 values",
        ),
        ("clip_range", np.zeros((17, 265)), "at most 16 rows of 265; it holds more than 4240 values"),
        ("fade_keys", ["exp"] * 1_000_000, "fade_keys must list distinct motion parts"),
    ],
)
def test_tables_over_their_size_limit_are_refused_before_they_are_converted(field: str, value, message: str) -> None:
    with pytest.raises(ControlError) as error:
        Controls().replace(**{field: value})
    assert message in str(error.value) and len(str(error.value)) < 400, "the message names the limit, not the table"


def test_tables_at_their_size_limit_are_taken() -> None:
    controls = Controls(blink_table=np.zeros((250, 63)), emotion=np.full((9000, 8), 0.125), blink_gaps=[60] * 1000)
    assert len(controls.blink_table) == 250 and len(controls.emotion) == 9000 and len(controls.blink_gaps) == 1000
    assert Controls(fade_in=90_000, fix_kp_cond=90_000, blink_gaps=90_000).fade_in == 90_000


def test_replace_validates_only_the_fields_it_changes(monkeypatch) -> None:
    """A small update beside a big table must not convert the table again (it took seconds per update)."""
    import engine.controls as module

    controls = Controls(blink_table=np.zeros((250, 63)), emotion=np.full((9000, 8), 0.125))

    def refuse(name, value):
        raise AssertionError(f"{name} was validated again")

    monkeypatch.setitem(module._CHECKS, "blink_table", refuse)
    monkeypatch.setitem(module._CHECKS, "emotion", refuse)
    moved = controls.replace(yaw=5)
    assert moved.yaw == 5.0 and moved.changed(controls) == ("yaw",) and moved.blink_table is controls.blink_table
    with pytest.raises(ControlError, match="yaw must be within"):
        controls.replace(yaw=91)
    monkeypatch.undo()
    assert controls.yaw == 0.0 and moved == Controls(**{f: getattr(moved, f) for f in FIELD_NAMES})


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"pitch": 2**70}, "pitch must be within [-90, 90]"),
        ({"fade_in": 2**70}, "fade_in must be a whole number of frames"),
        ({"emotion": 2**70}, "emotion: emotion label must be 0..7"),
        ({"fix_kp_cond_dims": [0, 2**70]}, "fix_kp_cond_dims must be [start, stop)"),
        ({"expression": [2**70] * 63}, f"expression holds a value beyond ±{MAX_TABLE_VALUE:g}"),
        ({"blink_table": [[1e300] * 63]}, "blink_table holds a value beyond"),
        ({"emotion": [[1e300] * 8]}, "emotion holds a value beyond"),
        ({"expression": [True] * 63}, "expression must be 63 values (21 keypoints × xyz) of numbers; it holds true"),
        ({"emotion": [[False] * 7 + [True]]}, "emotion must be an (m,8) table"),
        ({"vad_alpha": True}, "vad_alpha must be a number, got True"),
        ({"yaw": float("nan")}, "yaw must be within"),
        ({"roll": 1e308 * 10}, "roll must be within"),
        ({"self": 1}, "unknown control(s) self;"),
        ({"not an identifier": 1, "__class__": 2}, "unknown control(s) 'not an identifier', __class__;"),
        ({1: 2}, "unknown control(s) 1"),
        ([("yaw", 1)], "controls are a JSON object of control fields"),
    ],
)
def test_a_clients_controls_are_refused_by_name_before_they_cross_a_process(changes, message: str) -> None:
    with pytest.raises(ControlError) as error:
        check_changes(changes)
    assert message in str(error.value)


def test_a_clients_checked_controls_are_plain_values_msgpack_can_carry() -> None:
    clip = [[-1.0] * 265, [1.0] * 265]
    checked = check_changes({"yaw": 10, "fade_in": np.int64(25), "emotion": ["happy", "sad"], "clip_range": clip})
    assert checked == {"yaw": 10.0, "fade_in": 25, "emotion": ["happy", "sad"], "clip_range": clip}
    assert msgpack.unpackb(msgpack.packb(checked)) == checked
    assert Controls().replace(**checked).yaw == 10.0


def test_replace_takes_a_control_named_self_as_an_unknown_control() -> None:
    with pytest.raises(ControlError, match="unknown control.*self"):
        Controls().replace(**{"self": 1})
