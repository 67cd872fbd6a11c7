"""The control flags of both CLIs: single flags and a JSON file, checked at parse time, applied over the engine's
defaults."""

from __future__ import annotations

import json

import pytest

from apps.control_flags import session_controls
from apps.render import parse_args as render_args
from apps.serve import parse_args as serve_args
from engine.controls import Controls


def test_flags_set_the_controls_they_name_and_nothing_else() -> None:
    args = render_args(
        [
            "--demo",
            "--pitch",
            "-8",
            "--yaw-scale",
            "0.5",
            "--emotion",
            "happy,surprise",
            "--no-blink",
            "--blink-gaps",
            "30,80",
        ]
        + ["--fade-in", "10", "--fade-out", "12", "--fade-target", "first", "--vad-alpha", "0.4"]
        + ["--fix-kp-cond", "1", "--fix-kp-cond-dims", "0:202"]
    )
    assert args.control_changes == {
        "pitch": -8.0,
        "yaw_scale": 0.5,
        "blink": False,
        "fade_in": 10,
        "fade_out": 12,
        "fade_target": "first",
        "vad_alpha": 0.4,
        "fix_kp_cond": 1,
        "emotion": ("happy", "surprise"),
        "blink_gaps": (30, 80),
        "fix_kp_cond_dims": (0, 202),
    }
    assert render_args(["--demo"]).control_changes == {}
    assert serve_args(["--avatar", "a", "--roll", "3", "--blink"]).control_changes == {"roll": 3.0, "blink": True}


def test_a_json_file_gives_any_control_and_flags_override_it(tmp_path) -> None:
    path = tmp_path / "controls.json"
    path.write_text(json.dumps({"expression": [0.001] * 63, "emotion": [[0.5, 0, 0, 0.5, 0, 0, 0, 0]], "pitch": 4}))
    changes = serve_args(["--avatar", "a", "--controls", str(path), "--pitch", "-2"]).control_changes
    controls = Controls().replace(**changes)
    assert controls.pitch == -2.0 and controls.expression == (0.001,) * 63
    assert controls.emotion_rows().tolist() == [[0.5, 0, 0, 0.5, 0, 0, 0, 0]]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--yaw", "400"], "yaw must be within [-90, 90]"),
        (["--emotion", "bored"], "unknown emotion 'bored'"),
        (["--fade-in", "-3"], "fade_in must be a whole number of frames"),
        (["--fix-kp-cond-dims", "5"], "START:STOP"),
        (["--fix-kp-cond-dims", "9:3"], "0 ≤ start < stop ≤ 265"),
        (["--blink-gaps", "a"], "--blink-gaps takes whole numbers"),
        (["--controls", "/nonexistent.json"], "--controls /nonexistent.json"),
    ],
)
def test_bad_control_flags_are_explained(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        render_args(["--demo", *argv])
    assert message in capsys.readouterr().err


def test_asking_for_blinks_without_a_table_says_where_one_comes_from(capsys: pytest.CaptureFixture) -> None:
    assert session_controls(Controls(), {"blink": True, "yaw": 2.0}) == Controls(yaw=2.0)
    assert "no blink table" in capsys.readouterr().err
    table = ((0.0,) * 63,)
    assert session_controls(Controls(blink_table=table), {"blink": True}).blink_table == table
    assert capsys.readouterr().err == ""
