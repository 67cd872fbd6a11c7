"""Registration: source frames -> face crop -> eye features and the two extractor networks -> cache.

Per frame: the face is detected on the first frame (or given as a box) and tracked on later
ones with the previous frame's landmarks; the roll-aligned 512 crop gives ``M_c2o`` and the
eye features; its 256x256 resize (area interpolation, RGB in [0,1]) feeds the motion and
appearance extractors. For videos the motion of every frame is smoothed over time with a
centered mean of 13 frames (all seven outputs, pose logits included), as the reference does;
``sc`` is the canonical keypoints of the first frame before smoothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch
from tqdm import tqdm

from avatars.cache import REGISTRATION_NETWORKS, check_name, checkpoint_files, file_sha256, save_avatar
from avatars.crop import AVATAR_CROP, crop_matrix, invert
from avatars.errors import FaceError
from avatars.eyes import eye_features
from avatars.faces import Detection, FaceModels, box_from_xywh, find_aux_dir, load_face_models, select_face
from avatars.images import Media, load_media
from avatars.mask import feathered_mask
from engine.networks import load_network
from engine.networks.motion_extractor import HEAD_NAMES

SMOOTH_FRAMES = 13
NETWORK_SIZE = 256


@dataclass(frozen=True)
class FaceChoice:
    """How the face of the first frame is chosen: an explicit box (x, y, w, h), or an index from the left."""

    box: tuple[float, float, float, float] | None = None
    index: int | None = None


def centered_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean over a centered window of ``window`` frames along axis 0, clipped at both ends."""
    half = window // 2
    n = values.shape[0]
    sums = np.concatenate([np.zeros_like(values[:1], dtype=np.float64), np.cumsum(values, axis=0, dtype=np.float64)])
    lo = np.clip(np.arange(n) - half, 0, n)
    hi = np.clip(np.arange(n) + half + 1, 0, n)
    shape = (-1,) + (1,) * (values.ndim - 1)
    return ((sums[hi] - sums[lo]) / (hi - lo).reshape(shape)).astype(values.dtype)


def network_input(crop: np.ndarray) -> torch.Tensor:
    """The 512 crop as the networks' input: (1,3,256,256) float32 RGB in [0,1]."""
    small = cv2.resize(crop, (NETWORK_SIZE, NETWORK_SIZE), interpolation=cv2.INTER_AREA)
    return torch.from_numpy(small.astype(np.float32) / 255.0).permute(2, 0, 1)[None].contiguous()


def _first_face(media: Media, faces: FaceModels, choice: FaceChoice) -> tuple[Detection, str]:
    """The face to register in the first frame and how it was found."""
    frame = media.frames[0]
    if choice.box is not None and choice.index is not None:
        raise FaceError("give either --face-box or --face-index, not both")
    if choice.box is not None:
        return select_face([box_from_xywh(*choice.box, media.original_size, frame.shape[:2])]), "--face-box"
    found, detector = faces.detect(frame)
    return select_face(found, choice.index), detector


def register(
    source: str | Path,
    name: str,
    checkpoints: str | Path,
    *,
    choice: FaceChoice = FaceChoice(),
    device: str | torch.device = "cpu",
    cache_dir: str | Path | None = None,
    random_weights: bool = False,
    progress: bool = True,
) -> Path:
    """Register ``source`` (image or video) as avatar ``name``; returns the cache directory written."""
    started = time.perf_counter()
    check_name(name)
    source, checkpoints = Path(source), Path(checkpoints)
    files = checkpoint_files(checkpoints)
    media = load_media(source)
    faces = load_face_models(find_aux_dir(checkpoints))
    face, detector = _first_face(media, faces, choice)
    landmarks = faces.landmarks.from_box(media.frames[0], face)
    nets = {n: load_network(n, files[n], device=device) for n in REGISTRATION_NETWORKS}

    size = AVATAR_CROP.dsize
    per_frame: dict[str, list[np.ndarray]] = {k: [] for k in ("M_c2o", "eye_open", "eye_ball", "f_s", *HEAD_NAMES)}
    frames = tqdm(media.frames, desc=f"registering {name}", unit="frame", disable=not progress or media.is_image)
    with torch.inference_mode():
        for index, frame in enumerate(frames):
            if index:
                landmarks = faces.landmarks.track(frame, landmarks)
            m_o2c = crop_matrix(landmarks, AVATAR_CROP)
            crop = cv2.warpAffine(frame, m_o2c[:2], (size, size), flags=cv2.INTER_LINEAR)
            eye_open, eye_ball = eye_features(faces.eyes(crop))
            image = network_input(crop).to(device)
            motion = nets["motion_extractor"](image)
            per_frame["f_s"].append(nets["appearance_extractor"](image).float().cpu().numpy())
            for key, value in zip(HEAD_NAMES, motion):
                per_frame[key].append(value.float().cpu().numpy())
            per_frame["M_c2o"].append(invert(m_o2c)[None].astype(np.float32))
            per_frame["eye_open"].append(eye_open)
            per_frame["eye_ball"].append(eye_ball)

    tensors = {k: np.concatenate(v) for k, v in per_frame.items()}
    tensors["sc"] = tensors["kp"][0].copy()
    if not media.is_image:
        for key in HEAD_NAMES:
            tensors[key] = centered_mean(tensors[key], SMOOTH_FRAMES)
    tensors["mask_crop"] = feathered_mask(size, size)
    tensors["frames"] = np.stack(media.frames)

    manifest = _manifest(source, media, faces, detector, face, choice, checkpoints, files, random_weights, device)
    manifest["registration_seconds"] = round(time.perf_counter() - started, 3)
    return save_avatar(tensors, manifest, name, cache_dir)


def _manifest(
    source: Path,
    media: Media,
    faces: FaceModels,
    detector: str,
    face: Detection,
    choice: FaceChoice,
    checkpoints: Path,
    files: dict[str, Path],
    random_weights: bool,
    device: str | torch.device,
) -> dict:
    """Everything about this registration except the tensors, for the cache's JSON manifest."""
    height, width = media.frames[0].shape[:2]
    return {
        "source": {
            "path": str(source.resolve()),
            "sha256": file_sha256(source),
            "kind": "image" if media.is_image else "video",
            "frames": len(media.frames),
            "fps": media.fps,
            "height": height,
            "width": width,
            "original_height": int(media.original_size[0]),
            "original_width": int(media.original_size[1]),
        },
        "checkpoints": {
            "directory": str(checkpoints.resolve()),
            "random_weights": random_weights,
            "sha256": {n: file_sha256(files[n]) for n in REGISTRATION_NETWORKS},
        },
        "crop": {**AVATAR_CROP.as_dict(), "vx_ratio": 0.0},
        "smoothing_frames": 1 if media.is_image else SMOOTH_FRAMES,
        "faces": {
            **faces.describe(),
            "detector_used": detector,
            "box": [round(v, 2) for v in face.box],
            "face_index": choice.index,
        },
        "device": str(device),
    }
