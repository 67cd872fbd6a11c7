"""Building and loading the torch backend's compiled packages: what GPU packages leave out of torch's own checks.
(Building and running packages for real: tests/compile/test_aot_build.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.plans.manifest import MAX_DEPTH
from engine.plans.package_loader import without_cpu_isa_probe
from engine.plans.packages import FORMAT, PackageManifest, StalePackages

PROBES_UNDER = """
import json
import torch
from torch._inductor import codecache, cpu_vec_isa
from engine.plans.package_loader import without_cpu_isa_probe
probes = []
cpu_vec_isa.VecISA.check_build = lambda self, code: probes.append(str(self)) or True
with without_cpu_isa_probe("sm_90"):
    isa = codecache.get_device_information("cpu")["AOTI_CPU_ISA"]
print(json.dumps({"isa": isa, "none": str(cpu_vec_isa.invalid_vec_isa).upper(), "probes": probes, "after": torch._inductor.config.cpp.vec_isa_ok}))
"""


def test_gpu_packages_load_without_compiling_any_vector_isa_probe_and_the_setting_is_restored_after() -> None:
    # A fresh process: torch caches each ISA's answer for the rest of a process.
    run = subprocess.run([sys.executable, "-c", PROBES_UNDER], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen["probes"] == [], "no probe program compiled, the AVX-512 bf16 and AMX ones included"
    assert seen["isa"] == seen["none"], "the device information a package is compared with names no CPU ISA, as its build recorded"
    assert seen["after"] is None, "torch's own setting is back once the packages are loaded"


def test_cpu_packages_keep_torchs_probe_of_the_vector_isa_their_code_runs_with() -> None:
    before = torch._inductor.config.cpp.vec_isa_ok
    with without_cpu_isa_probe("cpu"):
        assert torch._inductor.config.cpp.vec_isa_ok == before


def test_a_deeply_nested_package_manifest_is_refused_as_stale_not_a_recursion_error(tmp_path: Path) -> None:
    for depth in (100_000, MAX_DEPTH + 1):
        text = '{"format": %d, "packages": %s%s}' % (FORMAT, "[" * depth, "]" * depth)
        with pytest.raises(StalePackages, match="nested"):
            PackageManifest.from_json(text, tmp_path / "manifest.json")
