"""Every graph's spec is consistent: half I/O names its own tensors, fp32 graphs bind nothing as fp16."""

from __future__ import annotations

from engine.plans.graphs import RENDER_BATCH, SPECS


def test_specs_are_consistent() -> None:
    for spec in SPECS.values():
        names = {*spec.input_names, *spec.output_names}
        assert set(spec.half_io) <= names, spec.name
        assert spec.precision in ("fp16", "fp32"), spec.name
        if spec.precision == "fp32":
            assert not spec.half_io and not spec.fp32_scopes, spec.name
    for name in ("warp_network", "decoder", "stitch_network", "warp_decoder"):
        assert SPECS[name].ranges["batch"] == RENDER_BATCH
    assert SPECS["motion_extractor"].precision == "fp32"  # fp16 overflows its LayerNorm/GRN statistics
