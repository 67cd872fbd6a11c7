"""``python -m compile.build_plans``: --onnx-only exports every graph with a manifest, redoes only
what changed, takes HuBERT as published, and says clearly what is missing or cannot be built."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from compile import build_plans
from compile.build_plans import main
from engine.networks import OFFICIAL_FILENAMES, write_random_checkpoints
from engine.plans.graphs import HUBERT_SAMPLES, RENDER_BATCH
from engine.plans.manifest import file_sha256, read_manifest
from tests.compile.conftest import run_build

NETWORKS = ("appearance_extractor", "motion_extractor", "warp_network", "decoder", "stitch_network", "lmdm")
no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed")


@pytest.mark.slow
def test_onnx_only_writes_every_graph_and_its_manifest(onnx_build) -> None:
    manifest = read_manifest(onnx_build.onnx_dir)
    assert manifest.kind == "onnx" and sorted(manifest.graphs) == sorted(NETWORKS)
    for name, entry in manifest.graphs.items():
        assert entry.sha256 == file_sha256(onnx_build.onnx_dir / entry.file)
        checkpoint = OFFICIAL_FILENAMES[name]
        assert entry.checkpoints == {checkpoint: file_sha256(onnx_build.checkpoints / checkpoint)}
        assert f"{name}: exporting" in onnx_build.log and f"{name}: wrote" in onnx_build.log
    assert manifest.graphs["warp_network"].settings["grid_sample"] == "gather"
    assert manifest.graphs["warp_network"].profiles["kp_source"] == [[b, 21, 3] for b in RENDER_BATCH]
    assert "hubert" not in manifest.graphs and "hubert" not in onnx_build.log, "HuBERT is built only when asked for"


@pytest.mark.slow
def test_second_run_skips_every_unchanged_graph(onnx_build) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in onnx_build.onnx_dir.glob("*.onnx")}
    status, log = run_build("--checkpoints", str(onnx_build.checkpoints), "--out", str(onnx_build.out), "--onnx-only")
    assert status == 0
    assert log.count("unchanged, skipped") == len(NETWORKS) and "exporting" not in log
    assert {p.name: p.stat().st_mtime_ns for p in onnx_build.onnx_dir.glob("*.onnx")} == before


@pytest.mark.slow
def test_merged_warp_decoder_is_composed_from_the_exported_parts(onnx_build, tmp_path: Path) -> None:
    onnx_dir = tmp_path / "plans" / "onnx"
    onnx_dir.mkdir(parents=True)
    for name in ("warp_network", "decoder"):
        (onnx_dir / f"{name}.onnx").symlink_to(onnx_build.onnx_dir / f"{name}.onnx")
    shutil.copy(onnx_build.onnx_dir / "manifest.json", onnx_dir / "manifest.json")
    status, log = run_build(
        "--checkpoints",
        str(onnx_build.checkpoints),
        "--out",
        str(tmp_path / "plans"),
        "--onnx-only",
        "--networks",
        "warp_decoder",
    )
    assert status == 0
    assert "warp_network: unchanged, skipped" in log and "decoder: unchanged, skipped" in log
    assert "warp_decoder: composing warp_network.onnx and decoder.onnx" in log
    graphs = read_manifest(onnx_dir).graphs
    entry = graphs["warp_decoder"]
    assert set(entry.checkpoints) == {"warp_network.pth", "decoder.pth"}
    assert entry.settings["composed_from"] == {n: graphs[n].sha256 for n in ("warp_network", "decoder")}
    assert entry.profiles["feature_3d"][2] == [RENDER_BATCH[2], 32, 16, 64, 64]


def test_changed_checkpoint_missing_or_altered_graph_is_redone(tmp_path: Path) -> None:
    checkpoints, out = tmp_path / "models", tmp_path / "plans"
    write_random_checkpoints(checkpoints, seed=0, names=("stitch_network",))
    args = ("--checkpoints", str(checkpoints), "--out", str(out), "--onnx-only", "--networks", "stitch_network")
    graph = out / "onnx" / "stitch_network.onnx"
    assert "stitch_network: exporting" in run_build(*args)[1]
    first = file_sha256(graph)
    assert "unchanged, skipped" in run_build(*args)[1]
    write_random_checkpoints(checkpoints, seed=1, names=("stitch_network",))
    assert "stitch_network: exporting" in run_build(*args)[1]
    assert file_sha256(graph) != first
    graph.write_bytes(b"not the exported graph")
    assert "stitch_network: exporting" in run_build(*args)[1]
    graph.unlink()
    assert "stitch_network: exporting" in run_build(*args)[1]
    assert read_manifest(out / "onnx").graphs["stitch_network"].sha256 == file_sha256(graph)


def test_random_weights_fill_in_only_missing_checkpoints(tmp_path: Path) -> None:
    checkpoints = tmp_path / "models"
    write_random_checkpoints(checkpoints, seed=0, names=tuple(n for n in NETWORKS if n != "stitch_network"))
    kept = {f.name: f.stat().st_mtime_ns for f in checkpoints.iterdir()}
    status, log = run_build(
        "--checkpoints",
        str(checkpoints),
        "--out",
        str(tmp_path / "plans"),
        "--onnx-only",
        "--random-weights",
        "--networks",
        "stitch_network",
    )
    assert status == 0 and "writing random checkpoints for stitch_network" in log and "not faces" in log
    assert (checkpoints / OFFICIAL_FILENAMES["stitch_network"]).is_file()
    assert {f.name: f.stat().st_mtime_ns for f in checkpoints.iterdir() if f.name in kept} == kept


class _AudioEncoderStandIn(torch.nn.Module):
    """HuBERT's I/O contract only: (1, samples) at 16 kHz -> (frames, 1024), 20 ms hop, 25 ms window."""

    def __init__(self) -> None:
        super().__init__()
        self.frames = torch.nn.Conv1d(1, 1024, kernel_size=400, stride=320)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.frames(input_values.unsqueeze(1))[0].transpose(0, 1)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_download_root_is_accepted_and_hubert_onnx_taken_as_published(tmp_path: Path) -> None:
    checkpoints, aux = tmp_path / "ditto_pytorch" / "models", tmp_path / "ditto_pytorch" / "aux_models"
    write_random_checkpoints(checkpoints, seed=0, names=("stitch_network",))
    aux.mkdir()
    hubert = aux / "hubert_streaming_fix_kv.onnx"
    torch.onnx.export(
        _AudioEncoderStandIn(),
        (torch.zeros(1, 6480),),
        str(hubert),
        dynamo=False,
        opset_version=17,
        input_names=["input_values"],
        output_names=["encoding_out"],
        dynamic_axes={"input_values": {1: "samples"}, "encoding_out": {0: "frames"}},
    )
    status, log = run_build(  # the root of the official download, as huggingface-cli writes it
        "--checkpoints",
        str(tmp_path),
        "--out",
        str(tmp_path / "plans"),
        "--onnx-only",
        "--networks",
        "stitch_network",
        "hubert",
    )
    assert status == 0 and "hubert: taken as published" in log
    entry = read_manifest(tmp_path / "plans" / "onnx").graphs["hubert"]
    assert Path(entry.file) == hubert.resolve() and entry.sha256 == file_sha256(hubert)
    assert entry.profiles == {"input_values": [[1, n] for n in HUBERT_SAMPLES]}
    assert not (tmp_path / "plans" / "onnx" / "hubert.onnx").exists()


