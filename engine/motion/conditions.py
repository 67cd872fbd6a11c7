"""The LMDM's per-frame condition: [hubert 1024 | emotion 8 | eye_open 2 | eye_ball 6 | avatar keypoints 63].

The avatar part (emotion, eyes, canonical keypoints) is held on the device; each window only
gathers it for its frames and concatenates it to the audio features.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

EMOTIONS = ("angry", "disgust", "fear", "happy", "neutral", "sad", "surprise", "contempt")
NEUTRAL = EMOTIONS.index("neutral")
EMOTION_SHARPNESS = 8.0
HUBERT_DIM = 1024
EMOTION_DIM = len(EMOTIONS)
EYE_OPEN_DIM = 2
EYE_BALL_DIM = 6
KEYPOINT_DIM = 63
CONDITION_DIM = HUBERT_DIM + EMOTION_DIM + EYE_OPEN_DIM + EYE_BALL_DIM + KEYPOINT_DIM

Label = int | str
Emotion = Label | Sequence[Label] | Sequence[Sequence[Label]] | torch.Tensor


def emotion_index(label: Label) -> int:
    """An emotion label (0..7 or a name such as "happy") -> its index."""
    if isinstance(label, str):
        if label.lower() not in EMOTIONS:
            raise ValueError(f"unknown emotion {label!r}; choose one of {', '.join(EMOTIONS)}")
        return EMOTIONS.index(label.lower())
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < EMOTION_DIM:
        raise ValueError(f"emotion label must be 0..{EMOTION_DIM - 1} or a name ({', '.join(EMOTIONS)}), got {label!r}")
    return label


def emotion_vector(labels: Label | Sequence[Label], device: torch.device | str | None = None) -> torch.Tensor:
    """One label or a set of labels -> (8,) softmax of 8 at each listed index (0.99766 / 0.000335 for one label)."""
    chosen = [labels] if isinstance(labels, (int, str)) else list(labels)
    if not chosen:
        raise ValueError("an emotion needs at least one label")
    logits = torch.zeros(EMOTION_DIM, dtype=torch.float64)
    logits[[emotion_index(label) for label in chosen]] = EMOTION_SHARPNESS
    return torch.softmax(logits, dim=0).to(device=device, dtype=torch.float32)


def emotion_table(emotion: Emotion, device: torch.device | str | None = None) -> torch.Tensor:
    """Any accepted emotion form -> (m,8): a label or label set gives m=1; a list of label sets or an (m,8) tensor one
    row per frame."""
    if isinstance(emotion, torch.Tensor):
        if emotion.ndim != 2 or emotion.shape[1] != EMOTION_DIM or emotion.shape[0] == 0:
            raise ValueError(f"an emotion tensor must be (m,{EMOTION_DIM}), got shape {tuple(emotion.shape)}")
        return emotion.to(device=device, dtype=torch.float32)
    if isinstance(emotion, (int, str)):
        return emotion_vector(emotion, device)[None]
    rows = list(emotion)
    if rows and all(isinstance(row, Sequence) and not isinstance(row, str) for row in rows):
        return torch.stack([emotion_vector(row, device) for row in rows])
    return emotion_vector(rows, device)[None]


def mirror_index(index: torch.Tensor, size: int) -> torch.Tensor:
    """Ping-pong frame index into a table of ``size`` rows (0,1,..,n-1,n-1,..,0,0,1,..); negative indices count as 0."""
    index = index.clamp(min=0)
    turn, rest = index // size, index % size
    return torch.where(turn % 2 == 0, rest, size - 1 - rest)


class ConditionBuilder:
    """Per-session condition assembly for LMDM windows, everything on the avatar's device."""

    def __init__(
        self,
        keypoints: torch.Tensor,
        eye_open: torch.Tensor,
        eye_ball: torch.Tensor,
        width: int,
        emotion: Emotion = NEUTRAL,
    ) -> None:
        """``keypoints`` (63,) avatar canonical kp; ``eye_open`` (N,2) and ``eye_ball`` (N,6) per avatar frame
        (or one row); ``width`` the LMDM checkpoint's condition width D, which must be 1103."""
        if width != CONDITION_DIM:
            raise ValueError(
                f"the LMDM checkpoint expects {width}-wide conditions, but the engine builds {CONDITION_DIM} = "
                f"hubert {HUBERT_DIM} + emotion {EMOTION_DIM} + eye_open {EYE_OPEN_DIM} + eye_ball {EYE_BALL_DIM} "
                f"+ keypoints {KEYPOINT_DIM}; use the official lmdm_v0.4_hubert checkpoint (cond_projection (512, "
                "1103))"
            )
        self.device = keypoints.device
        self.keypoints = _rows(keypoints, KEYPOINT_DIM, "keypoints")
        if self.keypoints.shape[0] != 1:
            raise ValueError(f"keypoints must be one (63,) vector, got shape {tuple(keypoints.shape)}")
        self.eye_open = _rows(eye_open, EYE_OPEN_DIM, "eye_open").to(self.device)
        self.eye_ball = _rows(eye_ball, EYE_BALL_DIM, "eye_ball").to(self.device)
        self.set_emotion(emotion)

    def set_emotion(self, emotion: Emotion) -> None:
        """Change the emotion for the windows built from now on."""
        self.emotion = emotion_table(emotion, self.device)
        tables = (self.emotion, self.eye_open, self.eye_ball)
        self._constant = None
        if all(table.shape[0] == 1 for table in tables):
            self._constant = torch.cat([*tables, self.keypoints], dim=-1)[None]

    def __call__(self, hubert: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """HuBERT features (B,L,1024) of frames start..start+L-1 -> conditions (B,L,1103) in hubert's dtype.

        ``start`` (int or (B,) int64) is the stream index of each window's first frame; negative
        indices (the silence before the stream) use the first avatar frame.
        """
        if hubert.ndim != 3 or hubert.shape[-1] != HUBERT_DIM:
            raise ValueError(f"hubert features must be (B,L,{HUBERT_DIM}), got shape {tuple(hubert.shape)}")
        batch, length = hubert.shape[:2]
        if self._constant is not None:  # one emotion, one eye row (an image avatar): the same for every frame
            return torch.cat([hubert, self._constant.to(hubert.dtype).expand(batch, length, -1)], dim=-1)
        offsets = torch.arange(length, device=hubert.device)
        if isinstance(start, torch.Tensor):
            frames = start.to(hubert.device).reshape(-1, 1) + offsets
        else:
            frames = (offsets + start).unsqueeze(0)
        emotion = self.emotion[frames.clamp(min=0) % self.emotion.shape[0]]
        eye_open = self.eye_open[mirror_index(frames, self.eye_open.shape[0])]
        eye_ball = self.eye_ball[mirror_index(frames, self.eye_ball.shape[0])]
        keypoints = self.keypoints.expand(*frames.shape, KEYPOINT_DIM)
        avatar = torch.cat([emotion, eye_open, eye_ball, keypoints], dim=-1).to(hubert.dtype)
        return torch.cat([hubert, avatar.expand(batch, length, -1)], dim=-1)


def _rows(values: torch.Tensor, width: int, name: str) -> torch.Tensor:
    """(width,) or (N,width) -> (N,width) float32, with a clear error for other shapes."""
    rows = values.reshape(1, -1) if values.ndim == 1 else values
    if rows.ndim != 2 or rows.shape[1] != width or rows.shape[0] == 0:
        raise ValueError(f"{name} must be ({width},) or (N,{width}), got shape {tuple(values.shape)}")
    return rows.to(torch.float32)
