"""How many operators and kernels one LMDM DDIM step costs: the plain prepared step against the fused one.

``plain_step`` is the path the sampler used before ``engine.networks.lmdm_fused``
(``LMDM.prepare_window`` + ``LMDM.forward_prepared``, the update outside); ``fused_step`` is
``FusedLMDMStep``. ``count_aten`` counts the ATen operators one step dispatches (what eager mode
launches: one kernel per non-view operator on CUDA); ``count_inductor`` compiles the step with
torch.compile for the step's device and counts what the generated code launches: fused kernels
and extern calls (GEMMs, attention). On the CPU that is Inductor's C++ backend; its fusion
decisions come from the same scheduler as the CUDA/Triton backend but not identical ones, and
it shows neither cuBLAS's split-K reduce/memset kernels nor the fp16 casts around attention
(CUDA only), so the CUDA profile stays the measure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.diffusion.ddim import DDIMStep, denoiser_step
from engine.diffusion.schedule import DDIMSchedule
from engine.networks.lmdm import LMDM
from engine.networks.lmdm_fused import FusedLMDMStep

_MATMULS = {"addmm", "_addmm_activation", "mm", "bmm", "baddbmm", "linear", "matmul"}


class AtenCounter(TorchDispatchMode):
    """Counts dispatched ATen operators by name, views apart."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops["view" if func.is_view else name] += 1
        return func(*args, **(kwargs or {}))


class Variant(NamedTuple):
    """A way to run DDIM steps: ``prepare(cond, times)``, the part torch.compile gets, and what runs eagerly around it.

    ``around`` builds the step from a denoiser (``denoiser_step``); None when ``compiled`` is the whole step.
    """

    prepare: Callable
    compiled: Callable
    around: Callable[[Callable], DDIMStep] | None

    @property
    def step(self) -> DDIMStep:
        """The step, run eagerly."""
        return self.compiled if self.around is None else self.around(self.compiled)


def plain_variant(lmdm: LMDM) -> Variant:
    """The plain prepared LMDM as the sampler ran it: the denoiser compiled, the update eagerly around it."""
    return Variant(lmdm.prepare_window, lmdm.forward_prepared, denoiser_step)


def fused_variant(lmdm: LMDM) -> Variant:
    """``FusedLMDMStep`` over ``lmdm``: the whole step, update included, compiled."""
    fused = FusedLMDMStep(lmdm)
    return Variant(fused.prepare_window, fused.ddim_step, None)


def step_inputs(lmdm: LMDM, schedule: DDIMSchedule, batch: int, prepare: Callable, device: torch.device) -> tuple:
    """The arguments of step 1 of a window (seeded random inputs), its condition prepared."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(batch, 80, 265, device=device, generator=g)
    cond_frame = 0.3 * torch.randn(batch, 265, device=device, generator=g)
    cond = torch.randn(batch, 80, lmdm.cond_dim, device=device, generator=g)
    noise = torch.randn(1, 80, 265, device=device, generator=g)
    prepared = prepare(cond, schedule.times)
    return x, cond_frame, prepared, schedule.times[1].expand(batch), schedule.coefficients[1], noise


def count_aten(step: DDIMStep, inputs: tuple) -> dict[str, int]:
    """ATen operators of one eager step: total launched (non-view), matmuls, attention, views, and the top names."""
    counter = AtenCounter()
    with torch.inference_mode(), counter:
        step(*inputs)
    ops = counter.ops
    launched = {name: n for name, n in ops.items() if name != "view"}
    return {
        "ops": sum(launched.values()),
        "matmuls": sum(n for name, n in launched.items() if name in _MATMULS),
        "attention": sum(n for name, n in launched.items() if "scaled_dot_product" in name),
        "views": ops["view"],
        "by_name": dict(Counter(launched).most_common()),
    }


def count_inductor(variant: Variant, inputs: tuple) -> dict[str, int]:
    """Launches of one step: the fused kernels and extern calls (GEMMs, attention) of the code torch.compile
    generates for the compiled part, plus the ATen operators that run eagerly around it."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.inference_mode():
        # A denoiser takes the step's first four arguments.
        outputs, sources = run_and_get_code(
            torch.compile(variant.compiled), *(inputs if variant.around is None else inputs[:4])
        )
    eager = 0 if variant.around is None else count_aten(variant.around(lambda *args: outputs), inputs)["ops"]
    calls = "\n".join(_call_body(source) for source in sources)
    kernels = len(re.findall(r"^\s*(?:cpp_fused_\w+|triton_\w+)(?:\.run)?\(", calls, flags=re.M))
    externs = re.findall(r"^\s*(?:\w+ = )?(?:extern_kernels\.(\w+)|torch\.ops\.(\w+)\.(\w+)\.\w+)\(", calls, flags=re.M)
    names = Counter(e[0] or f"{e[1]}.{e[2]}" for e in externs)
    return {
        "launches": kernels + sum(names.values()) + eager,
        "fused_kernels": kernels,
        "extern_calls": sum(names.values()),
        "eager_ops_around": eager,
        "extern_by_name": dict(names.most_common()),
    }


def _call_body(source: str) -> str:
    """The body of the generated module's ``call`` function (where the kernels are launched)."""
    match = re.search(r"^\s*def call\(.*?(?=^\S)", source, flags=re.M | re.S)
    return match.group(0) if match else ""
