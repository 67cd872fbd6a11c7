"""Manifests round-trip as plain JSON, reject malformed files, and name the plans to rebuild."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from compile.manifest import write_manifest
from engine.backends.base import BackendError
from engine.plans.checks import PlanMismatch, check_plans, rebuild_command
from engine.plans.libraries import FULL, RTX
from engine.plans.manifest import MANIFEST_FILE, GraphEntry, Manifest, ManifestError, file_sha256, plan_dirs, read_manifest
from engine.plans.targets import compute_capability_name, parse_compute_capability

CHECKPOINT_SHA = "c" * 64


def make_plans(directory: Path, **overrides) -> Manifest:
    """A plan directory with two small 'plan' files and their manifest, as build_plans writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for name in ("decoder", "stitch_network"):
        (directory / f"{name}.plan").write_bytes(name.encode() * 100)
        graphs[name] = GraphEntry(
            file=f"{name}.plan",
            sha256=file_sha256(directory / f"{name}.plan"),
            checkpoints={f"{name}.pth": CHECKPOINT_SHA},
            precision="fp16" if name == "decoder" else "fp32",
            profiles={"feature": [[1, 256, 64, 64], [5, 256, 64, 64], [10, 256, 64, 64]]},
            settings={"builder_optimization_level": 5},
            onnx_sha256="0" * 64,
            built_at="2026-01-01T00:00:00+00:00",
            seconds=12.5,
            io={"inputs": [{"name": "feature", "shape": [-1, 256, 64, 64], "dtype": "float16"}], "outputs": []},
        )
    manifest = Manifest(
        kind="plans", checkpoints_dir="/ckpt", builder=FULL, builder_version="10.8.0",
        compute_capabilities=["sm_89"], gpu_name="NVIDIA GeForce RTX 4090",
        build_flags={"builder_optimization_level": 5}, graphs=graphs, created="2026-01-01T00:00:00+00:00",
    )
    manifest = replace(manifest, **overrides)
    write_manifest(directory, manifest)
    return manifest


def check(directory: Path, manifest: Manifest, **overrides) -> None:
    kwargs = dict(
        graphs=["decoder", "stitch_network"],
        checkpoint_sha256={"decoder.pth": CHECKPOINT_SHA, "stitch_network.pth": CHECKPOINT_SHA},
    )
    check_plans(directory, manifest, **{**kwargs, **overrides})


def test_round_trip_is_plain_json(tmp_path) -> None:
    written = make_plans(tmp_path)
    assert read_manifest(tmp_path) == written
    raw = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert raw["graphs"]["decoder"]["checkpoints"] == {"decoder.pth": CHECKPOINT_SHA}
    assert raw["builder"] == "tensorrt" and raw["builder_version"] == "10.8.0"
    assert raw["compute_capabilities"] == ["sm_89"]
    feature = {"name": "feature", "shape": [-1, 256, 64, 64], "dtype": "float16"}
    assert raw["graphs"]["decoder"]["io"]["inputs"][0] == feature


