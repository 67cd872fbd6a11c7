"""Ahead-of-time compiled packages of the torch backend, built for real on the CPU (AOTInductor with the system C++
compiler): the backend runs them in place of its own calls with the same results, and refuses any package that does
not fit this process, these checkpoints or its manifest, saying why. (GPU packages are built the same way on a GPU.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from compile.aot_build import build_packages
from engine.backends.aot_calls import step_inputs
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.schedule import ddim_schedule
from engine.engine import Engine
from engine.networks import OFFICIAL_FILENAMES
from engine.networks.lmdm_fused import FusedLMDMStep
from engine.plans import package_loader
from engine.plans.packages import MANIFEST_FILE, PackageManifest, Target

pytestmark = pytest.mark.slow
STEPS = 3
LMDM_CALLS = ("lmdm_prepare", "lmdm_step")


@dataclass(frozen=True)
class Built:
    checkpoints: Path
    plans: Path
    folder: Path
    manifest: PackageManifest


@pytest.fixture(scope="module")
def built(checkpoint_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The LMDM's two calls compiled for the CPU at batch 1 (the render's decoder takes minutes to compile on a CPU)."""
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++")):
        pytest.skip("no C++ compiler (c++, g++ or $CXX): AOTInductor compiles the packages with one")
    checkpoints = checkpoint_dir("lmdm")
    plans = tmp_path_factory.mktemp("aot-plans")
    backend = TorchBackend(checkpoints, device="cpu", networks=("lmdm",))
    manifest = build_packages(
        backend, checkpoints, plans, STEPS, window_buckets=(1,), render_buckets=(), calls=LMDM_CALLS, progress=False
    )
    return Built(checkpoints, plans, plans / Target.here(torch.device("cpu"), torch.float32).folder(), manifest)


def copy_of(built: Built, tmp_path: Path) -> Path:
    """A copy of the built plans that a test may spoil."""
    shutil.copytree(built.plans, tmp_path / "plans")
    return tmp_path / "plans"


def backend_with(built: Built, plans: Path, steps: int = STEPS) -> TorchBackend:
    backend = TorchBackend(built.checkpoints, device="cpu", networks=("lmdm",))
    backend.load_packages(plans, steps)
    return backend


def test_the_build_writes_one_package_per_call_and_bucket_and_a_manifest_naming_each_file_and_its_hash(
    built: Built,
) -> None:
    manifest = json.loads((built.folder / MANIFEST_FILE).read_text())
    assert {(p["call"], p["batch"]) for p in manifest["packages"]} == {("lmdm_prepare", 1), ("lmdm_step", 1)}
    assert manifest["target"]["device"] == "cpu" and manifest["target"]["torch"] == torch.__version__
    assert manifest["steps"] == STEPS and set(manifest["checkpoints"]) == {"lmdm"}
    for package in manifest["packages"]:
        assert (built.folder / package["file"]).stat().st_size > 0 and len(package["sha256"]) == 64
        assert len(package["weights"]) == 64, "the layout of the weights it runs on"


def test_a_package_holds_no_weights_of_its_own_so_every_bucket_runs_on_the_backends_one_copy(built: Built) -> None:
    checkpoint = (built.checkpoints / OFFICIAL_FILENAMES["lmdm"]).stat().st_size
    for package in built.manifest.packages:
        assert (built.folder / package.file).stat().st_size < checkpoint / 5, package


@pytest.mark.parametrize("loader", ["torch's C++ loader", "the public loader, where the C++ one has another shape"])
def test_the_backend_runs_the_packages_with_the_results_of_its_own_calls(
    built: Built, loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loader.startswith("the public"):

        def another_shape(loader: object) -> None:
            raise TypeError("this torch's loader takes other arguments")

        monkeypatch.setattr(package_loader, "OpenedPackage", another_shape)
    backend = backend_with(built, built.plans)
    assert backend.packages_status.startswith("2 compiled packages for cpu"), backend.packages_status
    schedule = ddim_schedule(STEPS, torch.device("cpu"))
    fused = FusedLMDMStep(backend.network("lmdm"), backend.dtype)
    generator = torch.Generator().manual_seed(0)
    cond = torch.randn(1, 80, backend.cond_width, generator=generator)
    with torch.inference_mode():
        expected, window = fused.prepare_window(cond, schedule.times), backend.lmdm_prepare(cond, schedule.times)
        for name in ("time_kv", "modulation", "step_of_time"):
            torch.testing.assert_close(getattr(window, name), getattr(expected, name), rtol=1e-3, atol=1e-4)
        x, cond_frame, *_, noise = step_inputs(fused, schedule, 1, backend.cond_width)
        x, cond_frame, noise = (torch.randn(t.shape, generator=generator) for t in (x, cond_frame, noise))
        for i in range(STEPS):
            args = (cond_frame, schedule.times[i].expand(1), schedule.coefficients[i], noise)
            mine = backend.lmdm_step(x, args[0], window, *args[1:])
            theirs = fused.ddim_step(x, args[0], expected, *args[1:])
            torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)
            x = theirs
    assert backend.package_calls == 1 + STEPS, "every call ran in its package"


