"""Motion stitching: LMDM motion -> source and driving keypoints for the warp network, batched over frames.

Per frame, in the reference's order: the motion clip range, relative motion against an anchor frame
(in pose-logit space), the expression mask (lips, and eyes unless a blink table drives them, from the
LMDM; the rest from the avatar), mouth damping, head-pose and expression offsets, an optional fade
towards a target, the gaze fix, the keypoint transform, and the stitching network. A head-pose axis
that a control moves is carried in degrees from there on (as the reference's ``ctrl_motion`` does);
untouched axes stay logits, so default controls compute exactly what no controls do.

Everything up to the keypoint transform is per session (``MotionStitcher.pose``); the transform and
the stitching network are plain functions of each frame, so ``stitch_posed`` runs them for several
sessions' frames at once: the runtime's loop launches them once per tick, not once per session.
The per-session steps work on the whole 265-d vector where they can (the relative mix and the
expression mask are one weighted sum, the three pose axes are decoded in one softmax), because the
loop dispatches them for every live session every tick.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.motion.keypoints import motion_keypoints, transform_keypoints
from engine.motion.pose import bins_to_degrees, rotation_matrix
from engine.motion.vector import MOTION_DIM, MOTION_KEYS, MOTION_SLICES, NUM_KEYPOINTS, join_motion, split_motion

LIP_KEYPOINTS = (6, 12, 14, 17, 19, 20)
EYE_KEYPOINTS = (11, 13, 15, 16, 18)
DRIVEN_KEYS_IMAGE = ("exp", "pitch", "yaw", "roll", "t")
DRIVEN_KEYS_VIDEO = ("exp",)
SOURCE_KEYS = (*MOTION_KEYS, "kp")
FADE_TARGETS = ("first", "source")
POSE_AXES = ("pitch", "yaw", "roll")

GAZE_YAW_RATIO = 0.26
GAZE_PITCH_RATIO = 0.28
OPEN_FRAMES_RANGE = (60, 100)

StitchFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Motion = dict[str, torch.Tensor]


def keypoint_mask(keypoints: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """(63,) float mask: 1 on the x, y and z of each listed keypoint, 0 elsewhere."""
    mask = torch.zeros(NUM_KEYPOINTS, 3, device=device)
    mask[list(keypoints)] = 1.0
    return mask.flatten()


def expression_weights(
    drive_eye: bool, blink: bool, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (63,) of (the driven expression, the blink delta) in the mixed expression; the avatar's has the rest.

    Lips always come from the LMDM; eyes too when ``drive_eye`` and no blink table, else from
    the avatar (plus the blink delta when ``drive_eye`` and a blink table is given).
    """
    lip = keypoint_mask(LIP_KEYPOINTS, device)
    eye = keypoint_mask(EYE_KEYPOINTS, device)
    driven = lip + eye if drive_eye and not blink else lip
    blink_weight = eye if drive_eye and blink else torch.zeros_like(eye)
    return driven, blink_weight


def drive_weights(driven_keys: Sequence[str], expression: torch.Tensor) -> torch.Tensor:
    """(265,) share of the driving motion per motion dim: 1 on driven keys, ``expression`` (63,) on a driven exp, else
    0.

    The mix is then one sum, source + (driving − anchor)·w: a driven key is the source moved by the relative
    motion (the reference's relative mode), and exp is the source's with the driven keypoints moved.
    """
    weights = torch.zeros(MOTION_DIM, device=expression.device)
    for key in driven_keys:
        weights[MOTION_SLICES[key]] = expression if key == "exp" else 1.0
    return weights


def gaze_weights(device: torch.device | str | None = None) -> torch.Tensor:
    """(3,63) per-degree gaze corrections: rows = yaw turning right (dx>0), yaw turning left, pitch."""
    weights = torch.zeros(3, 3 * NUM_KEYPOINTS, device=device)
    weights[0, 33], weights[0, 45] = 0.0007, 0.001
    weights[1, 33], weights[1, 45] = 0.001, 0.0007
    weights[2, 34], weights[2, 46] = -0.001, -0.001
    return weights


