"""Face detection and landmarks: choosing a face, rejecting bad ones, and the packaged mediapipe path."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from avatars.errors import FaceError
from avatars.faces import (
    MIN_FACE_PX,
    OFFICIAL_FILES,
    Detection,
    FaceModels,
    box_from_xywh,
    decode_scrfd,
    find_aux_dir,
    load_face_models,
    nms,
    select_face,
)

# Where the astronaut's face is (x0, y0, x1, y1): OpenCV's Haar cascade gives (177, 66, 95, 95) as x, y, w, h.
ASTRONAUT_FACE = (177, 66, 272, 178)


def two_astronauts(astronaut: np.ndarray) -> np.ndarray:
    """The astronaut at full size on the left and at 3/4 size on the right."""
    small = cv2.resize(astronaut, (384, 384), interpolation=cv2.INTER_AREA)
    right = np.pad(small, ((64, 64), (0, 0), (0, 0)), constant_values=128)
    return np.ascontiguousarray(np.concatenate([astronaut, right], axis=1))


@pytest.fixture(scope="module")
def packaged() -> FaceModels:
    return load_face_models(None)


def test_the_largest_face_is_chosen_unless_an_index_from_the_left_is_given() -> None:
    small_left = Detection((10, 10, 110, 110), 0.9)
    big_right = Detection((300, 10, 500, 210), 0.8)
    assert select_face([small_left, big_right]) is big_right
    assert select_face([big_right, small_left], face_index=0) is small_left
    assert select_face([big_right, small_left], face_index=1) is big_right
    with pytest.raises(FaceError, match="2 face\\(s\\), numbered 0 to 1 from left to right"):
        select_face([small_left, big_right], face_index=2)


def test_no_face_and_a_tiny_face_are_refused_with_advice() -> None:
    with pytest.raises(FaceError, match="no face found.*--face-box"):
        select_face([])
    with pytest.raises(FaceError, match=f"only 40 px across.*at least {MIN_FACE_PX} px"):
        select_face([Detection((0, 0, 40, 50), 0.9)])


def test_an_explicit_face_box_is_checked_against_the_source_and_scaled_to_the_frame() -> None:
    assert box_from_xywh(10, 20, 100, 120, (512, 512), (512, 512)).box == (10, 20, 110, 140)
    assert box_from_xywh(1000, 400, 400, 400, (3000, 4000), (1440, 1920)).box == (480, 192, 672, 384)
    with pytest.raises(FaceError, match="outside the 512x512 source"):
        box_from_xywh(450, 20, 100, 100, (512, 512), (512, 512))
    with pytest.raises(FaceError, match="must be positive"):
        box_from_xywh(0, 0, 0, 10, (512, 512), (512, 512))


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = np.array([[0, 0, 100, 100], [5, 5, 105, 105], [200, 200, 260, 260]], np.float32)
    assert nms(boxes, np.array([0.8, 0.9, 0.7]), 0.4) == [1, 2]


def test_scrfd_outputs_decode_to_boxes_around_anchor_centres() -> None:
    # one confident anchor at stride 16, cell (x=10, y=4), second anchor; distances 2,3,4,5 cells
    outputs = []
    for stride in (8, 16, 32):
        cells = (512 // stride) ** 2 * 2
        outputs.append(np.zeros((cells, 1), np.float32))
    for stride in (8, 16, 32):
        outputs.append(np.ones(((512 // stride) ** 2 * 2, 4), np.float32))
    outputs += [np.zeros(((512 // s) ** 2 * 2, 10), np.float32) for s in (8, 16, 32)]
    index = (4 * 32 + 10) * 2 + 1
    outputs[1][index] = 0.9
    outputs[4][index] = (2, 3, 4, 5)
    boxes, scores = decode_scrfd(outputs)
    assert scores.tolist() == pytest.approx([0.9])
    assert boxes[0].tolist() == [160 - 32, 64 - 48, 160 + 64, 64 + 80]


def test_aux_models_are_found_beside_the_checkpoints_and_must_be_complete(tmp_path: Path) -> None:
    models = tmp_path / "ditto_pytorch" / "models"
    aux = tmp_path / "ditto_pytorch" / "aux_models"
    models.mkdir(parents=True)
    assert find_aux_dir(models) is None
    aux.mkdir()
    (aux / OFFICIAL_FILES[0]).write_bytes(b"")
    assert find_aux_dir(models) == aux
    with pytest.raises(FaceError, match="only part of the official face models.*2d106det.onnx"):
        load_face_models(aux)


def test_packaged_models_find_the_astronaut_and_its_478_landmarks(packaged: FaceModels, astronaut: np.ndarray) -> None:
    assert packaged.kind == "packaged"
    faces, detector = packaged.detect(astronaut)
    assert detector.startswith("mediapipe BlazeFace")
    face = select_face(faces)
    x0, y0, x1, y1 = face.box
    assert abs((x0 + x1) / 2 - 225) < 15 and abs((y0 + y1) / 2 - 122) < 20  # the Haar box's centre
    landmarks = packaged.landmarks.from_box(astronaut, face)
    assert landmarks.shape == (478, 2)
    assert x0 - 30 < landmarks[:, 0].mean() < x1 + 30 and y0 - 30 < landmarks[:, 1].mean() < y1 + 30


def test_an_explicit_box_replaces_detection(packaged: FaceModels, astronaut: np.ndarray) -> None:
    face = select_face([box_from_xywh(177, 66, 95, 95, (512, 512), (512, 512))])
    landmarks = packaged.landmarks.from_box(astronaut, face)
    assert landmarks.shape == (478, 2) and 177 < landmarks[:, 0].mean() < 272
    with pytest.raises(FaceError, match="found no face inside the box"):
        packaged.landmarks.from_box(np.full((512, 512, 3), 128, np.uint8), face)


def test_a_flat_gray_image_has_no_face(packaged: FaceModels) -> None:
    faces, detector = packaged.detect(np.full((480, 640, 3), 128, np.uint8))
    assert faces == [] and "Haar" in detector  # every detector was tried


def test_two_astronauts_give_two_faces_largest_on_the_left(packaged: FaceModels, astronaut: np.ndarray) -> None:
    faces, _ = packaged.detect(two_astronauts(astronaut))
    assert len(faces) == 2
    assert select_face(faces).box[0] < 300
    assert select_face(faces, face_index=1).box[0] > 512


def test_a_face_that_is_detected_but_tiny_is_refused(packaged: FaceModels, astronaut: np.ndarray) -> None:
    canvas = np.full((640, 640, 3), 128, np.uint8)
    canvas[200:392, 200:392] = cv2.resize(astronaut, (192, 192), interpolation=cv2.INTER_AREA)
    faces, _ = packaged.detect(canvas)
    assert len(faces) == 1
    with pytest.raises(FaceError, match="px across"):
        select_face(faces)


def constant_onnx(path: Path, input_name: str, input_shape: list[int], outputs: dict[str, np.ndarray]) -> Path:
    """An ONNX model with the official file's input that returns fixed outputs (stands in for weights we lack)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value.astype(np.float32), f"{name}_v"))
        for name, value in outputs.items()
    ]
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in outputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_the_official_onnx_chain_maps_model_outputs_back_to_image_pixels(tmp_path: Path, astronaut: np.ndarray) -> None:
    from avatars.crop import LANDMARK_CROP, crop_matrix, invert, transform_points

    # detector: one anchor at stride 16, cell (10, 4), distances (2, 3, 4, 5) cells, in a 1024x512 image
    det = {f"score_{s}": np.zeros(((512 // s) ** 2 * 2, 1)) for s in (8, 16, 32)}
    det |= {f"bbox_{s}": np.ones(((512 // s) ** 2 * 2, 4)) for s in (8, 16, 32)}
    det |= {f"kps_{s}": np.zeros(((512 // s) ** 2 * 2, 10)) for s in (8, 16, 32)}
    det["score_16"][(4 * 32 + 10) * 2] = 0.95
    det["bbox_16"][(4 * 32 + 10) * 2] = (2, 3, 4, 5)
    rng = np.random.default_rng(0)
    lmk106 = rng.uniform(-0.5, 0.5, (1, 212))
    lmk203 = rng.uniform(0.3, 0.7, (1, 406))
    constant_onnx(tmp_path / "det_10g.onnx", "input.1", [1, 3, 512, 512], det)
    constant_onnx(tmp_path / "2d106det.onnx", "data", [1, 3, 192, 192], {"fc1": lmk106})
    constant_onnx(tmp_path / "landmark203.onnx", "input", [1, 3, 224, 224], {"landmarks": lmk203})

    models = load_face_models(tmp_path)
    assert models.kind == "official"
    image = np.ascontiguousarray(np.concatenate([astronaut, astronaut], axis=1))  # 1024 wide: det scale 1/2
    faces, detector = models.detect(image)
    assert detector.startswith("insightface det_10g")
    assert [round(v) for v in faces[0].box] == [2 * (160 - 32), 2 * (64 - 48), 2 * (160 + 64), 2 * (64 + 80)]

    points = models.landmarks.from_box(image, faces[0])
    x0, y0, x1, y1 = faces[0].box
    s = 192 / (1.5 * max(x1 - x0, y1 - y0))
    pts106 = np.column_stack([(lmk106[0, ::2] + 1) * 96, (lmk106[0, 1::2] + 1) * 96])
    pts106 = (pts106 - 96) / s + [(x0 + x1) / 2, (y0 + y1) / 2]
    expected = transform_points(lmk203.reshape(-1, 2) * 224, invert(crop_matrix(pts106, LANDMARK_CROP)))
    assert points.shape == (203, 2)
    assert np.allclose(points, expected, atol=1e-3)
