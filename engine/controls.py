"""One session's controls: head pose offsets, expression offsets, emotion, blinks, fades, mouth damping, the motion
clip range and fixed keypoint conditioning, as one frozen, validated value with the reference's defaults.

Every field mirrors a setting of the reference (ditto-talkinghead ``StreamSDK.setup`` kwargs and the per-frame
``MotionStitch`` ctrl kwargs), named in its docstring. A session takes a new value at any time, from any thread
(``Session.set_controls`` / ``Session.update_controls``); the runtime's loop applies it at its next tick:

- window controls (``WINDOW_CONTROLS``: emotion, fix_kp_cond, fix_kp_cond_dims) condition the LMDM windows sampled
  from then on, so the picture follows with the motion's own lag (the frames those windows make final);
- every other control acts on the frames stitched from then on (the next rendered frame).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.motion.conditions import EMOTION_DIM, EMOTIONS, emotion_index, emotion_table
from engine.motion.stitching import StitchControls
from engine.motion.vector import MOTION_DIM, MOTION_KEYS, NUM_KEYPOINTS

EXPRESSION_DIM = 3 * NUM_KEYPOINTS
MAX_POSE_DEGREES = 90.0
MAX_POSE_SCALE = 3.0
MAX_FRAMES = 90_000
"""The longest fade, blink gap or fix_kp_cond period: an hour at 25 fps (a larger count overflowed the render)."""
MAX_BLINK_ROWS = 250
"""The longest blink table: 10 s at 25 fps (the official cfg's blink is 15 frames)."""
MAX_EMOTION_ROWS = 9000
"""The longest per-frame emotion table or list of label sets: 6 minutes at 25 fps, cycled after that."""
MAX_GAPS = 1000
"""The longest list of blink gaps (cycled)."""
MAX_CLIP_ROWS = 16
"""Rows a clip range may carry (the official cfg's has 4; rows after the first two are ignored)."""
MAX_TABLE_VALUE = 1e6
"""The largest magnitude in a table or the expression: far past any keypoint, motion or probability value, and far
inside float32, which the tables become on the device (a larger value turns to inf there and renders NaN)."""
FADE_TARGETS = ("source", "first")
WINDOW_CONTROLS = ("emotion", "fix_kp_cond", "fix_kp_cond_dims")
STITCH_CONTROLS = (
    "pitch",
    "yaw",
    "roll",
    "pitch_scale",
    "yaw_scale",
    "roll_scale",
    "expression",
    "vad_alpha",
    "clip_range",
)
BLINK_CONTROLS = ("blink", "blink_gaps", "blink_table")
FADE_CONTROLS = ("fade_in", "fade_out", "fade_target", "fade_keys")

Label = int | str
EmotionSpec = Label | tuple[Label, ...] | tuple[tuple[Label, ...], ...] | tuple[tuple[float, ...], ...]


class ControlError(ValueError):
    """A control value that cannot be used; the message names the field and what it accepts."""


@dataclass(frozen=True)
class Controls:
    """A session's controls; the defaults are the reference's and change nothing in the output."""

    pitch: float = 0.0
    """Degrees added to the head's pitch (reference ``delta_pitch``)."""
    yaw: float = 0.0
    """Degrees added to the head's yaw (``delta_yaw``)."""
    roll: float = 0.0
    """Degrees added to the head's roll (``delta_roll``)."""
    pitch_scale: float = 1.0
    """Multiplies the pitch angle after the offset (``alpha_pitch``); 0 holds the head level on that axis."""
    yaw_scale: float = 1.0
    """Multiplies the yaw angle after the offset (``alpha_yaw``)."""
    roll_scale: float = 1.0
    """Multiplies the roll angle after the offset (``alpha_roll``)."""
    expression: tuple[float, ...] | None = None
    """63 values added to the expression (21 keypoints × xyz; ``delta_exp``); None adds nothing."""
    vad_alpha: float = 1.0
    """Mouth damping (``vad_alpha``): the expression becomes exp·α + avatar exp·(1−α); 1 = as driven, 0 = the
    avatar's own (mouth as in the portrait). The reference derives it from no VAD of its own: its caller passes it."""
    emotion: EmotionSpec = "neutral"
    """``emo``: a name or index (0 angry … 7 contempt), a set of labels mixed equally, a list of label sets
    (one per frame, cycled), or a table of rows of 8 probabilities (one per frame, cycled)."""
    blink: bool = True
    """Blink with ``blink_table`` (image avatars; the reference blinks whenever its cfg has ``delta_eye_arr``)."""
    blink_gaps: int | tuple[int, ...] = 0
    """Open frames between blinks (``delta_eye_open_n``): 0 random 60–100, n > 0 fixed, a list cycled (first entry
    before the first blink)."""
    blink_table: tuple[tuple[float, ...], ...] | None = None
    """One blink, (K,63) expression deltas of the eye keypoints per frame (``delta_eye_arr``; the official cfg ships
    one of 15 frames, the reference code none). None: no blinks, the eyes follow the motion model."""
    fade_in: int = 0
    """Frames over which the expression fades in from ``fade_target`` at the start (``fade_in``)."""
    fade_out: int = 0
    """Frames over which it fades out to ``fade_target`` before the end (``fade_out``; once the end is known)."""
    fade_target: str = "source"
    """What fades blend with (``fade_type``): "source" the avatar ("s"), "first" the first frame shown ("d0")."""
    fade_keys: tuple[str, ...] = ("exp",)
    """Motion parts the fades blend (``fade_out_keys``)."""
    clip_range: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    """Per-dimension (min, max) of the 265-d motion before stitching (``v_min_max_for_clip``, rows 0 and 1)."""
    fix_kp_cond: int = 0
    """Every n-th window is conditioned on the avatar's own motion instead of the last frame (``fix_kp_cond``)."""
    fix_kp_cond_dims: tuple[int, int] | None = None
    """With ``fix_kp_cond``: motion dims [start, stop) kept from the last frame on those windows
    (``fix_kp_cond_dim``)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = _CHECKS[field.name](field.name, getattr(self, field.name))
            object.__setattr__(self, field.name, value)

    def replace(self, /, **changes: Any) -> Controls:
        """A copy with ``changes`` applied and validated (ControlError names any unknown or bad field).

        Only the changed fields are validated: the others are already, and a big table beside a small update
        would be converted again on every update.
        """
        unknown = sorted(set(changes) - set(FIELD_NAMES))
        if unknown:
            raise ControlError(f"unknown control(s) {', '.join(unknown)}; controls are: {', '.join(FIELD_NAMES)}")
        checked = {name: _CHECKS[name](name, value) for name, value in changes.items()}
        copy = object.__new__(Controls)
        for name in FIELD_NAMES:
            object.__setattr__(copy, name, checked[name] if name in checked else getattr(self, name))
        return copy

    def to_dict(self) -> dict[str, Any]:
        """The controls as JSON-ready values (tuples become lists)."""
        return {name: _jsonable(getattr(self, name)) for name in FIELD_NAMES}

    def changed(self, other: Controls) -> tuple[str, ...]:
        """Names of the fields whose values differ from ``other``'s."""
        return tuple(name for name in FIELD_NAMES if getattr(self, name) != getattr(other, name))

    def emotion_rows(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The emotion as the (m,8) table the condition builder cycles through."""
        if _is_table(self.emotion):
            return torch.tensor(self.emotion, dtype=torch.float32, device=device)
        return emotion_table(self.emotion, device)


# -- validation: each returns the field's normalised (immutable) value or raises ControlError ------------------------


def _shown(value: Any) -> str:
    """``value`` for a message, cut short (a JSON number can have thousands of digits, a table megabytes)."""
    try:
        text = repr(value)
    except ValueError:
        return "an integer of over 4300 digits"
    return text if len(text) <= 60 else f"{text[:57]}..."


def _number(name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ControlError(f"{name} must be a number, got {_shown(value)}")
    try:
        value = float(value)
    except OverflowError:
        raise ControlError(f"{name} must be within [{lo:g}, {hi:g}], got a number too large for a float") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise ControlError(f"{name} must be within [{lo:g}, {hi:g}], got {value!r}")
    return value


def _degrees(name: str, value: Any) -> float:
    return _number(name, value, -MAX_POSE_DEGREES, MAX_POSE_DEGREES)


def _scale(name: str, value: Any) -> float:
    return _number(name, value, 0.0, MAX_POSE_SCALE)


def _unit(name: str, value: Any) -> float:
    return _number(name, value, 0.0, 1.0)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_FRAMES:
        raise ControlError(
            f"{name} must be a whole number of frames in [0, {MAX_FRAMES}] (an hour at 25 fps), got {_shown(value)}"
        )
    return int(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ControlError(f"{name} must be true or false, got {_shown(value)}")
    return bool(value)


def _within(name: str, value: Any, limit: int, what: str) -> None:
    """ControlError if ``value`` (an array or nested lists) holds more than ``limit`` values (counting no further) or
    true/false where numbers go (numpy would take them as 1 and 0)."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        values, lists = value.numel() if isinstance(value, torch.Tensor) else value.size, 0
        flags = value.dtype in (torch.bool, np.bool_)
    else:
        values, lists, flags, pending = 0, 0, False, [value]
        while pending and values <= limit and lists <= limit:
            item = pending.pop()
            if isinstance(item, (list, tuple)):
                lists += 1
                if len(item) > limit - values:
                    values = limit + 1
                else:
                    pending.extend(item)
            else:
                values += 1
                flags = flags or isinstance(item, (bool, np.bool_))
    if values > limit or lists > limit:
        raise ControlError(f"{name} must be {what}; it holds more than {limit} values")
    if flags:
        raise ControlError(f"{name} must be {what} of numbers; it holds true or false")


def _array(name: str, value: Any, what: str, limit: int) -> np.ndarray:
    """Any array-like (lists, numpy, torch) of at most ``limit`` finite numbers -> float64 ndarray, or ControlError."""
    _within(name, value, limit, what)
    try:
        array = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ControlError(f"{name} must be {what} of numbers: {exc}") from exc
    if not np.isfinite(array).all():
        raise ControlError(f"{name} holds NaN or infinite values")
    if array.size and np.abs(array).max() > MAX_TABLE_VALUE:
        raise ControlError(f"{name} holds a value beyond ±{MAX_TABLE_VALUE:g}: {np.abs(array).max():g}")
    return array


def _matrix(name: str, value: Any, width: int, rows: int, what: str) -> tuple[tuple[float, ...], ...]:
    """A 2-D array-like of at most ``rows`` rows of ``width`` values -> tuple of row tuples."""
    array = _array(name, value, f"{what}, at most {rows} rows of {width}", rows * width)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] != width:
        raise ControlError(f"{name} must be {what}, got shape {array.shape}")
    return tuple(tuple(float(v) for v in row) for row in array)


def _expression(name: str, value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    what = f"{EXPRESSION_DIM} values (21 keypoints × xyz)"
    array = _array(name, value, what, EXPRESSION_DIM)
    if array.size != EXPRESSION_DIM or array.ndim not in (1, 2):
        raise ControlError(f"{name} must be {what}, got shape {array.shape}")
    return tuple(float(v) for v in array.reshape(-1))


def _blink_table(name: str, value: Any) -> tuple[tuple[float, ...], ...] | None:
    return (
        None
        if value is None
        else _matrix(name, value, EXPRESSION_DIM, MAX_BLINK_ROWS, f"a (K,{EXPRESSION_DIM}) table, K ≥ 1")
    )


def _clip_range(name: str, value: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    if value is None:
        return None
    what = f"(2,{MOTION_DIM}) rows of min and max (more rows are ignored, as the reference does)"
    rows = _matrix(name, value, MOTION_DIM, MAX_CLIP_ROWS, what)
    if len(rows) < 2:
        raise ControlError(f"{name} needs two rows, min and max, of {MOTION_DIM} values; got one")
    low, high = np.array(rows[0]), np.array(rows[1])
    if (low > high).any():
        raise ControlError(f"{name}: min exceeds max in dims {np.flatnonzero(low > high)[:8].tolist()}")
    return rows[0], rows[1]


def _blink_gaps(name: str, value: Any) -> int | tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            raise ControlError(
                f"{name} must be 0 (random 60–100 frames), a gap > 0 or a list of gaps; to stop blinking set blink to "
                "false"
            )
        if value > MAX_FRAMES:
            raise ControlError(f"{name} must be at most {MAX_FRAMES} frames (an hour at 25 fps), got {_shown(value)}")
        return int(value)
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        if len(value) > MAX_GAPS:
            raise ControlError(f"{name} holds {len(value)} gaps; at most {MAX_GAPS} (the list is cycled)")
        gaps = tuple(_count(name, gap) for gap in value)
        if min(gaps) < 1:
            raise ControlError(f"{name}: every gap in a list must be at least 1 frame, got {_shown(list(gaps))}")
        return gaps
    raise ControlError(f"{name} must be 0, a number of frames or a non-empty list of them, got {_shown(value)}")


def _fade_target(name: str, value: Any) -> str:
    if not isinstance(value, str) or value not in FADE_TARGETS:
        raise ControlError(f"{name} must be one of {', '.join(FADE_TARGETS)}, got {_shown(value)}")
    return value


def _fade_keys(name: str, value: Any) -> tuple[str, ...]:
    sized = isinstance(value, Sequence) and len(value) <= len(MOTION_KEYS)
    keys = (value,) if isinstance(value, str) else tuple(value) if sized else None
    if not keys or any(not isinstance(k, str) or k not in MOTION_KEYS for k in keys) or len(set(keys)) != len(keys):
        raise ControlError(
            f"{name} must list distinct motion parts among {', '.join(MOTION_KEYS)}, got {_shown(value)}"
        )
    return keys


def _kp_dims(name: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        start, stop = value
        if (
            all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop))
            and 0 <= start < stop <= MOTION_DIM
        ):
            return int(start), int(stop)
    raise ControlError(f"{name} must be [start, stop) with 0 ≤ start < stop ≤ {MOTION_DIM}, got {_shown(value)}")


def _label(name: str, value: Any) -> Label:
    try:
        index = emotion_index(
            value.lower() if isinstance(value, str) else int(value) if isinstance(value, np.integer) else value
        )
    except ValueError as exc:
        raise ControlError(f"{name}: {exc}") from exc
    return EMOTIONS[index] if isinstance(value, str) else index


def _emotion(name: str, value: Any) -> EmotionSpec:
    table = f"an (m,{EMOTION_DIM}) table"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return _matrix(name, value, EMOTION_DIM, MAX_EMOTION_ROWS, table)
    if isinstance(value, (str, int, np.integer)) and not isinstance(value, bool):
        return _label(name, value)
    if not isinstance(value, Sequence) or not value:
        raise ControlError(
            f"{name} must be a name ({', '.join(EMOTIONS)}), an index 0..7, or a non-empty list, got {_shown(value)}"
        )
    if len(value) > MAX_EMOTION_ROWS:
        raise ControlError(
            f"{name} holds {len(value)} rows; at most {MAX_EMOTION_ROWS} (a table row or label set per frame, cycled)"
        )
    rows = list(value)
    if all(isinstance(row, Sequence) and not isinstance(row, str) for row in rows):
        if all(len(row) == EMOTION_DIM for row in rows):
            return _matrix(name, rows, EMOTION_DIM, MAX_EMOTION_ROWS, table)
        if any(len(row) == EMOTION_DIM for row in rows):
            raise ControlError(
                f"{name}: rows of {EMOTION_DIM} values are a probability table and shorter rows label sets; do not "
                "mix them"
            )
        return tuple(_label_set(name, row) for row in rows)
    return _label_set(name, rows)


def _label_set(name: str, labels: Sequence[Any]) -> tuple[Label, ...]:
    if not 0 < len(labels) < EMOTION_DIM:
        raise ControlError(f"{name}: a label set holds 1 to {EMOTION_DIM - 1} labels, got {_shown(list(labels))}")
    return tuple(_label(name, label) for label in labels)


def _is_table(emotion: EmotionSpec) -> bool:
    return isinstance(emotion, tuple) and isinstance(emotion[0], tuple) and isinstance(emotion[0][0], float)


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value


_CHECKS = {
    "pitch": _degrees,
    "yaw": _degrees,
    "roll": _degrees,
    "pitch_scale": _scale,
    "yaw_scale": _scale,
    "roll_scale": _scale,
    "expression": _expression,
    "vad_alpha": _unit,
    "emotion": _emotion,
    "blink": _flag,
    "blink_gaps": _blink_gaps,
    "blink_table": _blink_table,
    "fade_in": _count,
    "fade_out": _count,
    "fade_target": _fade_target,
    "fade_keys": _fade_keys,
    "clip_range": _clip_range,
    "fix_kp_cond": _count,
    "fix_kp_cond_dims": _kp_dims,
}
FIELD_NAMES = tuple(field.name for field in dataclasses.fields(Controls))


def check_changes(changes: Any) -> dict[str, Any]:
    """A client's controls (a JSON object: control name -> value) checked and normalised to plain JSON values before
    they cross a process: only control names (never ``self`` or a non-string), every value within its range."""
    if not isinstance(changes, Mapping):
        fields = ", ".join(FIELD_NAMES)
        raise ControlError(f"controls are a JSON object of control fields ({fields}), got {_shown(changes)}")
    unknown = [name for name in changes if not isinstance(name, str) or name not in FIELD_NAMES]
    if unknown:
        shown = ", ".join(n if isinstance(n, str) and n.isidentifier() else _shown(n) for n in unknown[:8])
        raise ControlError(f"unknown control(s) {shown}; controls are: {', '.join(FIELD_NAMES)}")
    applied = Controls().replace(**changes)
    return {name: _jsonable(getattr(applied, name)) for name in changes}


def stitch_controls(controls: Controls, device: torch.device | str | None = None) -> StitchControls:
    """The frame controls as the stitcher's device-side values."""
    exp = None if controls.expression is None else torch.tensor(controls.expression, dtype=torch.float32, device=device)
    clip = (
        None if controls.clip_range is None else torch.tensor(controls.clip_range, dtype=torch.float32, device=device)
    )
    return StitchControls(
        pose_offset=(controls.pitch, controls.yaw, controls.roll),
        pose_scale=(controls.pitch_scale, controls.yaw_scale, controls.roll_scale),
        exp_offset=exp,
        vad_alpha=controls.vad_alpha,
        clip=clip,
    )