def gaze_delta(yaw_delta: torch.Tensor, pitch_delta: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Head-turn differences in degrees (B,) -> expression correction (B,63) moving the eye keypoints 11 and 15."""
    dx = (yaw_delta * GAZE_YAW_RATIO).unsqueeze(-1)
    dy = (pitch_delta * GAZE_PITCH_RATIO).unsqueeze(-1)
    return dx * torch.where(dx > 0, weights[0], weights[1]) + dy * weights[2]


def pose_angle(part: torch.Tensor) -> torch.Tensor:
    """A pose part in degrees (B,): logits (B,66) are decoded, angles (B,) pass through (the reference's
    bin66_to_degree)."""
    return part if part.ndim == 1 else bins_to_degrees(part)


def fade(parts: Motion, target: Motion, alpha: torch.Tensor, keys: Sequence[str]) -> Motion:
    """parts[k]·α + target[k]·(1−α) for the given keys, α (B,) per frame; other keys unchanged.

    A pose part held in degrees on one side is faded in degrees (the other side decoded to match).
    """
    faded = dict(parts)
    for key in keys:
        value, goal = parts[key], target[key]
        if key in POSE_AXES and value.ndim != goal.ndim:
            value, goal = pose_angle(value), pose_angle(goal)
        weight = alpha.reshape(-1, *([1] * (value.ndim - 1)))
        faded[key] = value * weight + goal * (1 - weight)
    return faded


@dataclass(frozen=True)
class StitchControls:
    """The per-frame controls in the stitcher's terms (one session's, vectorised over its frames); defaults change
    nothing."""

    pose_offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Degrees added to pitch, yaw, roll (the reference's delta_pitch/yaw/roll)."""
    pose_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)
    """Multipliers of the angles after the offsets (alpha_pitch/yaw/roll)."""
    exp_offset: torch.Tensor | None = None
    """(63,) added to the expression (delta_exp)."""
    vad_alpha: float = 1.0
    """Mouth damping: exp·α + source exp·(1−α) when α < 1 (vad_alpha)."""
    clip: torch.Tensor | None = None
    """(2,265) per-dimension min and max of the driving motion and its anchor (v_min_max_for_clip)."""


def control_motion(parts: Motion, source_exp: torch.Tensor, controls: StitchControls) -> Motion:
    """Mouth damping (towards ``source_exp``), then head-pose offsets and scales (moved axes become degrees (B,)),
    then the expression offset."""
    parts = dict(parts)
    if controls.vad_alpha < 1:
        parts["exp"] = parts["exp"] * controls.vad_alpha + source_exp * (1 - controls.vad_alpha)
    for axis, offset, scale in zip(POSE_AXES, controls.pose_offset, controls.pose_scale):
        if offset != 0.0 or scale != 1.0:
            parts[axis] = (pose_angle(parts[axis]) + offset) * scale
    if controls.exp_offset is not None:
        parts["exp"] = parts["exp"] + controls.exp_offset
    return parts


def pose_angles(parts: Motion) -> torch.Tensor:
    """Pitch, yaw, roll in degrees (B,3): logits decoded in one softmax when none is in degrees yet."""
    axes = [parts[axis] for axis in POSE_AXES]
    if all(axis.ndim == 2 for axis in axes):
        return bins_to_degrees(torch.stack(axes, dim=-2))
    return torch.stack([pose_angle(axis) for axis in axes], dim=-1)


@dataclass(frozen=True)
class Posed:
    """One call's frames after every per-session step, each part with one row per frame."""

    parts: Motion
    """exp (B,63), scale (B,1), t (B,3)."""
    angles: torch.Tensor
    """(B,3) pitch, yaw, roll in degrees."""
    kp: torch.Tensor
    """(B,63) canonical keypoints of each frame's avatar row."""
    x_s: torch.Tensor
    """(B,21,3) the source keypoints of each frame's avatar row."""


