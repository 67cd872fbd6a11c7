"""The builder names each plan directory after its library, version and target."""

from __future__ import annotations

from compile.manifest import plan_dir_name
from engine.plans.libraries import FULL, RTX


def test_plan_directories_are_named_per_builder() -> None:
    assert plan_dir_name(RTX, "1.7.1.116", ["sm_89", "sm_120"]) == "rtx1.7.1.116"
    assert plan_dir_name(FULL, "10.8.0", ["sm_89"]) == "sm_89-trt10.8.0"
    assert plan_dir_name(FULL, "10.8.0", ["sm_89"], "ampere+") == "ampere_plus-trt10.8.0"
