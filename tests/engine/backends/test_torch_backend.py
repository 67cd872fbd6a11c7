"""The torch backend loads the networks it is asked for, in the dtype each needs on its device, and says clearly
what it cannot do: a network it did not load, a GPU torch does not see; it compiles a network only when a call needs
it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from engine.backends.base import BackendError
from engine.backends.torch_backend import CompiledOnFirstCall, TorchBackend


def test_only_the_networks_asked_for_are_loaded_and_another_one_is_refused_by_name(checkpoint_dir) -> None:
    backend = TorchBackend(checkpoint_dir("stitch_network"), device="cpu", networks=("stitch_network",))
    assert isinstance(backend.network("stitch_network"), torch.nn.Module)
    with pytest.raises(BackendError, match="network 'decoder' was not loaded by this backend"):
        backend.network("decoder")
    assert backend.cond_width == 0, "no LMDM, no condition width"


def test_on_the_cpu_every_network_runs_in_fp32_eagerly(checkpoint_dir) -> None:
    backend = TorchBackend(checkpoint_dir("lmdm", "stitch_network"), device="cpu", networks=("lmdm", "stitch_network"))
    assert backend.dtype == torch.float32
    assert all(
        p.dtype == torch.float32 for name in ("lmdm", "stitch_network") for p in backend.network(name).parameters()
    )
    assert backend.cond_width == 1103
    assert backend.packages_status == "eager (no compiled packages asked for)"
    assert backend.package_calls == 0


def test_stitching_takes_keypoints_in_any_float_dtype(checkpoint_dir) -> None:
    backend = TorchBackend(checkpoint_dir("stitch_network"), device="cpu", networks=("stitch_network",))
    kp = torch.randn(2, 21, 3)
    with torch.inference_mode():
        assert torch.equal(backend.stitch(kp.half().float(), kp), backend.stitch(kp.half(), kp.double()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_asking_for_cuda_where_torch_sees_none_says_so(checkpoint_dir) -> None:
    with pytest.raises(BackendError, match="asked for CUDA, but torch sees no CUDA device"):
        TorchBackend(checkpoint_dir("stitch_network"), device="cuda", networks=("stitch_network",))


def test_a_network_is_compiled_at_its_first_call_not_when_the_backend_is_made() -> None:
    def affine(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    wrapped = CompiledOnFirstCall(affine)
    assert wrapped._compiled is None, "nothing compiled (nor the compiler imported) before a call needs it"
    x = torch.arange(6.0)
    assert torch.equal(wrapped(x), affine(x))
    assert wrapped._compiled is not None


LOAD_ALL = """
import json, sys
import torch
from engine.backends.torch_backend import TorchBackend
from engine.motion.vector import MOTION_SLICES, join_motion
backend = TorchBackend(sys.argv[1], device="cpu")
at_start = sorted(backend._nets)
# a session's first step
join_motion({key: torch.zeros(1, part.stop - part.start) for key, part in MOTION_SLICES.items()})
heavy = {name: name in sys.modules for name in ("sympy", "torch._dynamo")}
backend.motion(torch.zeros(1, 3, 256, 256))
print(json.dumps({"at_start": at_start, "after_a_call": sorted(backend._nets), "imported": heavy}))
"""


def test_a_start_loads_what_the_runtime_runs_and_imports_nothing_heavier(checkpoint_dir) -> None:
    run = subprocess.run(
        [sys.executable, "-c", LOAD_ALL, str(checkpoint_dir())], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["at_start"] == ["decoder", "lmdm", "stitch_network", "warp_network"], (
        "registration's networks wait for a call"
    )
    assert "motion_extractor" in seen["after_a_call"]
    assert seen["imported"] == {"sympy": False, "torch._dynamo": False}, (
        "no symbolic shapes (0.5-0.7 s) nor compiler at start"
    )
