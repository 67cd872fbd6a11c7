"""bench.lmdm_ops: the operators one LMDM DDIM step dispatches, plain prepared step against the fused one."""

from __future__ import annotations

import pytest
import torch

from bench import lmdm_ops
from engine.diffusion.schedule import ddim_schedule
from engine.networks import lmdm


@pytest.fixture(scope="module")
def counts() -> dict[str, dict]:
    net = lmdm.build()
    lmdm.randomize(net, torch.Generator().manual_seed(5))
    lmdm.finalize(net)
    net.requires_grad_(False)
    schedule = ddim_schedule(25)
    result = {}
    for name, make in (("plain", lmdm_ops.plain_variant), ("fused", lmdm_ops.fused_variant)):
        variant = make(net)
        with torch.inference_mode():
            inputs = lmdm_ops.step_inputs(net, schedule, 1, variant.prepare, torch.device("cpu"))
        result[name] = lmdm_ops.count_aten(variant.step, inputs)
    return result


def test_both_steps_run_the_same_58_matmuls_and_16_attentions(counts) -> None:
    for count in counts.values():
        assert count["matmuls"] == 58, "7 per decoder layer, the input projection and the final layer"
        assert count["attention"] == 16


def test_the_fused_step_drops_the_per_layer_key_value_concatenations_and_launches_fewer_operators(counts) -> None:
    plain, fused = counts["plain"], counts["fused"]
    assert plain["by_name"]["cat"] == 17 and fused["by_name"]["cat"] == 1, "16 K/V concatenations per step before"
    assert fused["by_name"]["copy_"] == 1, "one write of the time-token rows for every layer"
    assert fused["ops"] < plain["ops"] - 50
