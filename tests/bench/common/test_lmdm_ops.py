"""bench.common.lmdm_ops: the operators one LMDM DDIM step dispatches, plain prepared step against the fused one."""

from __future__ import annotations

import pytest
import torch

from bench.common import lmdm_ops
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


def test_at_one_window_the_fused_step_runs_one_q_k_v_product_per_layer_instead_of_two(counts) -> None:
    assert counts["plain"]["matmuls"] == 58, "7 per decoder layer, the input projection and the final layer"
    assert counts["fused"]["matmuls"] == 50, (
        "6 per decoder layer (q/k and v as one), the input projection and the final layer"
    )
    assert counts["fused"]["by_name"]["_addmm_activation"] == 8, "ff1 with its GELU in the product's epilogue"
    assert all(count["attention"] == 16 for count in counts.values())


def test_the_fused_step_drops_the_per_layer_key_value_concatenations_and_launches_fewer_operators(counts) -> None:
    plain, fused = counts["plain"], counts["fused"]
    # Fused: the input projection's one, and per layer the rotated and plain rows stacked for the q/k/v product.
    assert plain["by_name"]["cat"] == 17 and fused["by_name"]["cat"] == 1 + 8, "16 K/V concatenations per step before"
    assert fused["by_name"]["copy_"] == 1, "one write of the time-token rows for every layer"
    assert fused["ops"] < plain["ops"] - 50
