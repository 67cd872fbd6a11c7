"""The official cfg's defaults (``ditto_cfg/v0.4_hubert_cfg_*.pkl`` of the checkpoint download) as session controls.

The reference reads its run defaults (``default_kwargs``: the emotion, the blink table, the motion clip range,
fixed keypoint conditioning, overall head-pose offsets...) from this pickle; the code repository ships none of
them. The pickle holds only dicts, lists, strings, numbers and numpy arrays, so it is read with an unpickler
that can build exactly those and refuses every other global: a tampered file cannot run code. numpy never
sees the pickle's state either: arrays are rebuilt here from a numeric dtype name, a shape and raw bytes, within
size limits, so a crafted one cannot crash the process or allocate gigabytes. A cfg that
cannot be read, or a value that is not a valid control, is reported and left out; the rest is kept.
"""

from __future__ import annotations

import io
import logging
import math
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
MAX_CFG_BYTES = 64 << 20
"""A cfg file larger than this is not read (the official ones are a few hundred KB)."""
MAX_ARRAY_BYTES = 4 << 20
"""The largest array a cfg may hold (the official ones hold tables of at most a few thousand values)."""
MAX_BUILT_BYTES = 64 << 20
"""All the arrays, scalars and bytes one cfg builds, together: a small pickle cannot make many copies of one."""
MAX_VALUES = 1_000_000
"""Values in the whole cfg, counting a shared one each time it appears (a pickle can repeat a row by reference)."""
MAX_DEPTH = 16
"""Containers nested deeper than this are refused (the official cfg nests three levels)."""
MAX_DIMS = 8
NUMERIC_DTYPES = frozenset({"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"})
"""The dtypes an array of the cfg may have (bools, integers, floats); no objects, strings or structured records."""
_BYTE_ORDERS = frozenset("<>|=")
_NDARRAY = object()
"""Stands for numpy.ndarray, which a pickled array names as the class to rebuild; numpy's own is never called."""


class CfgError(ValueError):
    """The cfg file cannot be read as plain data."""


