"""The official cfg's defaults as session controls, read as plain data only (never running code from the pickle)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.controls import Controls
from engine.official_cfg import MAX_ARRAY_BYTES, CfgError, cfg_controls, find_official_cfg, official_controls, read_cfg

ROOT = Path(__file__).resolve().parents[2]


def official_layout(root, default_kwargs: dict, name: str = "v0.4_hubert_cfg_pytorch.pkl", protocol: int = 4):
    """A download's folders with a cfg pickled the way the reference's is (dicts of dicts, numpy arrays)."""
    models = root / "ditto_pytorch" / "models"
    models.mkdir(parents=True)
    (root / "ditto_cfg").mkdir()
    cfg = {
        "base_cfg": {"decoder_cfg": {"model_path": "decoder.pth"}},
        "audio2motion_cfg": {"seq_frames": 80},
        "default_kwargs": default_kwargs,
    }
    (root / "ditto_cfg" / name).write_bytes(pickle.dumps(cfg, protocol=protocol))
    return models


def test_the_cfgs_controls_become_the_session_defaults(tmp_path) -> None:
    rng = np.random.default_rng(0)
    emo = rng.random((600, 8)).astype(np.float32)
    blink = (rng.standard_normal((15, 63)) * 0.01).astype(np.float32)
    clip = np.stack([-np.ones(265), np.ones(265), np.zeros(265), np.zeros(265)]).astype(np.float32)
    models = official_layout(
        tmp_path,
        {
            "emo": emo,
            "delta_eye_arr": blink,
            "delta_eye_open_n": 0,
            "v_min_max_for_clip": clip,
            "fix_kp_cond": 1,
            "fix_kp_cond_dim": [0, 202],
            "overall_ctrl_info": {"delta_pitch": 2},
            "overlap_v2": 70,
            "sampling_timesteps": 10,
            "fade_type": "",
            "fade_out_keys": ("exp",),
        },
    )
    assert find_official_cfg(models) == tmp_path / "ditto_cfg" / "v0.4_hubert_cfg_pytorch.pkl"
    controls = official_controls(models)
    np.testing.assert_allclose(controls.emotion_rows().numpy(), emo)
    np.testing.assert_allclose(np.array(controls.blink_table), blink, atol=1e-7)
    assert controls.clip_range == (tuple([-1.0] * 265), tuple([1.0] * 265)), "rows 0 and 1 are min and max"
    assert (controls.fix_kp_cond, controls.fix_kp_cond_dims, controls.pitch) == (1, (0, 202), 2.0)
    assert controls.blink and controls.blink_gaps == 0 and controls.fade_target == "source"


def test_no_cfg_or_a_bad_value_leaves_the_reference_code_defaults(tmp_path, caplog) -> None:
    assert official_controls(tmp_path) == Controls()
    models = official_layout(
        tmp_path, {"emo": 9, "delta_eye_open_n": -1, "fade_type": "d0", "overall_ctrl_info": {"delta_yaw": 3.5}}
    )
    controls = official_controls(models)
    assert controls == Controls(blink=False, fade_target="first", yaw=3.5)
    assert "emotion" in caplog.text and "left out" in caplog.text


def test_a_cfg_pickle_that_would_run_code_is_refused_unread(tmp_path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"default_kwargs": {"emo": Payload()}}))
    with pytest.raises(CfgError, match="not plain data"):
        read_cfg(path)
    assert not (tmp_path / "pwned").exists()
    models = official_layout(tmp_path / "dl", {})
    (tmp_path / "dl" / "ditto_cfg" / "v0.4_hubert_cfg_pytorch.pkl").write_bytes(path.read_bytes())
    assert official_controls(models) == Controls() and not (tmp_path / "pwned").exists()


def test_numpy_1_pickles_of_the_reference_era_are_read(tmp_path) -> None:
    """Arrays pickled by numpy 1.x name numpy.core.multiarray._reconstruct (numpy 2 renamed the module)."""
    data = pickle.dumps({"default_kwargs": {"delta_eye_arr": np.full((2, 63), 0.5, np.float32)}}, protocol=2)
    legacy = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert legacy != data
    (tmp_path / "cfg.pkl").write_bytes(legacy)
    cfg = read_cfg(tmp_path / "cfg.pkl")
    assert cfg_controls(cfg["default_kwargs"]).blink_table == ((0.5,) * 63,) * 2


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_arrays_scalars_and_nested_dicts_are_rebuilt_at_every_protocol(tmp_path, protocol: int) -> None:
    from collections import OrderedDict

    cfg = {
        "default_kwargs": {
            "delta_eye_arr": np.arange(126, dtype=np.float32).reshape(2, 63),
            "fortran": np.asfortranarray(np.eye(3, 2)),
            "big_endian": np.arange(4, dtype=">i4"),
            "flags": np.array([True, False]),
            "scalar": np.float64(0.25),
            "nested": OrderedDict(a=[1, (2.5, "x")], b=None),
            "raw": b"\x00\xff",
        }
    }
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps(cfg, protocol=protocol))
    read = read_cfg(tmp_path / "cfg.pkl")["default_kwargs"]
    for key in ("delta_eye_arr", "fortran", "big_endian", "flags"):
        np.testing.assert_array_equal(read[key], cfg["default_kwargs"][key])
        assert read[key].dtype == cfg["default_kwargs"][key].dtype and read[key].flags.writeable
    assert read["scalar"] == 0.25 and read["nested"] == {"a": [1, (2.5, "x")], "b": None} and read["raw"] == b"\x00\xff"


class _PointerDtype:
    """A structured dtype whose one field is an object pointer, with its object flags cleared."""

    def __reduce__(self):
        field = (np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 63))
        return (np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (_Reduced(field), 0)}, 8, 1, 0))


class _Reduced:
    def __init__(self, reduced: tuple) -> None:
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


def test_a_crafted_dtype_that_reads_bytes_as_pointers_is_refused_and_the_process_survives(tmp_path) -> None:
    """numpy's own reconstruction reads the raw bytes as object pointers and the process segfaults."""
    array = _Reduced(
        (np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, (4,), _PointerDtype(), False, b"\x41" * 32))
    )
    path = tmp_path / "crash.pkl"
    path.write_bytes(pickle.dumps({"default_kwargs": {"delta_eye_arr": array}}, protocol=4))
    code = (
        "import sys\nfrom engine.official_cfg import CfgError, read_cfg\n"
        "try:\n    cfg = read_cfg(sys.argv[1])\nexcept CfgError as exc:\n    print('refused:', exc)\n"
        "else:\n    print(cfg['default_kwargs']['delta_eye_arr'].tolist())\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the reader crashed (rc {run.returncode}): {run.stderr[-500:]}"
    assert "refused:" in run.stdout and "dtype" in run.stdout


def test_an_array_over_the_size_limit_is_refused(tmp_path) -> None:
    rows = MAX_ARRAY_BYTES // (63 * 4) + 1
    (tmp_path / "cfg.pkl").write_bytes(
        pickle.dumps({"default_kwargs": {"delta_eye_arr": np.zeros((rows, 63), np.float32)}})
    )
    with pytest.raises(CfgError, match="over the limit"):
        read_cfg(tmp_path / "cfg.pkl")


def test_a_small_pickle_that_repeats_one_row_a_million_times_is_refused(tmp_path) -> None:
    """Shared references make a 2 MB pickle of a (1000000,63) table that would take gigabytes as controls."""
    row = [0.0] * 63
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps({"default_kwargs": {"delta_eye_arr": [row] * 1_000_000}}))
    assert (tmp_path / "cfg.pkl").stat().st_size < 4_000_000
    with pytest.raises(CfgError, match="values"):
        read_cfg(tmp_path / "cfg.pkl")