def _graph(raw: dict, **changes) -> str:
    """The manifest with the decoder's entry changed."""
    return json.dumps({**raw, "graphs": {**raw["graphs"], "decoder": {**raw["graphs"]["decoder"], **changes}}})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda raw: "not json {", "not readable JSON"),
        (lambda raw: json.dumps([1, 2]), "not a JSON object"),
        (lambda raw: json.dumps({**raw, "format": 99}), "format 99"),
        (lambda raw: json.dumps({**raw, "kind": "pickles"}), "kind 'pickles'"),
        (lambda raw: json.dumps({k: v for k, v in raw.items() if k != "gpu_name"}), "lacks ['gpu_name']"),
        (lambda raw: json.dumps({**raw, "builder_version": 10}), "'builder_version' is 10"),
        (lambda raw: json.dumps({**raw, "builder": "onnxruntime"}), "builder 'onnxruntime'"),
        (lambda raw: json.dumps({**raw, "compute_capabilities": ["ada"]}), "compute capability 'ada'"),
        (lambda raw: json.dumps({**raw, "format": 1}), "format 1"),  # the format before builders and targets
        (lambda raw: json.dumps({**raw, "graphs": {"decoder": {**raw["graphs"]["decoder"], "seconds": "x"}}}), "'seconds'"),
        (lambda raw: json.dumps({**raw, "compute_capabilities": [89]}), "compute capability 89"),
        (lambda raw: json.dumps({**raw, "checkpoints_dir": "/ckpt\n--out /"}), "'checkpoints_dir'"),
        (lambda raw: json.dumps({**raw, "build_flags": {"grid_sample": ["x"]}}), "'build_flags'"),
        (lambda raw: json.dumps({**raw, "graphs": {"../decoder": raw["graphs"]["decoder"]}}), "graph '../decoder'"),
        (lambda raw: _graph(raw, file="../../etc/hostname"), "'file' is '../../etc/hostname'"),
        (lambda raw: _graph(raw, file="/etc/hostname"), "'file' is '/etc/hostname'"),
        (lambda raw: _graph(raw, file=".."), "'file' is '..'"),
        (lambda raw: _graph(raw, sha256="x"), "'sha256'"),
        (lambda raw: _graph(raw, onnx_sha256=7), "'onnx_sha256'"),
        (lambda raw: _graph(raw, checkpoints={"decoder.pth": 5}), "'checkpoints'"),
        (lambda raw: _graph(raw, profiles={"feature": "1,256"}), "'profiles'"),
        (lambda raw: _graph(raw, profiles={"feature": [[1, True, 64, 64]] * 3}), "'profiles'"),
        (lambda raw: _graph(raw, io={"inputs": [{"name": 1, "shape": [1], "dtype": "float16"}], "outputs": []}), "'io'"),
        (lambda raw: _graph(raw, io={"inputs": [{"name": "x", "shape": [1], "dtype": "load"}], "outputs": []}), "'io'"),
        (lambda raw: _graph(raw, io={"inputs": "x"}), "'io'"),
        (lambda raw: _graph(raw, seconds=float("nan")), "'seconds'"),
        (lambda raw: _graph(raw, precision="fp16\x1b[2J"), "'precision'"),
        (lambda raw: json.dumps(raw)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
    ],
)
def test_malformed_manifests_are_refused_by_name(tmp_path, edit, message) -> None:
    make_plans(tmp_path)
    path = tmp_path / MANIFEST_FILE
    path.write_text(edit(json.loads(path.read_text())))
    with pytest.raises(ManifestError, match=re.escape(message)) as caught:
        read_manifest(tmp_path)
    assert str(path) in str(caught.value)


def test_missing_manifest_says_who_writes_it(tmp_path) -> None:
    with pytest.raises(ManifestError, match="compile.build_plans"):
        read_manifest(tmp_path)


def test_matching_machine_passes(tmp_path) -> None:
    check(tmp_path, make_plans(tmp_path))


def test_changed_checkpoint_names_the_plan_and_the_command(tmp_path) -> None:
    manifest = make_plans(tmp_path)
    with pytest.raises(PlanMismatch) as caught:
        check(tmp_path, manifest, checkpoint_sha256={"decoder.pth": "d" * 64, "stitch_network.pth": CHECKPOINT_SHA})
    message = str(caught.value)
    assert "decoder: decoder.plan was built from a decoder.pth with sha256 cccccccccccc" in message
    assert "stitch_network:" not in message
    assert "python -m compile.build_plans --checkpoints /ckpt --networks decoder" in message


def test_missing_or_altered_plan_file_is_named(tmp_path) -> None:
    manifest = make_plans(tmp_path)
    (tmp_path / "decoder.plan").unlink()
    (tmp_path / "stitch_network.plan").write_bytes(b"truncated")
    with pytest.raises(PlanMismatch) as caught:
        check(tmp_path, manifest)
    message = str(caught.value)
    assert "decoder.plan is missing" in message and "stitch_network.plan differs" in message
    assert "--networks decoder stitch_network" in message
    assert isinstance(caught.value, BackendError)  # the engine treats it as 'this backend cannot run here'


