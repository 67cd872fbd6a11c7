"""Optimization profiles come from the graph's own input shapes and the ranges of its spec (engine.plans.graphs)."""

from __future__ import annotations

import re

import pytest

from compile.profiles import DEFAULT_GRAPHS, ProfileError, profile_shapes
from engine.plans.graphs import HUBERT_SAMPLES, LMDM_BATCH, RENDER_BATCH, SPECS


def test_render_graph_profile_spans_the_render_batch_range() -> None:
    graph = {"feature_3d": ("batch", 32, 16, 64, 64), "kp_source": ("batch", 21, 3), "kp_driving": ("batch", 21, 3)}
    shapes = profile_shapes(SPECS["warp_network"], graph)
    low, opt, high = RENDER_BATCH
    assert shapes["feature_3d"] == ((low, 32, 16, 64, 64), (opt, 32, 16, 64, 64), (high, 32, 16, 64, 64))
    assert shapes["kp_driving"] == ((low, 21, 3), (opt, 21, 3), (high, 21, 3))


def test_static_graph_gets_a_fixed_profile() -> None:
    assert profile_shapes(SPECS["appearance_extractor"], {"image": (1, 3, 256, 256)}) == {
        "image": ((1, 3, 256, 256),) * 3
    }


def test_lmdm_condition_width_comes_from_the_graph() -> None:
    graph = {
        "x": ("batch", 80, 265),
        "cond_frame": ("batch", 265),
        "cond": ("batch", 80, 1103),
        "time_cond": ("batch",),
    }
    shapes = profile_shapes(SPECS["lmdm"], graph)
    assert shapes["cond"] == tuple((b, 80, 1103) for b in LMDM_BATCH)
    assert shapes["time_cond"] == tuple((b,) for b in LMDM_BATCH)


def test_hubert_profile_pins_its_batch_and_ranges_its_samples() -> None:
    shapes = profile_shapes(SPECS["hubert"], {"input_values": ("batch_size", "sequence_length")})
    assert shapes["input_values"] == tuple((1, n) for n in HUBERT_SAMPLES)


@pytest.mark.parametrize(
    ("name", "graph", "message"),
    [
        ("decoder", {"features": ("batch", 256, 64, 64)}, "inputs are ['features'], expected ['feature']"),
        ("decoder", {"feature": ("batch", 256, 64)}, "rank 3, expected 4"),
        ("decoder", {"feature": ("batch", 128, 64, 64)}, "has size 128 in the graph, expected 256"),
        ("decoder", {"feature": (1, 256, 64, 64)}, "fixed (1) in the graph but dynamic"),
        (
            "lmdm",
            {"x": ("b", 80, 265), "cond_frame": ("b", 265), "cond": ("b", 80, "d"), "time_cond": ("b",)},
            "the checkpoint fixes its size",
        ),
    ],
)
def test_a_graph_that_does_not_fit_its_spec_is_refused(name, graph, message) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        profile_shapes(SPECS[name], graph)


def test_the_default_build_is_the_networks_the_engine_loads() -> None:
    assert "warp_decoder" not in DEFAULT_GRAPHS and "hubert" not in DEFAULT_GRAPHS and set(DEFAULT_GRAPHS) <= set(SPECS)