@pytest.mark.parametrize(
    "value, message",
    [
        (np.array(["a", "b"]), "dtype"),
        (np.array([object()], dtype=object)[:0], "dtype"),
        (np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]), "dtype"),
        ({1, 2}, "not plain data"),
    ],
)
def test_arrays_of_non_numbers_and_other_types_are_refused(tmp_path, value, message: str) -> None:
    (tmp_path / "cfg.pkl").write_bytes(pickle.dumps({"default_kwargs": {"x": value}}, protocol=4))
    with pytest.raises(CfgError, match=message):
        read_cfg(tmp_path / "cfg.pkl")


def test_deep_nesting_is_refused_with_a_clear_error(tmp_path) -> None:
    """{"default_kwargs": {"x": [[[...]]]}} 5000 lists deep, written opcode by opcode (pickle.dumps recurses)."""
    nested = b"(" * 5000 + b"]" + b"l" * 5000
    (tmp_path / "cfg.pkl").write_bytes(b"\x80\x02}X\x0e\x00\x00\x00default_kwargs}X\x01\x00\x00\x00x" + nested + b"ss.")
    with pytest.raises(CfgError, match="nested"):
        read_cfg(tmp_path / "cfg.pkl")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"fade_type": []}, "fade_type"),
        ({"fade_type": {"s": 1}}, "fade_type"),
        ({"fix_kp_cond_dim": 5}, "fix_kp_cond_dims"),
        ({"fix_kp_cond_dim": "ab"}, "fix_kp_cond_dims"),
        ({"overall_ctrl_info": [1, 2]}, "overall_ctrl_info"),
        ({"overall_ctrl_info": 5}, "overall_ctrl_info"),
        ({"overall_ctrl_info": {"delta_yaw": "3"}}, "yaw"),
        ({"emo": [[["happy"]]]}, "emotion"),
        ({"emo": {"happy": 1}}, "emotion"),
        ({"delta_eye_open_n": [[1]]}, "blink_gaps"),
        ({"delta_eye_arr": 7}, "blink_table"),
        ({"v_min_max_for_clip": "x"}, "clip_range"),
        ({"fade_out_keys": 5}, "fade_keys"),
    ],
)
def test_a_cfg_value_of_the_wrong_type_is_left_out_by_name(kwargs: dict, field: str, caplog) -> None:
    """The value is logged by name and left out; the cfg's other values are still applied."""
    overall = {"overall_ctrl_info": {"delta_pitch": 4}} if "overall_ctrl_info" not in kwargs else {}
    assert cfg_controls({**overall, **kwargs}) == (Controls(pitch=4.0) if overall else Controls())
    assert f"the official cfg's {field} is left out" in caplog.text