def stitch_posed(batch: Sequence[Posed], stitch: StitchFn | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Several calls' frames -> (x_s, x_d) of all of them, in call order: one keypoint transform and one
    stitching-network call for all (the runtime renders them as they are; split by the calls' sizes for each one's)."""
    joined = {key: join_frames([posed.parts[key] for posed in batch]) for key in ("exp", "scale", "t")}
    angles = join_frames([posed.angles for posed in batch])
    x_s = join_frames([posed.x_s for posed in batch])
    kp = join_frames([posed.kp for posed in batch])
    x_d = transform_keypoints(kp, rotation_matrix(*angles.unbind(-1)), joined["exp"], joined["scale"], joined["t"])
    if stitch is not None:
        x_d = stitch(x_s, x_d)
    return x_s, x_d


def _rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``table[rows]``; a one-frame avatar's single row as it is (it broadcasts), saving the loop an index per call."""
    return table if table.shape[0] == 1 else table[rows]


def join_frames(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parts concatenated along frames (the first axis); one part as it is (a single session's copies nothing)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def fade_alphas(
    frame_index: torch.Tensor, fade_in: int = 0, fade_out: int = 0, total_frames: int | None = None
) -> torch.Tensor:
    """Fade weight per output frame (B,): i/fade_in over the first frames, falling to 0 over the last fade_out+1, else
    1."""
    index = frame_index.to(torch.float32)
    alpha = torch.ones_like(index)
    if fade_in > 0:
        alpha = torch.where(index < fade_in, index / fade_in, alpha)
    if fade_out > 0:
        if total_frames is None:
            raise ValueError("a fade-out needs total_frames (the stream's length in frames)")
        last = total_frames - 1
        alpha = torch.where(index >= last - fade_out, ((last - index) / fade_out).clamp(min=0.0), alpha)
    return alpha


def blink_schedule(
    n_frames: int, blink_frames: int, open_frames: int | Sequence[int] = 0, rng: random.Random | None = None
) -> torch.Tensor:
    """Per-frame row of a blink table (n_frames,) int64: 0 while open, 0..blink_frames-1 during a blink.

    ``open_frames``: < 0 never blink; 0 random open gaps of 60–100 frames; n > 0 fixed gaps;
    a sequence: gaps cycled from it (its first entry before the first blink).
    """
    schedule = torch.zeros(n_frames, dtype=torch.int64)
    if isinstance(open_frames, int):
        if open_frames < 0:
            return schedule
        gaps = [open_frames] if open_frames > 0 else []
    else:
        gaps = list(open_frames)
        if not gaps:
            raise ValueError("open_frames as a sequence must list at least one gap")
    rng = rng or random.Random(0)

    def gap(i: int) -> int:
        return gaps[i % len(gaps)] if gaps else rng.randint(*OPEN_FRAMES_RANGE)

    first = gap(0)
    last = gaps[-1] if gaps else rng.randint(*OPEN_FRAMES_RANGE)
    stop = n_frames - max(last, blink_frames)
    start, count = first, 1
    while start < stop:
        end = min(start + blink_frames, n_frames)
        schedule[start:end] = torch.arange(end - start)
        start += blink_frames + gap(count)
        count += 1
    return schedule


class MotionStitcher:
    """Per-session stitching state; ``__call__`` turns a batch of consecutive LMDM frames into (x_s, x_d)."""

    def __init__(
        self,
        source: Motion,
        *,
        stitch: StitchFn | None,
        driven_keys: Sequence[str] = DRIVEN_KEYS_IMAGE,
        drive_eye: bool = True,
        relative: bool = True,
        blink_table: torch.Tensor | None = None,
        blink_indices: torch.Tensor | None = None,
        fade_target: str | None = None,
        fade_keys: Sequence[str] = ("exp",),
        controls: StitchControls | None = None,
    ) -> None:
        """``source``: the avatar's motion per avatar frame (N,·) with keys pitch/yaw/roll (N,66), t (N,3),
        exp (N,63), scale (N,1), kp (N,63). ``stitch``: the stitching network (None skips it).
        ``blink_table`` (K,63) with ``blink_indices`` (n,) from ``blink_schedule`` replaces the driven eyes.
        ``fade_target``: "first" (the first stitched frame) or "source" (the avatar), used with ``fade_alpha``.
        ``controls``: the per-frame controls (changeable between calls through the attribute).
        """
        missing = [k for k in SOURCE_KEYS if k not in source]
        if missing:
            raise ValueError(f"source motion lacks {missing}; the avatar must provide {list(SOURCE_KEYS)}")
        unknown = [k for k in driven_keys if k not in MOTION_KEYS]
        if unknown:
            raise ValueError(f"unknown motion keys {unknown}; choose from {list(MOTION_KEYS)}")
        self.source = {k: source[k].reshape(source[k].shape[0], -1) for k in SOURCE_KEYS}
        self.source_vector = join_motion(self.source)
        self.stitch = stitch
        self.driven_keys = tuple(driven_keys)
        self.drive_eye = drive_eye
        self.relative = relative
        device = self.source["exp"].device
        self.gaze = gaze_weights(device)
        self.first_row = torch.zeros(1, dtype=torch.int64, device=device)
        self.source_keypoints = motion_keypoints(self.source, self.source["kp"])
        self.source_yaw = bins_to_degrees(self.source["yaw"][0])
        self.source_pitch = bins_to_degrees(self.source["pitch"][0])
        self.controls = controls or StitchControls()
        self.anchor: torch.Tensor | None = None
        self.first: Motion | None = None
        self.frames_done = 0
        self.set_blinks(blink_table, blink_indices)
        self.set_fade(fade_target, fade_keys)

    def set_blinks(self, table: torch.Tensor | None, indices: torch.Tensor | None) -> None:
        """Blink with ``table`` (K,63) rows picked by ``indices`` (n,) at frame ``frames_done % n`` (None, None: no
        blinks)."""
        if (table is None) != (indices is None):
            raise ValueError("blink_table and blink_indices go together: pass both or neither")
        self.blink_table = table
        self.blink_indices = indices
        expression, self.blink_weight = expression_weights(self.drive_eye, table is not None, self.source["exp"].device)
        self.drive = drive_weights(self.driven_keys, expression)

    def set_fade(self, target: str | None, keys: Sequence[str] = ("exp",)) -> None:
        """Fade ``keys`` towards ``target`` ("first", "source" or None) by the ``fade_alpha`` of each call."""
        if target is not None and target not in FADE_TARGETS:
            raise ValueError(f"fade_target must be one of {FADE_TARGETS} or None, got {target!r}")
        unknown = [k for k in keys if k not in MOTION_KEYS]
        if unknown:
            raise ValueError(f"unknown motion keys {unknown}; choose from {list(MOTION_KEYS)}")
        self.fade_target = target
        self.fade_keys = tuple(keys)

    def set_anchor(self, motion: torch.Tensor) -> None:
        """Use this 265-d motion vector as the relative-motion anchor d0 (else the first stitched frame is)."""
        self.anchor = motion.reshape(1, MOTION_DIM)

    def __call__(
        self,
        driving: torch.Tensor,
        source_index: torch.Tensor | None = None,
        fade_alpha: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Consecutive motion frames (B,265) -> (x_s, x_d), each (B,21,3).

        ``source_index`` (B,) int64 picks the avatar frame per output frame (None: frame 0);
        ``fade_alpha`` (B,) fades ``fade_keys`` towards the fade target (1 = no fade).
        """
        return stitch_posed([self.pose(driving, source_index, fade_alpha)], self.stitch)

    def pose(
        self,
        driving: torch.Tensor,
        source_index: torch.Tensor | None = None,
        fade_alpha: torch.Tensor | None = None,
    ) -> Posed:
        """The per-session steps of ``__call__`` (same arguments); ``stitch_posed`` finishes them, with other
        sessions'."""
        if driving.ndim != 2 or driving.shape[1] != MOTION_DIM:
            raise ValueError(f"driving motion must be (B,{MOTION_DIM}), got shape {tuple(driving.shape)}")
        batch = driving.shape[0]
        controls = self.controls
        rows = source_index if source_index is not None else self.first_row
        if self.relative and self.anchor is None:
            self.anchor = driving[:1].clone()
        anchor = self.anchor
        if controls.clip is not None:
            driving = driving.clamp(controls.clip[0], controls.clip[1])
            anchor = anchor.clamp(controls.clip[0], controls.clip[1]) if anchor is not None else None
        source = _rows(self.source_vector, rows)
        mixed = source + (driving - (anchor if self.relative else source)) * self.drive
        if self.blink_table is not None:
            frame = torch.arange(self.frames_done, self.frames_done + batch, device=driving.device)
            mixed[:, MOTION_SLICES["exp"]] += (
                self.blink_table[self.blink_indices[frame % self.blink_indices.shape[0]]] * self.blink_weight
            )
        parts = control_motion(split_motion(mixed), source[:, MOTION_SLICES["exp"]], controls)
        if self.fade_target == "first" and self.first is None:
            self.first = {k: v[:1].clone() for k, v in parts.items()}
        if fade_alpha is not None and self.fade_target is not None:
            target = self.first if self.fade_target == "first" else split_motion(source)
            parts = fade(parts, target, fade_alpha, self.fade_keys)
        angles = pose_angles(parts)
        if self.drive_eye:
            parts["exp"] = parts["exp"] + gaze_delta(
                angles[:, 1] - self.source_yaw, angles[:, 0] - self.source_pitch, self.gaze
            )
        self.frames_done += batch
        kp = _rows(self.source["kp"], rows).expand(batch, 3 * NUM_KEYPOINTS)
        x_s = _rows(self.source_keypoints, rows).expand(batch, NUM_KEYPOINTS, 3)
        return Posed({key: parts[key] for key in ("exp", "scale", "t")}, angles, kp, x_s)
