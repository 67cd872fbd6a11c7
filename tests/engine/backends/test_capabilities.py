"""Backends declare their fast paths in ``capabilities``; a path a backend lacks refuses clearly."""

from __future__ import annotations

import pytest
import torch

from engine.audio.hubert import TorchHubertRunner
from engine.audio.standin_hubert import build_standin
from engine.backends.base import Backend, BackendError, Capabilities
from engine.backends.tensorrt_backend import TensorRTBackend
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.ddim import ddim_steps, denoiser_step
from engine.engine import Engine


def test_a_backend_offers_no_fast_path_unless_it_says_so() -> None:
    assert Backend.capabilities == Capabilities() == Capabilities(fused_ddim_step=False, render_graphs=False)
    assert TensorRTBackend.capabilities == Capabilities(), "the plans run the plain denoiser and render calls"


def test_the_torch_backend_on_the_cpu_has_the_fused_step_and_no_render_graphs(checkpoint_dir) -> None:
    backend = TorchBackend(checkpoint_dir("lmdm", "stitch_network"), device="cpu", networks=("lmdm", "stitch_network"))
    assert backend.capabilities == Capabilities(fused_ddim_step=True, render_graphs=False)
    with pytest.raises(BackendError, match=r"captures no render graphs \(capabilities.render_graphs\)"):
        backend.capture_render((5,))
    assert backend.captures == 0


def test_the_engine_samples_with_the_fused_step_where_the_backend_has_it(checkpoint_dir) -> None:
    backend = TorchBackend(checkpoint_dir("lmdm", "stitch_network"), device="cpu", networks=("lmdm", "stitch_network"))
    sampler = Engine(backend, TorchHubertRunner(build_standin()), steps=3).sampler()
    assert sampler.step == backend.lmdm_step
    without = TorchBackend(checkpoint_dir("stitch_network"), device="cpu", networks=("stitch_network",))
    assert not without.capabilities.fused_ddim_step
    with pytest.raises(BackendError, match="no fused DDIM step"):
        without.lmdm_prepare(torch.zeros(1, 80, 1103), torch.zeros(3, dtype=torch.int64))
    x, cond_frame, cond = torch.randn(1, 80, 265), torch.randn(1, 265), torch.randn(1, 80, 1103)
    noise = torch.randn(2, 1, 80, 265)
    fused = sampler(x, cond_frame, cond, noise)
    plain = ddim_steps(denoiser_step(backend.lmdm), x, cond_frame, cond, sampler.schedule, noise)
    assert ((fused - plain).norm() / plain.norm()).item() < 1e-4
