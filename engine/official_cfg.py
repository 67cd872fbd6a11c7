"""The official cfg's defaults (``ditto_cfg/v0.4_hubert_cfg_*.pkl`` of the checkpoint download) as session controls.

The reference reads its run defaults (``default_kwargs``: the emotion, the blink table, the motion clip range,
fixed keypoint conditioning, overall head-pose offsets...) from this pickle; the code repository ships none of
them. The pickle holds only dicts, lists, strings, numbers and numpy arrays, so it is read with an unpickler
that can build exactly those and refuses every other global: a tampered file cannot run code. A cfg that
cannot be read, or a value that is not a valid control, is reported and left out; the rest is kept.
"""

from __future__ import annotations

import importlib
import io
import logging
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.controls import ControlError, Controls

log = logging.getLogger("ditto.official_cfg")
CFG_NAMES = ("v0.4_hubert_cfg_pytorch.pkl", "v0.4_hubert_cfg_trt_online.pkl", "v0.4_hubert_cfg_trt.pkl")
"""Searched in this order: the cfg of the PyTorch release (the weights this engine loads) first."""
FADE_TYPES = {"s": "source", "d0": "first"}
OVERALL_CONTROLS = {
    "delta_pitch": "pitch",
    "delta_yaw": "yaw",
    "delta_roll": "roll",
    "alpha_pitch": "pitch_scale",
    "alpha_yaw": "yaw_scale",
    "alpha_roll": "roll_scale",
    "delta_exp": "expression",
    "vad_alpha": "vad_alpha",
}
_NUMPY_GLOBALS = {
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"): ("numpy._core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"): ("numpy._core.multiarray", "scalar"),
    ("collections", "OrderedDict"): ("collections", "OrderedDict"),
    ("_codecs", "encode"): ("_codecs", "encode"),
}
"""The globals a pickle of plain data and numpy arrays names (``_codecs.encode``: bytes in protocol 2), mapped to
numpy 2's module names."""


class CfgError(ValueError):
    """The cfg file cannot be read as plain data."""


class _PlainData(pickle.Unpickler):
    """Builds containers, numbers, strings and numpy arrays; any other global is refused, never imported."""

    def find_class(self, module: str, name: str) -> Any:
        target = _NUMPY_GLOBALS.get((module, name))
        if target is None:
            raise CfgError(f"the cfg refers to {module}.{name}, which is not plain data (dicts, lists, numpy arrays); not loaded")
        return getattr(importlib.import_module(target[0]), target[1])


def read_cfg(path: str | Path) -> dict[str, Any]:
    """The cfg pickle as plain data (CfgError if it holds anything else or is not a cfg)."""
    try:
        data = _PlainData(io.BytesIO(Path(path).read_bytes())).load()
    except CfgError:
        raise
    except Exception as exc:
        raise CfgError(f"cannot read the cfg {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("default_kwargs"), dict):
        raise CfgError(f"{path} is not a Ditto cfg (a dict with 'default_kwargs')")
    return data


def find_official_cfg(models: Path) -> Path | None:
    """The cfg beside an official download: ``ditto_cfg`` two levels above ``ditto_pytorch/models`` (or nearer)."""
    for folder in (models.parent.parent / "ditto_cfg", models.parent / "ditto_cfg", models / "ditto_cfg"):
        for name in CFG_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def cfg_controls(default_kwargs: Mapping[str, Any], base: Controls | None = None) -> Controls:
    """``base`` with the cfg's control defaults applied; values that are not valid controls are logged and skipped."""
    changes: dict[str, Any] = {}
    if "emo" in default_kwargs:
        changes["emotion"] = default_kwargs["emo"]
    if default_kwargs.get("delta_eye_arr") is not None:
        changes["blink_table"] = default_kwargs["delta_eye_arr"]
    gaps = default_kwargs.get("delta_eye_open_n")
    if gaps is not None:
        if isinstance(gaps, (int, np.integer)) and gaps < 0:
            changes["blink"] = False
        else:
            changes["blink_gaps"] = gaps
    fade = default_kwargs.get("fade_type")
    if fade in FADE_TYPES:
        changes["fade_target"] = FADE_TYPES[fade]
    if default_kwargs.get("fade_out_keys") is not None:
        changes["fade_keys"] = default_kwargs["fade_out_keys"]
    if default_kwargs.get("v_min_max_for_clip") is not None:
        changes["clip_range"] = default_kwargs["v_min_max_for_clip"]
    if default_kwargs.get("fix_kp_cond") is not None:
        changes["fix_kp_cond"] = default_kwargs["fix_kp_cond"]
    if default_kwargs.get("fix_kp_cond_dim") is not None:
        changes["fix_kp_cond_dims"] = tuple(default_kwargs["fix_kp_cond_dim"])
    overall = default_kwargs.get("overall_ctrl_info") or {}
    for key, field in OVERALL_CONTROLS.items():
        if key in overall:
            changes[field] = overall[key]
    controls = base or Controls()
    for field, value in changes.items():
        try:
            controls = controls.replace(**{field: value.item() if isinstance(value, np.generic) else value})
        except ControlError as exc:
            log.warning("the official cfg's %s is left out: %s", field, exc)
    return controls


def official_controls(models: Path) -> Controls:
    """The controls the official cfg beside ``models`` sets (the reference's code defaults where it has none)."""
    path = find_official_cfg(models)
    if path is None:
        return Controls()
    try:
        cfg = read_cfg(path)
    except CfgError as exc:
        log.warning("%s; sessions use the reference code's defaults", exc)
        return Controls()
    log.info("session defaults from %s", path)
    return cfg_controls(cfg["default_kwargs"])
