"""Loading the torch backend's compiled packages: what a GPU package load leaves out of torch's own checks.
(Building and running packages for real: tests/compile/test_aot_build.py.)"""

from __future__ import annotations

import torch

from engine.plans.packages import Target, cpu_isa_from_cpuinfo

GPU = Target("2.11.0", "13.0", "sm_90", "float16")
CPU = Target("2.11.0", None, "cpu", "float32")


def test_gpu_packages_load_trusting_cpuinfo_for_the_cpu_vector_isa_and_the_setting_is_restored_after() -> None:
    before = torch._inductor.config.cpp.vec_isa_ok
    with cpu_isa_from_cpuinfo(GPU):
        assert torch._inductor.config.cpp.vec_isa_ok is True, "no probe programs compiled and loaded in child processes"
    assert torch._inductor.config.cpp.vec_isa_ok == before


def test_cpu_packages_keep_torchs_probe_of_the_vector_isa_their_code_runs_with() -> None:
    before = torch._inductor.config.cpp.vec_isa_ok
    with cpu_isa_from_cpuinfo(CPU):
        assert torch._inductor.config.cpp.vec_isa_ok == before