def test_a_second_build_keeps_what_did_not_change(built: Built, tmp_path: Path) -> None:
    plans = copy_of(built, tmp_path)
    backend = TorchBackend(built.checkpoints, device="cpu", networks=("lmdm",))
    again = build_packages(
        backend,
        built.checkpoints,
        plans,
        STEPS,
        window_buckets=(1,),
        render_buckets=(),
        calls=LMDM_CALLS,
        progress=False,
    )
    assert [(p.file, p.sha256, p.seconds) for p in again.packages] == [
        (p.file, p.sha256, p.seconds) for p in built.manifest.packages
    ]


def test_packages_built_in_two_processes_are_the_ones_one_process_builds(built: Built, tmp_path: Path) -> None:
    backend = TorchBackend(built.checkpoints, device="cpu", networks=("lmdm",))
    apart = build_packages(
        backend,
        built.checkpoints,
        tmp_path,
        STEPS,
        window_buckets=(1,),
        render_buckets=(),
        calls=LMDM_CALLS,
        progress=False,
        jobs=2,
    )
    assert [(p.call, p.batch, p.file, p.weights) for p in apart.packages] == [
        (p.call, p.batch, p.file, p.weights) for p in built.manifest.packages
    ]
    assert backend_with(built, tmp_path).packages_status.startswith("2 compiled packages for cpu")


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda m, folder: m["target"].update(torch="2.0.0"), "built for torch 2.0.0"),
        (lambda m, folder: m.update(steps=25), f"built for 25 DDIM steps, this engine samples {STEPS}"),
        (lambda m, folder: m["checkpoints"].update(lmdm="0" * 64), "built from another lmdm checkpoint"),
        (
            lambda m, folder: (folder / m["packages"][0]["file"]).open("ab").write(b"\0"),
            "its sha256 is not the manifest's",
        ),
        (lambda m, folder: (folder / m["packages"][1]["file"]).unlink(), "named by the manifest but missing"),
        (lambda m, folder: m["packages"][0].update(weights="0" * 64), "compiled for another layout of its weights"),
        (
            lambda m, folder: m["packages"][0].update(file="../../elsewhere.pt2"),
            "a package entry is not one this engine makes",
        ),
    ],
    ids=["torch release", "steps", "checkpoint", "altered file", "missing file", "weights layout", "path outside"],
)
def test_a_package_that_does_not_fit_is_refused_saying_why_and_the_backend_keeps_its_own_path(
    built: Built, tmp_path: Path, spoil, reason: str
) -> None:
    plans = copy_of(built, tmp_path)
    folder = plans / built.folder.name
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    spoil(manifest, folder)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    backend = backend_with(built, plans)
    assert backend.packages_status.startswith("compiled packages not used") and reason in backend.packages_status, (
        backend.packages_status
    )
    with torch.inference_mode():
        backend.lmdm_prepare(torch.zeros(1, 80, backend.cond_width), ddim_schedule(STEPS, torch.device("cpu")).times)
    assert backend.package_calls == 0


def test_no_packages_and_a_corrupt_manifest_are_each_named(built: Built, tmp_path: Path) -> None:
    assert "no compiled packages for cpu" in backend_with(built, tmp_path).packages_status
    plans = copy_of(built, tmp_path)
    (plans / built.folder.name / MANIFEST_FILE).write_text("{not json")
    assert "not a package manifest" in backend_with(built, plans).packages_status


LOAD_AND_RUN = """
import sys
import torch
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.schedule import ddim_schedule
from engine.engine import Engine
backend = TorchBackend(sys.argv[1], device="cpu", networks=("lmdm",))
print(backend.load_packages(sys.argv[2], int(sys.argv[3])))
cond = torch.randn(1, 80, backend.cond_width)
backend.lmdm_prepare(cond, ddim_schedule(int(sys.argv[3]), torch.device("cpu")).times)
print(backend.package_calls, "torch._dynamo" in sys.modules, "torch._inductor" in sys.modules)
"""


def test_a_start_on_packages_never_imports_the_compiler(built: Built) -> None:
    run = subprocess.run(
        [sys.executable, "-c", LOAD_AND_RUN, str(built.checkpoints), str(built.plans), str(STEPS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    status, counts = run.stdout.strip().splitlines()[-2:]
    assert status.startswith("2 compiled packages"), status
    assert counts == "1 False False", "one call served by a package, and neither dynamo nor inductor imported"


def test_an_engine_made_with_plans_checks_and_loads_the_packages(
    built: Built, checkpoint_dir: Callable[..., Path]
) -> None:
    engine = Engine.from_checkpoints(checkpoint_dir(), device="cpu", steps=STEPS, plans=built.plans)
    assert engine.backend.packages_status.startswith("2 compiled packages for cpu"), engine.backend.packages_status
