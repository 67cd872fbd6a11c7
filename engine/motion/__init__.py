"""Motion math on the device: the 265-d vector, head pose, keypoints, conditions and stitching, batched over frames."""

from engine.motion.conditions import CONDITION_DIM, EMOTIONS, ConditionBuilder, emotion_table, emotion_vector
from engine.motion.keypoints import motion_keypoints, transform_keypoints
from engine.motion.pose import bins_to_degrees, rotation_matrix
from engine.motion.stitching import MotionStitcher, blink_schedule, fade_alphas
from engine.motion.vector import MOTION_DIM, MOTION_KEYS, MOTION_SLICES, join_motion, split_motion

__all__ = [
    "CONDITION_DIM",
    "EMOTIONS",
    "MOTION_DIM",
    "MOTION_KEYS",
    "MOTION_SLICES",
    "ConditionBuilder",
    "MotionStitcher",
    "bins_to_degrees",
    "blink_schedule",
    "emotion_table",
    "emotion_vector",
    "fade_alphas",
    "join_motion",
    "motion_keypoints",
    "rotation_matrix",
    "split_motion",
    "transform_keypoints",
]