def test_graph_absent_from_the_manifest_is_named(tmp_path) -> None:
    manifest = make_plans(tmp_path)
    with pytest.raises(PlanMismatch, match="lmdm: no plan in"):
        check(tmp_path, manifest, graphs=["decoder", "lmdm"])


def test_onnx_directory_is_not_a_plan_directory(tmp_path) -> None:
    manifest = make_plans(tmp_path, kind="onnx")
    with pytest.raises(PlanMismatch, match="holds ONNX graphs, not TensorRT plans"):
        check(tmp_path, manifest)


def test_recipe_ignores_file_hash_and_time_but_not_inputs() -> None:
    entry = GraphEntry("a.onnx", "1" * 64, {"a.pth": "2" * 64}, "fp32", {}, {"opset": 17})
    assert entry.same_recipe(replace(entry, sha256="3" * 64, built_at="later", seconds=99.0))
    assert not entry.same_recipe(replace(entry, checkpoints={"a.pth": "4" * 64}))
    assert not entry.same_recipe(replace(entry, settings={"opset": 20}))


def test_compute_capability_names() -> None:
    assert compute_capability_name(8, 9) == "sm_89" and compute_capability_name(12, 0) == "sm_120"
    assert parse_compute_capability("sm_120") == (12, 0) and parse_compute_capability("sm_86") == (8, 6)
    with pytest.raises(ValueError, match="sm_XY"):
        parse_compute_capability("ada")


def test_plan_directories_are_found_under_a_root(tmp_path) -> None:
    assert plan_dirs(tmp_path) == [] and plan_dirs(tmp_path / "absent") == []
    make_plans(tmp_path / "sm_89-trt10.8.0")
    make_plans(tmp_path / "onnx", kind="onnx")  # the ONNX directory is not a plan directory
    make_plans(tmp_path / "rtx1.7.1.116", builder=RTX, builder_version="1.7.1.116")
    assert plan_dirs(tmp_path) == [tmp_path / "rtx1.7.1.116", tmp_path / "sm_89-trt10.8.0"]
    assert plan_dirs(tmp_path / "sm_89-trt10.8.0") == [tmp_path / "sm_89-trt10.8.0"]


def test_rebuild_command_keeps_the_target_options() -> None:
    manifest = Manifest(
        kind="plans", checkpoints_dir="/m", hardware_compat="ampere+", build_flags={"grid_sample": "opset20"}
    )
    assert rebuild_command(manifest, ["lmdm"], "plans") == (
        "python -m compile.build_plans --checkpoints /m --networks lmdm --out plans "
        "--hardware-compat ampere+ --grid-sample opset20"
    )


def test_rebuild_command_of_tensorrt_rtx_plans_names_builder_and_targets() -> None:
    manifest = Manifest(
        kind="plans", checkpoints_dir="/m", builder=RTX, builder_version="1.7.1.116",
        compute_capabilities=["sm_89", "sm_120"],
    )
    assert rebuild_command(manifest, ["decoder"]) == (
        "python -m compile.build_plans --checkpoints /m --networks decoder --builder rtx --arch sm_89 sm_120"
    )


def test_only_an_onnx_manifest_may_name_a_published_graph_outside_its_folder(tmp_path) -> None:
    """build_plans records the published HuBERT graph it takes by its absolute path; a plan is always beside its
    manifest."""
    published = {"file": str(tmp_path / "hubert.onnx"), "settings": {"source": "published"}, "io": {}}
    manifest = make_plans(tmp_path / "onnx", kind="onnx", builder=None, builder_version=None, compute_capabilities=[])
    raw = json.loads((tmp_path / "onnx" / MANIFEST_FILE).read_text())
    (tmp_path / "onnx" / MANIFEST_FILE).write_text(_graph(raw, **published))
    assert read_manifest(tmp_path / "onnx").graphs["decoder"].file == published["file"]
    assert manifest.kind == "onnx"
    make_plans(tmp_path / "plans")
    raw = json.loads((tmp_path / "plans" / MANIFEST_FILE).read_text())
    (tmp_path / "plans" / MANIFEST_FILE).write_text(_graph(raw, **published))
    with pytest.raises(ManifestError, match="'file' is .*not a file name in the manifest's folder"):
        read_manifest(tmp_path / "plans")
