"""The official cfg's defaults as session controls, read as plain data only (never running code from the pickle)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from engine.controls import Controls
from engine.official_cfg import CfgError, cfg_controls, find_official_cfg, official_controls, read_cfg


def official_layout(root, default_kwargs: dict, name: str = "v0.4_hubert_cfg_pytorch.pkl", protocol: int = 4):
    """A download's folders with a cfg pickled the way the reference's is (dicts of dicts, numpy arrays)."""
    models = root / "ditto_pytorch" / "models"
    models.mkdir(parents=True)
    (root / "ditto_cfg").mkdir()
    cfg = {"base_cfg": {"decoder_cfg": {"model_path": "decoder.pth"}}, "audio2motion_cfg": {"seq_frames": 80}, "default_kwargs": default_kwargs}
    (root / "ditto_cfg" / name).write_bytes(pickle.dumps(cfg, protocol=protocol))
    return models


def test_the_cfgs_controls_become_the_session_defaults(tmp_path) -> None:
    rng = np.random.default_rng(0)
    emo = rng.random((600, 8)).astype(np.float32)
    blink = (rng.standard_normal((15, 63)) * 0.01).astype(np.float32)
    clip = np.stack([-np.ones(265), np.ones(265), np.zeros(265), np.zeros(265)]).astype(np.float32)
    models = official_layout(tmp_path, {
        "emo": emo, "delta_eye_arr": blink, "delta_eye_open_n": 0, "v_min_max_for_clip": clip,
        "fix_kp_cond": 1, "fix_kp_cond_dim": [0, 202], "overall_ctrl_info": {"delta_pitch": 2},
        "overlap_v2": 70, "sampling_timesteps": 10, "fade_type": "", "fade_out_keys": ("exp",),
    })
    assert find_official_cfg(models) == tmp_path / "ditto_cfg" / "v0.4_hubert_cfg_pytorch.pkl"
    controls = official_controls(models)
    np.testing.assert_allclose(controls.emotion_rows().numpy(), emo)
    np.testing.assert_allclose(np.array(controls.blink_table), blink, atol=1e-7)
    assert controls.clip_range == (tuple([-1.0] * 265), tuple([1.0] * 265)), "rows 0 and 1 are min and max"
    assert (controls.fix_kp_cond, controls.fix_kp_cond_dims, controls.pitch) == (1, (0, 202), 2.0)
    assert controls.blink and controls.blink_gaps == 0 and controls.fade_target == "source"


def test_no_cfg_or_a_bad_value_leaves_the_reference_code_defaults(tmp_path, caplog) -> None:
    assert official_controls(tmp_path) == Controls()
    models = official_layout(tmp_path, {"emo": 9, "delta_eye_open_n": -1, "fade_type": "d0", "overall_ctrl_info": {"delta_yaw": 3.5}})
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
