"""The avatar cache: bit-exact round trip, refusal of stale or corrupted caches, atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from avatars.cache import (
    FORMAT_VERSION,
    MANIFEST,
    REGISTRATION_NETWORKS,
    TENSORS,
    check_name,
    checkpoint_files,
    checkpoint_hashes,
    hash_checkpoints_ahead,
    load_avatar,
    rebuild_command,
    save_avatar,
)
from avatars.errors import CacheError, StaleCacheError

HASHES = {"motion_extractor": "a" * 64, "appearance_extractor": "b" * 64}


def fake_registration(frames: int = 2, seed: int = 0) -> tuple[dict[str, np.ndarray], dict]:
    """Random tensors in the cache layout and a minimal manifest (no networks needed)."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    tensors = {
        "f_s": f32(frames, 32, 16, 64, 64),
        **{k: f32(frames, 66) for k in ("pitch", "yaw", "roll")},
        "t": f32(frames, 3),
        "exp": f32(frames, 63),
        "scale": f32(frames, 1),
        "kp": f32(frames, 63),
        "M_c2o": f32(frames, 3, 3),
        "eye_open": f32(frames, 2),
        "eye_ball": f32(frames, 6),
        "sc": f32(63),
        "mask_crop": rng.random((512, 512), dtype=np.float32),
        "frames": rng.integers(0, 256, (frames, 48, 64, 3), dtype=np.uint8),
    }
    manifest = {
        "source": {"path": "/data/portrait.png", "kind": "video" if frames > 1 else "image", "frames": frames},
        "checkpoints": {"directory": "/ckpt", "random_weights": True, "sha256": dict(HASHES)},
    }
    return tensors, manifest


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    tensors, manifest = fake_registration()
    return save_avatar(tensors, manifest, "anchor", tmp_path), tensors


