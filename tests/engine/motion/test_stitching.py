"""Motion stitching equals a per-frame transcription of Ditto's steps: clip, relative mix, expression mask, mouth
damping,
pose and expression controls, fade, gaze, stitch."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from engine.motion.keypoints import motion_keypoints
from engine.motion.pose import bins_to_degrees
from engine.motion.stitching import (
    DRIVEN_KEYS_IMAGE,
    EYE_KEYPOINTS,
    LIP_KEYPOINTS,
    MotionStitcher,
    StitchControls,
    blink_schedule,
    drive_weights,
    expression_weights,
    fade,
    fade_alphas,
    gaze_delta,
    gaze_weights,
    keypoint_mask,
    stitch_posed,
)
from engine.motion.vector import MOTION_KEYS, MOTION_SLICES, join_motion, split_motion

WIDTHS = {"scale": 1, "pitch": 66, "yaw": 66, "roll": 66, "t": 3, "exp": 63}


def _motion(generator: torch.Generator, n: int, with_kp: bool = False) -> dict[str, torch.Tensor]:
    parts = {k: torch.randn(n, w, generator=generator) for k, w in WIDTHS.items()}
    parts["exp"] = parts["exp"] * 0.05
    parts["scale"] = 1 + 0.2 * torch.rand(n, 1, generator=generator)
    if with_kp:
        parts["kp"] = torch.randn(n, 63, generator=generator) * 0.3
    return parts


def _coords(keypoints) -> list[int]:
    return sorted(3 * k + c for k in keypoints for c in range(3))


def _degrees(logits: np.ndarray) -> float:
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return float((p * np.arange(66)).sum() * 3 - 97.5)


def _transform(m: dict[str, np.ndarray], kp: np.ndarray) -> np.ndarray:
    x, y, z = (math.radians(_degrees(m[k])) for k in ("pitch", "yaw", "roll"))
    rx = np.array([[1, 0, 0], [0, math.cos(x), -math.sin(x)], [0, math.sin(x), math.cos(x)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(z), -math.sin(z), 0], [math.sin(z), math.cos(z), 0], [0, 0, 1]])
    out = (kp.reshape(21, 3) @ (rz @ ry @ rx).T + m["exp"].reshape(21, 3)) * m["scale"][0]
    out[:, :2] += m["t"][:2]
    return out


def reference_frame(
    src, drv, d0, src0, driven_keys, drive_eye, blink_delta=None, alpha=None, fade_dst=None, stitch=None
):
    """Facts §4 steps 2, 3, 6, 7, 8, 9 for one frame, in numpy."""
    x = {k: src[k] + (drv[k] - d0[k]) if k in driven_keys else src[k].copy() for k in MOTION_KEYS}
    lip, eye = np.zeros(63), np.zeros(63)
    lip[_coords(LIP_KEYPOINTS)] = 1
    eye[_coords(EYE_KEYPOINTS)] = 1
    if drive_eye and blink_delta is None:
        x["exp"] = x["exp"] * (lip + eye) + src["exp"] * (1 - lip - eye)
    elif drive_eye:
        x["exp"] = x["exp"] * lip + src["exp"] * (1 - lip) + blink_delta * eye
    else:
        x["exp"] = x["exp"] * lip + src["exp"] * (1 - lip)
    if alpha is not None:
        x["exp"] = x["exp"] * alpha + fade_dst["exp"] * (1 - alpha)
    if drive_eye:
        dx = (_degrees(x["yaw"]) - _degrees(src0["yaw"])) * 0.26
        dy = (_degrees(x["pitch"]) - _degrees(src0["pitch"])) * 0.28
        x["exp"] = x["exp"].copy()
        x["exp"][33] += dx * (0.0007 if dx > 0 else 0.001)
        x["exp"][45] += dx * (0.001 if dx > 0 else 0.0007)
        x["exp"][34] += -0.001 * dy
        x["exp"][46] += -0.001 * dy
    x_s, x_d = _transform(src, src["kp"]), _transform(x, src["kp"])
    if stitch is not None:
        x_d = x_d + 0.1 * x_s
    return x_s, x_d


def toy_stitch(x_s: torch.Tensor, x_d: torch.Tensor) -> torch.Tensor:
    assert x_s.shape == x_d.shape and x_s.shape[1:] == (21, 3)
    return x_d + 0.1 * x_s


def _row(parts: dict[str, torch.Tensor], i: int) -> dict[str, np.ndarray]:
    return {k: v[i].double().numpy() for k, v in parts.items()}


def test_expression_weight_groups() -> None:
    lip, eye = _coords(LIP_KEYPOINTS), _coords(EYE_KEYPOINTS)
    driven, blink = expression_weights(drive_eye=True, blink=False)
    assert torch.nonzero(driven).flatten().tolist() == sorted(lip + eye) and not blink.any()
    driven, blink = expression_weights(drive_eye=True, blink=True)
    assert torch.nonzero(driven).flatten().tolist() == lip, "eyes keep the avatar's expression plus the blink delta"
    assert torch.nonzero(blink).flatten().tolist() == eye
    driven, blink = expression_weights(drive_eye=False, blink=True)
    assert torch.nonzero(driven).flatten().tolist() == lip and not blink.any()


def test_drive_weights_move_driven_keys_whole_and_exp_by_its_mask() -> None:
    lip = keypoint_mask(LIP_KEYPOINTS)
    weights = drive_weights(("exp", "yaw"), lip)
    assert torch.equal(weights[MOTION_SLICES["yaw"]], torch.ones(66))
    assert torch.equal(weights[MOTION_SLICES["exp"]], lip)
    assert weights[:67].sum() == 0 and weights[133:202].sum() == 0, "scale, pitch, roll and t stay the avatar's"


def test_gaze_fix_touches_only_eye_keypoints_11_and_15() -> None:
    weights = gaze_weights()
    right = gaze_delta(torch.tensor([10.0]), torch.tensor([0.0]), weights)[0]
    left = gaze_delta(torch.tensor([-10.0]), torch.tensor([0.0]), weights)[0]
    up = gaze_delta(torch.tensor([0.0]), torch.tensor([5.0]), weights)[0]
    assert torch.nonzero(right).flatten().tolist() == [33, 45]
    assert right[33].item() == pytest.approx(2.6 * 0.0007) and right[45].item() == pytest.approx(2.6 * 0.001)
    assert left[33].item() == pytest.approx(-2.6 * 0.001) and left[45].item() == pytest.approx(-2.6 * 0.0007)
    assert torch.nonzero(up).flatten().tolist() == [34, 46] and up[34].item() == pytest.approx(-1.4 * 0.001)


def test_fade_alphas_ramp_in_and_out() -> None:
    alphas = fade_alphas(torch.arange(10), fade_in=4, fade_out=4, total_frames=10)
    torch.testing.assert_close(alphas, torch.tensor([0, 0.25, 0.5, 0.75, 1, 1, 0.75, 0.5, 0.25, 0]))
    torch.testing.assert_close(fade_alphas(torch.arange(3)), torch.ones(3))
    with pytest.raises(ValueError, match="total_frames"):
        fade_alphas(torch.arange(3), fade_out=2)


def test_blink_schedule_places_blinks_between_open_gaps() -> None:
    fixed = blink_schedule(20, blink_frames=3, open_frames=5)
    assert fixed.tolist() == [0] * 5 + [0, 1, 2] + [0] * 5 + [0, 1, 2] + [0] * 4
    assert not blink_schedule(50, 3, open_frames=-1).any()
    first, second = (blink_schedule(400, 15, 0, random.Random(7)) for _ in range(2))
    assert torch.equal(first, second) and int(first.max()) == 14
    assert 60 <= int(torch.nonzero(first).flatten()[0]) - 1 <= 100


def test_image_stitching_equals_the_per_frame_transcription() -> None:
    g = torch.Generator().manual_seed(0)
    source = _motion(g, 1, with_kp=True)
    anchor, driving = _motion(g, 1), _motion(g, 6)
    table = torch.randn(4, 63, generator=g) * 0.01
    schedule = torch.tensor([0, 0, 1, 2, 3])
    alphas = torch.tensor([0.0, 0.5, 1.0, 1.0, 0.25, 1.0])
    stitcher = MotionStitcher(
        source, stitch=toy_stitch, blink_table=table, blink_indices=schedule, fade_target="source"
    )
    stitcher.set_anchor(join_motion(anchor)[0])
    vectors = join_motion(driving)
    outputs = [stitcher(vectors[:4], fade_alpha=alphas[:4]), stitcher(vectors[4:], fade_alpha=alphas[4:])]
    x_s, x_d = (torch.cat(parts) for parts in zip(*outputs))
    src, d0 = _row(source, 0), _row(anchor, 0)
    for i in range(6):
        ref_s, ref_d = reference_frame(
            src,
            _row(driving, i),
            d0,
            src,
            ("exp", "pitch", "yaw", "roll", "t"),
            True,
            blink_delta=table[schedule[i % 5]].double().numpy(),
            alpha=float(alphas[i]),
            fade_dst=src,
            stitch=True,
        )
        np.testing.assert_allclose(x_s[i].numpy(), ref_s, atol=2e-5)
        np.testing.assert_allclose(x_d[i].numpy(), ref_d, atol=2e-5)


def test_video_stitching_uses_each_avatar_frame_and_drives_only_exp() -> None:
    g = torch.Generator().manual_seed(1)
    source = _motion(g, 3, with_kp=True)
    driving = _motion(g, 4)
    index = torch.tensor([0, 1, 2, 2])
    stitcher = MotionStitcher(source, stitch=None, driven_keys=("exp",), drive_eye=False)
    x_s, x_d = stitcher(join_motion(driving), source_index=index)
    d0 = _row(driving, 0)
    for i in range(4):
        ref_s, ref_d = reference_frame(_row(source, int(index[i])), _row(driving, i), d0, None, ("exp",), False)
        np.testing.assert_allclose(x_s[i].numpy(), ref_s, atol=2e-5)
        np.testing.assert_allclose(x_d[i].numpy(), ref_d, atol=2e-5)


def test_driving_equal_to_the_anchor_reproduces_the_avatar() -> None:
    g = torch.Generator().manual_seed(2)
    source = _motion(g, 1, with_kp=True)
    vector = join_motion(_motion(g, 1)).expand(3, -1)
    x_s, x_d = MotionStitcher(source, stitch=None)(vector)
    torch.testing.assert_close(x_d, x_s, atol=1e-6, rtol=0)


def test_misconfiguration_is_a_clear_error() -> None:
    source = _motion(torch.Generator().manual_seed(3), 1, with_kp=True)
    with pytest.raises(ValueError, match="kp"):
        MotionStitcher({k: v for k, v in source.items() if k != "kp"}, stitch=None)
    with pytest.raises(ValueError, match="fade_target"):
        MotionStitcher(source, stitch=None, fade_target="d1")
    with pytest.raises(ValueError, match="together"):
        MotionStitcher(source, stitch=None, blink_table=torch.zeros(2, 63))
    with pytest.raises(ValueError, match="unknown motion keys"):
        MotionStitcher(source, stitch=None, driven_keys=("kp",))
    with pytest.raises(ValueError, match="265"):
        MotionStitcher(source, stitch=None)(torch.zeros(2, 63))


def test_fade_to_the_first_frame_holds_its_expression() -> None:
    g = torch.Generator().manual_seed(4)
    source = _motion(g, 1, with_kp=True)
    vectors = join_motion(_motion(g, 5))
    stitcher = MotionStitcher(source, stitch=None, driven_keys=("exp",), drive_eye=False, fade_target="first")
    _, opening = stitcher(vectors[:2], fade_alpha=torch.ones(2))
    _, faded = stitcher(vectors[2:], fade_alpha=torch.zeros(3))
    torch.testing.assert_close(faded, opening[:1].expand(3, -1, -1))


# -- per-frame controls: the reference's MotionStitch.__call__ with ctrl kwargs, transcribed per frame ----------------


def _split(vector: np.ndarray) -> dict[str, np.ndarray]:
    parts = {"scale": vector[0:1] + 1, "pitch": vector[1:67], "yaw": vector[67:133], "roll": vector[133:199]}
    return {**parts, "t": vector[199:202], "exp": vector[202:265]}


def _angle(value) -> float:
    return _degrees(value) if np.ndim(value) else float(value)


def reference_controlled(src, drv, d0, ctrl: dict, clip=None, fade_alpha=None, fade_dst=None, blink_delta=None):
    """cvt_fmt's clip, _mix_s_d_info, _fix_exp_for_x_d_info_v2, ctrl_vad, ctrl_motion, fade, _fix_gaze,
    transform_keypoint."""
    if clip is not None:
        drv, d0 = np.clip(drv, clip[0], clip[1]), np.clip(d0, clip[0], clip[1])
    drv, d0 = _split(drv), _split(d0)
    x = {k: src[k] + (drv[k] - d0[k]) if k in DRIVEN_KEYS_IMAGE else src[k].copy() for k in MOTION_KEYS}
    lip, eye = np.zeros(63), np.zeros(63)
    lip[_coords(LIP_KEYPOINTS)] = 1
    eye[_coords(EYE_KEYPOINTS)] = 1
    if blink_delta is None:
        x["exp"] = x["exp"] * (lip + eye) + src["exp"] * (1 - lip - eye)
    else:
        x["exp"] = x["exp"] * lip + src["exp"] * (1 - lip) + blink_delta * eye
    if ctrl.get("vad_alpha", 1) < 1:
        x["exp"] = x["exp"] * ctrl["vad_alpha"] + src["exp"] * (1 - ctrl["vad_alpha"])
    for axis in ("pitch", "yaw", "roll"):
        if f"delta_{axis}" in ctrl:
            x[axis] = _angle(x[axis]) + ctrl[f"delta_{axis}"]
    for axis in ("pitch", "yaw", "roll"):
        if f"alpha_{axis}" in ctrl:
            x[axis] = x[axis] * ctrl[f"alpha_{axis}"]
    if "delta_exp" in ctrl:
        x["exp"] = x["exp"] + ctrl["delta_exp"]
    if fade_alpha is not None:
        for k in ("exp", "pitch"):
            goal = fade_dst[k] if np.ndim(x[k]) == np.ndim(fade_dst[k]) else _angle(fade_dst[k])
            x[k] = (x[k] if np.ndim(x[k]) == np.ndim(goal) else _angle(x[k])) * fade_alpha + goal * (1 - fade_alpha)
    dx = (_angle(x["yaw"]) - _angle(src["yaw"])) * 0.26
    dy = (_angle(x["pitch"]) - _angle(src["pitch"])) * 0.28
    x["exp"] = x["exp"].copy()
    x["exp"][33] += dx * (0.0007 if dx > 0 else 0.001)
    x["exp"][45] += dx * (0.001 if dx > 0 else 0.0007)
    x["exp"][34] += -0.001 * dy
    x["exp"][46] += -0.001 * dy
    p, y, r = (math.radians(_angle(x[k])) for k in ("pitch", "yaw", "roll"))
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    out = (src["kp"].reshape(21, 3) @ (rz @ ry @ rx).T + x["exp"].reshape(21, 3)) * x["scale"][0]
    out[:, :2] += x["t"][:2]
    return out


def _controlled_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    source = _motion(g, 1, with_kp=True)
    return source, join_motion(_motion(g, 1))[0], join_motion(_motion(g, 4)), _row(source, 0)


@pytest.mark.parametrize(
    "controls, ctrl",
    [
        (StitchControls(pose_offset=(12.0, -7.5, 3.0)), {"delta_pitch": 12.0, "delta_yaw": -7.5, "delta_roll": 3.0}),
        (
            StitchControls(pose_offset=(5.0, 0.0, 0.0), pose_scale=(0.5, 1.0, 1.0)),
            {"delta_pitch": 5.0, "alpha_pitch": 0.5},
        ),
        (StitchControls(pose_scale=(1.0, 0.0, 1.0)), {"delta_yaw": 0.0, "alpha_yaw": 0.0}),
        (StitchControls(vad_alpha=0.3), {"vad_alpha": 0.3}),
        (StitchControls(vad_alpha=0.0, pose_offset=(0.0, 20.0, 0.0)), {"vad_alpha": 0.0, "delta_yaw": 20.0}),
    ],
)
def test_pose_offsets_scales_and_mouth_damping_follow_the_reference(controls: StitchControls, ctrl: dict) -> None:
    source, anchor, driving, src = _controlled_case(5)
    stitcher = MotionStitcher(source, stitch=None, controls=controls)
    stitcher.set_anchor(anchor)
    _, x_d = stitcher(driving)
    for i in range(4):
        expected = reference_controlled(src, driving[i].double().numpy(), anchor.double().numpy(), ctrl)
        np.testing.assert_allclose(x_d[i].numpy(), expected, atol=2e-5)


def test_an_expression_offset_moves_each_keypoint_by_scale_times_the_offset() -> None:
    source, anchor, driving, _ = _controlled_case(6)
    offset = torch.randn(63, generator=torch.Generator().manual_seed(9)) * 0.02
    plain = MotionStitcher(source, stitch=None, drive_eye=False)
    moved = MotionStitcher(source, stitch=None, drive_eye=False, controls=StitchControls(exp_offset=offset))
    for stitcher in (plain, moved):
        stitcher.set_anchor(anchor)
    difference = moved(driving)[1] - plain(driving)[1]
    expected = source["scale"][0] * offset.reshape(1, 21, 3)
    torch.testing.assert_close(difference, expected.expand(4, 21, 3), atol=1e-6, rtol=1e-5)


def test_the_clip_range_bounds_the_motion_and_its_anchor_before_anything_else() -> None:
    source, anchor, driving, src = _controlled_case(7)
    g = torch.Generator().manual_seed(8)
    low = -torch.rand(265, generator=g) * 0.5
    high = torch.rand(265, generator=g) * 0.5
    table = torch.randn(3, 63, generator=g) * 0.01
    schedule = torch.tensor([0, 1, 2, 0])
    stitcher = MotionStitcher(
        source,
        stitch=None,
        blink_table=table,
        blink_indices=schedule,
        controls=StitchControls(clip=torch.stack([low, high]), pose_offset=(0.0, 4.0, 0.0)),
    )
    stitcher.set_anchor(anchor)
    _, x_d = stitcher(driving)
    clip = (low.double().numpy(), high.double().numpy())
    for i in range(4):
        expected = reference_controlled(
            src,
            driving[i].double().numpy(),
            anchor.double().numpy(),
            {"delta_yaw": 4.0},
            clip=clip,
            blink_delta=table[schedule[i]].double().numpy(),
        )
        np.testing.assert_allclose(x_d[i].numpy(), expected, atol=2e-5)


def test_a_fade_of_a_moved_axis_blends_angles_with_the_avatars() -> None:
    source, anchor, driving, src = _controlled_case(10)
    alphas = torch.tensor([0.0, 0.25, 0.5, 1.0])
    stitcher = MotionStitcher(
        source,
        stitch=None,
        fade_target="source",
        fade_keys=("exp", "pitch"),
        controls=StitchControls(pose_offset=(8.0, 0.0, 0.0)),
    )
    stitcher.set_anchor(anchor)
    _, x_d = stitcher(driving, fade_alpha=alphas)
    for i in range(4):
        expected = reference_controlled(
            src,
            driving[i].double().numpy(),
            anchor.double().numpy(),
            {"delta_pitch": 8.0},
            fade_alpha=float(alphas[i]),
            fade_dst=src,
        )
        np.testing.assert_allclose(x_d[i].numpy(), expected, atol=2e-5)


def test_a_pitch_offset_alone_tilts_the_avatar_by_exactly_that_angle() -> None:
    """Driving equal to the anchor reproduces the avatar; +10° pitch then rotates it by 10° about x (hand-computed)."""
    g = torch.Generator().manual_seed(11)
    source = _motion(g, 1, with_kp=True)
    vector = join_motion(_motion(g, 1)).expand(2, -1)
    _, x_d = MotionStitcher(
        source, stitch=None, drive_eye=False, controls=StitchControls(pose_offset=(10.0, 0.0, 0.0))
    )(vector)
    src = _row(source, 0)
    p = math.radians(_degrees(src["pitch"]) + 10.0)
    y, r = math.radians(_degrees(src["yaw"])), math.radians(_degrees(src["roll"]))
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    expected = (src["kp"].reshape(21, 3) @ (rz @ ry @ rx).T + src["exp"].reshape(21, 3)) * src["scale"][0]
    expected[:, :2] += src["t"][:2]
    np.testing.assert_allclose(x_d[0].numpy(), expected, atol=2e-5)
    np.testing.assert_allclose(x_d[1].numpy(), expected, atol=2e-5)


def test_default_controls_compute_exactly_what_no_controls_did() -> None:
    """The per-key composition (mix, mask, blink, fade, gaze, motion_keypoints on logits) is reproduced to float
    rounding."""
    source, anchor, driving, _ = _controlled_case(12)
    table = torch.randn(2, 63, generator=torch.Generator().manual_seed(1)) * 0.01
    schedule = torch.tensor([0, 1, 1])
    alphas = torch.tensor([0.1, 0.6, 1.0, 0.3])
    stitcher = MotionStitcher(
        source,
        stitch=toy_stitch,
        blink_table=table,
        blink_indices=schedule,
        fade_target="source",
        controls=StitchControls(),
    )
    stitcher.set_anchor(anchor)
    x_s, x_d = stitcher(driving, fade_alpha=alphas)
    frames, src = split_motion(driving), {k: v[[0, 0, 0, 0]] for k, v in stitcher.source.items()}
    anchors = split_motion(anchor[None])
    mixed = {k: src[k] + (frames[k] - anchors[k]) if k in DRIVEN_KEYS_IMAGE else src[k] for k in MOTION_KEYS}
    driven_w, blink_w = expression_weights(True, True)
    mixed["exp"] = (
        mixed["exp"] * driven_w + src["exp"] * (1 - driven_w) + table[schedule[torch.arange(4) % 3]] * blink_w
    )
    mixed = fade(mixed, src, alphas, ("exp",))
    yaw = bins_to_degrees(mixed["yaw"]) - bins_to_degrees(source["yaw"][0])
    pitch = bins_to_degrees(mixed["pitch"]) - bins_to_degrees(source["pitch"][0])
    mixed["exp"] = mixed["exp"] + gaze_delta(yaw, pitch, gaze_weights())
    expected = toy_stitch(x_s, motion_keypoints(mixed, src["kp"]))
    torch.testing.assert_close(x_d, expected, rtol=0, atol=1e-6)


def test_several_sessions_posed_and_stitched_in_one_call_get_what_each_gets_alone() -> None:
    g = torch.Generator().manual_seed(11)
    net = torch.nn.Sequential(torch.nn.Linear(126, 32), torch.nn.ReLU(), torch.nn.Linear(32, 63))

    def stitch(x_s: torch.Tensor, x_d: torch.Tensor) -> torch.Tensor:
        return x_d + net(torch.cat([x_s.flatten(1), x_d.flatten(1)], dim=1)).reshape(-1, 21, 3) * 0.01

    def stitchers() -> list[MotionStitcher]:
        return [
            MotionStitcher(_motion(torch.Generator().manual_seed(1), 4, with_kp=True), stitch=stitch),
            MotionStitcher(
                _motion(torch.Generator().manual_seed(2), 1, with_kp=True),
                stitch=stitch,
                controls=StitchControls(pose_offset=(0.0, 9.0, 0.0)),
            ),
            MotionStitcher(
                _motion(torch.Generator().manual_seed(3), 2, with_kp=True),
                stitch=stitch,
                driven_keys=("exp",),
                drive_eye=False,
            ),
        ]

    calls = [
        (join_motion(_motion(g, 5)), torch.tensor([0, 1, 2, 3, 3])),
        (join_motion(_motion(g, 3)), None),
        (join_motion(_motion(g, 2)), torch.tensor([1, 0])),
    ]
    with torch.no_grad():
        alone = [stitcher(driving, rows) for stitcher, (driving, rows) in zip(stitchers(), calls)]
        x_s_all, x_d_all = stitch_posed(
            [stitcher.pose(driving, rows) for stitcher, (driving, rows) in zip(stitchers(), calls)], stitch
        )
    assert x_s_all.shape[0] == x_d_all.shape[0] == 5 + 3 + 2
    for x_s, x_d, (x_s_alone, x_d_alone) in zip(x_s_all.split([5, 3, 2]), x_d_all.split([5, 3, 2]), alone):
        torch.testing.assert_close(x_s, x_s_alone, rtol=0, atol=1e-6)
        torch.testing.assert_close(x_d, x_d_alone, rtol=0, atol=1e-6)