@no_tensorrt
def test_full_tensorrt_build_without_tensorrt_says_so_before_exporting(tmp_path: Path, capsys) -> None:
    assert main(["--checkpoints", str(tmp_path), "--out", str(tmp_path / "plans"), "--builder", "tensorrt"]) == 2
    error = capsys.readouterr().err
    assert "TensorRT is not installed" in error and "pip install 'tensorrt" in error and "--onnx-only" in error
    assert not (tmp_path / "plans").exists()


@no_tensorrt
def test_aot_only_builds_the_torch_packages_without_asking_for_a_tensorrt_builder(tmp_path: Path, monkeypatch) -> None:
    built = []  # the packages' build itself is tests/compile/test_aot_build.py's; here only what --aot only asks for
    monkeypatch.setattr(
        build_plans, "build_aot", lambda checkpoints, out, steps, jobs: built.append((out, steps, jobs))
    )
    args = ["--checkpoints", str(tmp_path / "models"), "--random-weights", "--out", str(tmp_path / "plans")]
    assert main([*args, "--aot", "only", "--builder", "tensorrt", "--steps", "7", "--aot-jobs", "2"]) == 0
    assert built == [(tmp_path / "plans", 7, 2)]


def test_tensorrt_rtx_build_refuses_what_it_cannot_target(tmp_path: Path, capsys) -> None:
    pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is not installed")
    args = ["--checkpoints", str(tmp_path), "--out", str(tmp_path / "plans")]
    assert main([*args, "--arch", "sm_90"]) == 2
    assert "TensorRT-RTX cannot build for sm_90" in capsys.readouterr().err
    assert main([*args, "--hardware-compat", "ampere+"]) == 2
    assert "--hardware-compat is for full TensorRT" in capsys.readouterr().err
    assert not (tmp_path / "plans").exists()


def test_check_or_checkpoints_is_required(capsys) -> None:
    assert main([]) == 2
    assert "--checkpoints DIR is required" in capsys.readouterr().err


def test_check_of_a_directory_without_plans_says_so(tmp_path: Path, capsys) -> None:
    assert main(["--check", str(tmp_path)]) == 1
    assert "no plan directory" in capsys.readouterr().out


def test_missing_checkpoint_is_named_with_where_to_get_it(tmp_path: Path, capsys) -> None:
    args = ["--checkpoints", str(tmp_path), "--out", str(tmp_path / "plans"), "--onnx-only", "--networks", "decoder"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "decoder.pth" in error and "ditto_pytorch/models" in error and "--random-weights" in error


def test_requested_hubert_that_is_absent_is_an_error(tmp_path: Path, capsys) -> None:
    args = ["--checkpoints", str(tmp_path), "--out", str(tmp_path / "plans"), "--onnx-only", "--networks", "hubert"]
    assert main(args) == 2
    assert "aux_models/hubert_streaming_fix_kv.onnx" in capsys.readouterr().err


def test_building_without_checkpoints_points_at_random_weights(tmp_path: Path, capsys) -> None:
    assert main(["--onnx-only"]) == 2
    assert "--random-weights" in capsys.readouterr().err
    assert main(["--checkpoints", str(tmp_path / "none"), "--onnx-only"]) == 2
    assert "is not a directory" in (error := capsys.readouterr().err) and "--random-weights" in error


def test_check_of_an_onnx_folder_says_how_to_build_plans_from_it(tmp_path: Path, capsys) -> None:
    from compile.manifest import write_manifest
    from engine.plans.manifest import Manifest

    (tmp_path / "onnx").mkdir()
    write_manifest(
        tmp_path / "onnx", Manifest(kind="onnx", checkpoints_dir="/ckpt", created="2026-01-01T00:00:00+00:00")
    )
    assert main(["--check", str(tmp_path / "onnx")]) == 1
    out = capsys.readouterr().out
    assert f"python -m compile.build_plans --checkpoints /ckpt --out {tmp_path}" in out
    assert f"--check {tmp_path}" in out