def test_the_cache_round_trips_bit_exactly(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tensors = saved
    avatar = load_avatar(path.name, "cpu", cache_dir=path.parent)
    for key, array in tensors.items():
        loaded = getattr(avatar, key)
        assert loaded.dtype == torch.from_numpy(array).dtype
        assert torch.equal(loaded, torch.from_numpy(array)), key
    assert avatar.name == "anchor" and not avatar.is_image and avatar.num_frames == 2
    assert avatar.manifest["format"] == FORMAT_VERSION
    # the file is plain safetensors: the reference reader agrees
    assert all(np.array_equal(v, tensors[k]) for k, v in load_file(path / TENSORS).items())


def test_loading_by_path_and_onto_a_device(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, tensors = saved
    device = "cuda" if torch.cuda.is_available() else "cpu"
    avatar = load_avatar(path, device)
    assert avatar.f_s.device.type == device and avatar.frames.device.type == device
    assert torch.equal(avatar.kp.cpu(), torch.from_numpy(tensors["kp"]))


def test_a_changed_byte_in_the_tensor_file_is_detected(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = saved
    data = bytearray((path / TENSORS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / TENSORS).write_bytes(bytes(data))
    with pytest.raises(CacheError, match="corrupted.*checksum.*rebuild it: python -m apps.avatars register"):
        load_avatar(path)


def test_a_truncated_or_garbled_tensor_file_is_detected_even_without_the_checksum(
    saved: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, _ = saved
    good = (path / TENSORS).read_bytes()
    (path / TENSORS).write_bytes(good[:-100])
    with pytest.raises(CacheError, match="corrupted"):
        load_avatar(path, verify=False)
    garbled = bytearray(good)
    garbled[8:20] = b"?" * 12  # break the JSON header
    (path / TENSORS).write_bytes(bytes(garbled))
    with pytest.raises(CacheError, match="unreadable header"):
        load_avatar(path, verify=False)
    (path / TENSORS).write_bytes(good.replace(b'"shape":[2,63]', b'"shape":[2,64]', 1))
    with pytest.raises(CacheError, match="does not fit the file"):
        load_avatar(path, verify=False)


def test_a_manifest_of_another_format_version_is_refused_with_the_rebuild_command(
    saved: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, _ = saved
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["format"] = FORMAT_VERSION - 1
    (path / MANIFEST).write_text(json.dumps(manifest))
    rebuild = "rebuild it: python -m apps.avatars register /data/portrait.png --name anchor"
    with pytest.raises(StaleCacheError, match=f"format 0.*{rebuild}"):
        load_avatar(path)
    (path / MANIFEST).write_text("{ not json")
    with pytest.raises(CacheError, match="manifest.json is corrupted"):
        load_avatar(path)


def test_other_checkpoints_are_refused_and_the_same_ones_accepted(
    saved: tuple[Path, dict[str, np.ndarray]], checkpoint_dir
) -> None:
    path, _ = saved
    assert load_avatar(path, checkpoints=HASHES).name == "anchor"
    other = {**HASHES, "appearance_extractor": "c" * 64}
    refusal = r"other checkpoints \(appearance_extractor differ.*--checkpoints CHECKPOINTS_DIR"
    with pytest.raises(StaleCacheError, match=refusal):
        load_avatar(path, checkpoints=other)
    directory = checkpoint_dir("motion_extractor", "appearance_extractor")
    with pytest.raises(StaleCacheError, match=f"--checkpoints {directory}"):
        load_avatar(path, checkpoints=directory)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["checkpoints"]["sha256"] = checkpoint_hashes(directory)
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert load_avatar(path, checkpoints=directory).name == "anchor"


def test_a_failed_write_leaves_the_previous_avatar_and_no_temporary_files(
    saved: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, tensors = saved
    bad, manifest = fake_registration(seed=1)
    bad["kp"] = bad["kp"][:, :10]  # wrong shape: refused while writing
    with pytest.raises(CacheError, match="'kp'"):
        save_avatar(bad, manifest, "anchor", path.parent)
    assert sorted(p.name for p in path.parent.iterdir()) == ["anchor"]
    assert torch.equal(load_avatar(path).kp, torch.from_numpy(tensors["kp"]))


def test_registering_again_replaces_the_avatar(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = saved
    newer, manifest = fake_registration(frames=1, seed=2)
    save_avatar(newer, manifest, "anchor", path.parent)
    assert sorted(p.name for p in path.parent.iterdir()) == ["anchor"]
    avatar = load_avatar(path)
    assert avatar.is_image and torch.equal(avatar.sc, torch.from_numpy(newer["sc"]))


def test_missing_avatars_and_bad_names_get_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="no avatar 'nobody'.*register it first"):
        load_avatar("nobody", cache_dir=tmp_path)
    for name in ("../escape", ".hidden", "", "a b"):
        with pytest.raises(CacheError, match="invalid avatar name"):
            check_name(name)


def rewrite(path: Path, manifest_edit=None, header_edit=None, tensor_edit=None) -> None:
    """Edit a cached avatar and write it back with a matching size and CRC-32, as a tampering tool would."""
    data = (path / TENSORS).read_bytes()
    if tensor_edit is not None:
        arrays = {k: v.copy() for k, v in load_file(path / TENSORS).items()}
        tensor_edit(arrays)
        from safetensors.numpy import save as save_bytes

        data = save_bytes(arrays)
    if header_edit is not None:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        header_edit(header)
        text = json.dumps(header).encode()
        data = len(text).to_bytes(8, "little") + text + data[8 + size :]
    (path / TENSORS).write_bytes(data)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["tensors"].update(bytes=len(data), crc32=zlib.crc32(data))
    if manifest_edit is not None:
        manifest_edit(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


def _set(dotted: str, value):
    def edit(manifest: dict) -> None:
        *parents, key = dotted.split(".")
        for parent in parents:
            manifest = manifest.setdefault(parent, {})
        manifest[key] = value

    return edit


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "anc\x07hor"),
        ("name", ["anchor"]),
        ("is_image", "no"),
        ("is_image", True),  # two frames: a video
        ("created", {"at": 1}),
        ("tensors.crc32", -1),
        ("source", "portrait.png"),
        ("source.kind", "photo"),
        ("source.frames", 3),
        ("source.frames", "2"),
        ("source.path", "/data/portrait.png\n; rm -rf ~"),
        ("source.fps", float("nan")),
        ("source.width", 65),
        ("checkpoints.sha256", ["a" * 64]),
        ("checkpoints.sha256", {"motion_extractor": 7}),
        ("checkpoints.random_weights", "yes"),
        ("crop.dsize", -512),
        ("crop.scale", float("inf")),
        ("crop.vy_ratio", 1e30),
        ("crop.rotate", 1),
        ("smoothing_frames", -1),
        ("faces.box", [0, 0, "wide", 10]),
        ("faces.face_index", 1.5),
        ("registration_seconds", float("nan")),
    ],
)
def test_every_manifest_field_is_checked_at_load(saved: tuple[Path, dict[str, np.ndarray]], field: str, value) -> None:
    path, _ = saved
    rewrite(path, manifest_edit=_set(field, value))
    with pytest.raises(CacheError, match=f"'{field.split('.')[0] if field == 'source' else field}'"):
        load_avatar(path, checkpoints=HASHES)


def test_a_deeply_nested_or_huge_manifest_is_a_clear_error(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = saved
    text = (path / MANIFEST).read_text()
    for depth in (500, 100_000):  # json reads the first, and a recursive walk of it would not
        (path / MANIFEST).write_text(text[:-2] + ', "faces": ' + "[" * depth + "]" * depth + "}")
        with pytest.raises(CacheError, match="manifest.json is corrupted.*nested"):
            load_avatar(path)
    (path / MANIFEST).write_text(text[:-2] + ', "faces": {"kind": ' + json.dumps("x" * (2 << 20)) + "}}")
    with pytest.raises(CacheError, match="manifest.json is corrupted.*MB"):
        load_avatar(path)


@pytest.mark.parametrize(
    "key, edit",
    [
        ("M_c2o", lambda a: a["M_c2o"].__setitem__((0, 0, 0), np.nan)),
        ("M_c2o", lambda a: a["M_c2o"].__setitem__((1, 0, 2), 1e30)),
        ("scale", lambda a: a["scale"].__setitem__((0, 0), np.inf)),
        ("f_s", lambda a: a["f_s"].__setitem__((1, 0, 0, 0, 5), np.nan)),
        ("mask_crop", lambda a: a["mask_crop"].__setitem__((3, 3), -1.0)),
        ("mask_crop", lambda a: a["mask_crop"].__setitem__((3, 3), 1.5)),
    ],
)
def test_tensor_values_that_would_render_garbage_are_refused(
    saved: tuple[Path, dict[str, np.ndarray]], key: str, edit
) -> None:
    path, _ = saved
    rewrite(path, tensor_edit=edit)
    with pytest.raises(CacheError, match=f"tensor '{key}'"):
        load_avatar(path)


def _overlap(header: dict) -> None:
    """'sc' (63 floats) pointed at the first row of 'kp', which it then shares."""
    start = header["kp"]["data_offsets"][0]
    header["sc"]["data_offsets"] = [start, start + 63 * 4]


def _overflow(header: dict) -> None:
    """A frames shape whose product is 3 * 2**65: 0 in int64, so it "fits" an empty range."""
    start = header["frames"]["data_offsets"][0]
    header["frames"].update(shape=[2, 2**62, 4, 3], data_offsets=[start, start])


@pytest.mark.parametrize(
    "edit, message",
    [
        (_overlap, "overlap or leave gaps"),
        (_overflow, "entry 'frames' does not fit the file"),
        (lambda h: h["kp"].update(shape=[2, 63.0]), "bad entry for 'kp'"),
        (lambda h: h["kp"].update(shape=[2, "63"]), "bad entry for 'kp'"),
        (lambda h: h["kp"].update(data_offsets=[True, 504]), "bad entry for 'kp'"),
        (lambda h: h.update(extra=[1]), "bad entry for 'extra'"),
    ],
)
def test_a_tensor_header_with_overlapping_or_overflowing_entries_is_refused(
    saved: tuple[Path, dict[str, np.ndarray]], edit, message: str
) -> None:
    path, _ = saved
    rewrite(path, header_edit=edit)
    with pytest.raises(CacheError, match=message):
        load_avatar(path)


def test_a_deeply_nested_tensor_header_is_a_clear_error(saved: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, _ = saved
    data = (path / TENSORS).read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + size].rstrip()[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    data = len(header).to_bytes(8, "little") + header + data[8 + size :]
    (path / TENSORS).write_bytes(data)
    rewrite(path)
    with pytest.raises(CacheError, match="unreadable header: a tensor header is nested too deep"):
        load_avatar(path)


def test_a_load_checks_the_checkpoint_hashes_started_ahead(checkpoint_dir, tmp_path: Path) -> None:
    folder = checkpoint_dir(*REGISTRATION_NETWORKS)
    hash_checkpoints_ahead(folder)
    expected = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in checkpoint_files(folder).items()}
    assert checkpoint_hashes(folder) == expected
    hash_checkpoints_ahead(
        tmp_path
    )  # no checkpoints there: nothing to start, and nothing raised before a load reports it


def outcome_within(call, seconds: float = 10.0) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised (None if none); fails if it still blocks after ``seconds``."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert raised, f"still blocked after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("name", [TENSORS, MANIFEST])
def test_a_cache_file_that_is_a_fifo_is_refused_instead_of_blocking_the_load(
    saved: tuple[Path, dict[str, np.ndarray]], name: str
) -> None:
    path, _ = saved
    (path / name).unlink()
    os.mkfifo(path / name)
    error = outcome_within(lambda: load_avatar(path.name, cache_dir=path.parent))
    assert isinstance(error, CacheError) and "is not a regular file" in str(error)


def test_the_rebuild_command_quotes_a_handed_source_path_for_the_shell(tmp_path: Path) -> None:
    tensors, manifest = fake_registration()
    hostile = "/data/my portrait.png; touch pwned"
    manifest["source"]["path"] = hostile
    command = rebuild_command(manifest, "anchor", tmp_path / "check points")
    words = shlex.split(command)
    assert words[words.index("register") + 1] == hostile
    assert words[words.index("--checkpoints") + 1] == str(tmp_path / "check points")