class _Dtype:
    """A numeric dtype named by a pickle, checked before numpy sees it (a crafted dtype state can read bytes as
    pointers)."""

    def __init__(self, name: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(name, str) or name not in NUMERIC_DTYPES:
            raise CfgError(
                f"the cfg holds an array of dtype {name!r}; only numbers are read ({', '.join(sorted(NUMERIC_DTYPES))})"
            )
        self.name = name
        self.order: str | None = None

    def __setstate__(self, state: Any) -> None:
        """numpy's dtype state: (version, byte order, subarray, names, fields, ...); only plain numbers are accepted."""
        if (
            not isinstance(state, tuple)
            or len(state) < 5
            or state[1] not in _BYTE_ORDERS
            or any(part is not None for part in state[2:5])
        ):
            raise CfgError(
                f"the cfg holds a {self.name} dtype with a subarray, fields or a bad byte order; only plain numbers "
                "are read"
            )
        self.order = state[1]

    def numpy(self) -> np.dtype:
        """The numpy dtype, built from its checked name and byte order."""
        if self.order is None:
            raise CfgError(f"the cfg holds a {self.name} dtype without its state; not a numpy pickle")
        return np.dtype(self.name if self.order in "|=" else self.order + self.name)


class _Array:
    """An array a pickle rebuilds with ndarray.__setstate__: filled by the reader from the checked state."""

    def __init__(self, reader: _PlainData, array: np.ndarray | None = None) -> None:
        self.reader = reader
        self.array = array

    def __setstate__(self, state: Any) -> None:
        """ndarray's state (version, shape, dtype, fortran, raw bytes) as a checked array."""
        if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
            state = state[1:]
        if not isinstance(state, tuple) or len(state) != 4:
            raise CfgError("the cfg holds an array whose state is not (shape, dtype, fortran, bytes); not loaded")
        shape, dtype, fortran, raw = state
        self.array = self.reader.array(raw, dtype, shape, "F" if fortran is True else "C")


class _PlainData(pickle.Unpickler):
    """Builds containers, numbers, strings and numeric numpy arrays; any other global is refused, never imported.

    numpy's names are mapped to the reader's own builders: a dtype is rebuilt from its checked name and byte order,
    an array from its checked shape and raw bytes, within the size limits, so no crafted state reaches numpy.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.built = 0
        self.globals = {
            ("numpy", "ndarray"): _NDARRAY,
            ("numpy", "dtype"): _Dtype,
            ("collections", "OrderedDict"): dict,
            ("_codecs", "encode"): self.latin1,
        }
        for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
            self.globals[(module, "_reconstruct")] = self.reconstruct
            self.globals[(module, "scalar")] = self.scalar
        for module in ("numpy.core.numeric", "numpy._core.numeric"):
            self.globals[(module, "_frombuffer")] = self.frombuffer

    def find_class(self, module: str, name: str) -> Any:
        target = self.globals.get((module, name))
        if target is None:
            raise CfgError(
                f"the cfg refers to {module}.{name}, which is not plain data (dicts, lists, numpy arrays); not loaded"
            )
        return target

    def spend(self, size: int) -> None:
        """Counts ``size`` bytes built; CfgError past MAX_BUILT_BYTES."""
        self.built += size
        if self.built > MAX_BUILT_BYTES:
            raise CfgError(f"the cfg builds more than {MAX_BUILT_BYTES >> 20} MB of arrays and bytes; not a Ditto cfg")

    def latin1(self, text: Any, encoding: Any = "latin1") -> bytes:
        """Bytes as protocol 2 pickles them: ``_codecs.encode(text, 'latin1')``, and no other codec."""
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
            raise CfgError(f"the cfg encodes bytes with {encoding!r}; only latin1 text (pickle protocol 2) is read")
        self.spend(len(text))
        return text.encode("latin1")

    def reconstruct(self, cls: Any, shape: Any = (0,), typecode: Any = b"b") -> _Array:
        """The empty array ``numpy._core.multiarray._reconstruct`` makes; its state fills it
        (``_Array.__setstate__``)."""
        if cls is not _NDARRAY:
            raise CfgError("the cfg rebuilds an array of a class other than numpy.ndarray; not loaded")
        return _Array(self)

    def frombuffer(self, raw: Any, dtype: Any, shape: Any, order: Any) -> _Array:
        """An array as pickle protocol 5 stores it (``numpy._core.numeric._frombuffer``)."""
        return _Array(self, self.array(raw, dtype, shape, order if order in ("C", "F") else "C"))

    def scalar(self, dtype: Any, raw: Any) -> np.generic:
        """A numpy scalar (``numpy._core.multiarray.scalar``): one value of a numeric dtype."""
        return self.array(raw, dtype, (), "C")[()]

    def array(self, raw: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
        """``raw`` as an array of ``dtype`` and ``shape``, every part checked, copied out of the pickle's bytes."""
        if not isinstance(dtype, _Dtype):
            raise CfgError("the cfg holds an array without a numpy dtype; not loaded")
        kind = dtype.numpy()
        if not isinstance(shape, tuple) or len(shape) > MAX_DIMS or not all(type(n) is int and n >= 0 for n in shape):
            raise CfgError(f"the cfg holds an array of shape {shape!r}; a shape is up to {MAX_DIMS} sizes ≥ 0")
        size = kind.itemsize * math.prod(shape)
        if size > MAX_ARRAY_BYTES:
            raise CfgError(
                f"the cfg holds a {shape} {kind} array of {size} bytes, over the limit of {MAX_ARRAY_BYTES >> 20} MB"
            )
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != size:
            raise CfgError(f"the cfg holds a {shape} {kind} array whose data is not {size} bytes; not loaded")
        self.spend(size)
        return np.frombuffer(bytes(raw), kind).reshape(shape, order=order).copy(order="K")


def _plain(value: Any, depth: int, count: list[int]) -> Any:
    """``value`` with the reader's arrays in place, checked to hold only plain data, within depth and size."""
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise CfgError(f"the cfg holds more than {MAX_VALUES} values (shared ones counted each time); not a Ditto cfg")
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, bytearray, np.generic)):
        return value
    if isinstance(value, _Array):
        if value.array is None:
            raise CfgError("the cfg holds an array without its data; not loaded")
        return value.array
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        raise CfgError(f"the cfg's containers are nested more than {MAX_DEPTH} deep; not a Ditto cfg")
    if type(value) is dict:
        return {_plain(k, depth + 1, count): _plain(v, depth + 1, count) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_plain(v, depth + 1, count) for v in value)
    raise CfgError(
        f"the cfg holds a {type(value).__name__}, which is not plain data (dicts, lists, numbers, strings, arrays)"
    )


def read_cfg(path: str | Path) -> dict[str, Any]:
    """The cfg pickle as plain data (CfgError if it holds anything else or is not a cfg)."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_CFG_BYTES:
            raise CfgError(
                f"the cfg {path} is {size >> 20} MB, over the limit of {MAX_CFG_BYTES >> 20} MB; not a Ditto cfg"
            )
        data = _plain(_PlainData(Path(path).read_bytes()).load(), 0, [0])
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
    if isinstance(fade, str) and fade in FADE_TYPES:
        changes["fade_target"] = FADE_TYPES[fade]
    elif fade is not None and not isinstance(fade, str):
        log.warning(
            "the official cfg's fade_type is left out: %s is not one of %s", _shown(fade), ", ".join(FADE_TYPES)
        )
    if default_kwargs.get("fade_out_keys") is not None:
        changes["fade_keys"] = default_kwargs["fade_out_keys"]
    if default_kwargs.get("v_min_max_for_clip") is not None:
        changes["clip_range"] = default_kwargs["v_min_max_for_clip"]
    if default_kwargs.get("fix_kp_cond") is not None:
        changes["fix_kp_cond"] = default_kwargs["fix_kp_cond"]
    dims = default_kwargs.get("fix_kp_cond_dim")
    if dims is not None:
        changes["fix_kp_cond_dims"] = tuple(dims) if isinstance(dims, (list, tuple, np.ndarray)) else dims
    overall = default_kwargs.get("overall_ctrl_info") or {}
    if not isinstance(overall, Mapping):
        log.warning("the official cfg's overall_ctrl_info is left out: %s is not a dict", _shown(overall))
        overall = {}
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


def _shown(value: Any) -> str:
    """``value`` for a log line, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


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
