"""Opening one AOTInductor package without importing torch's compiler.

``torch._inductor.aoti_load_package`` imports ``torch._inductor``, and with it dynamo and the whole compiler (seconds
of a start: bench/results/2026-12-02_h200_start_with_packages.json), only to compare the CPU and GPU the package
recorded with this machine's in a warning, which ``engine.plans.packages`` already checks through the manifest. The
loader under it is torch's own C++ package loader, opened here directly (written against torch 2.13's). Where this
torch's loader has another shape, the public function opens the package instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree

log = logging.getLogger(__name__)

MODEL_NAME = "model"
"""The name AOTInductor gives the one model of a package it compiles."""


class LoadedPackage(Protocol):
    """What the backend uses of a loaded package: call it, name its weights, bind them."""

    def __call__(self, *inputs: torch.Tensor) -> Any: ...

    def get_constant_fqns(self) -> list[str]: ...

    def load_constants(self, constants: Mapping[str, torch.Tensor], *, check_full_update: bool, user_managed: bool) -> None: ...


class OpenedPackage:
    """A package opened by torch's C++ loader: tensors in, the exported module's outputs out."""

    def __init__(self, loader: Any) -> None:
        # The loader's methods, bound once: one this torch's loader lacks raises AttributeError here, at load.
        self._run, self._constant_names, self._load = loader.boxed_run, loader.get_constant_fqns, loader.load_constants
        self._outputs = pytree.treespec_loads(loader.get_call_spec()[1])

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if not all(isinstance(x, torch.Tensor) for x in inputs):
            raise TypeError("a compiled package takes tensors only")
        return pytree.tree_unflatten(self._run(list(inputs)), self._outputs)

    def get_constant_fqns(self) -> list[str]:
        return self._constant_names()

    def load_constants(self, constants: Mapping[str, torch.Tensor], *, check_full_update: bool, user_managed: bool) -> None:
        self._load(constants, False, check_full_update, user_managed)


def open_package(path: Path, single_threaded: bool, device: str) -> LoadedPackage:
    """The package at ``path`` for ``device`` ("cpu" or a GPU architecture), already checked against its manifest,
    through torch's C++ loader where it has the expected shape, else through ``torch._inductor.aoti_load_package``.
    ``single_threaded``: one runner, called from one thread (the runtime's loop)."""
    # With torch 2.11 and CUDA 13 the C++ loader crashes (segfault) opening the first GPU package of a process in
    # which onnxruntime's native library is not loaded; importing onnxruntime first avoids it, and importing
    # torch._prims, symbolic shapes or torch._refs instead does not (docs/startup.md). The cause is not found; until
    # it is, onnxruntime is loaded before a package opens.
    import onnxruntime  # noqa: F401

    try:
        return OpenedPackage(torch._C._aoti.AOTIModelPackageLoader(str(path), MODEL_NAME, single_threaded, 1, -1))
    except (AttributeError, TypeError) as exc:  # another torch's loader: the public function knows its shape
        log.debug("%s: torch's package loader has another shape here (%s): opening it the public way", path.name, exc)
        with without_cpu_isa_probe(device):
            return torch._inductor.aoti_load_package(str(path), run_single_threaded=single_threaded)


def without_cpu_isa_probe(device: str) -> AbstractContextManager[object]:
    """While GPU packages build (or load through torch's public loader), tell torch the CPU has no vector ISA. It
    asks for the ISA only to record it (and, loading, to compare in a warning), and otherwise compiles probe
    programs and loads them in child processes, tens of seconds of a start (a start before and after the switch:
    bench/results/2026-12-01_h200_start_with_packages.json, 2026-12-02_h200_start_with_packages.json).
    ``vec_isa_ok=True`` is not enough: it skips the basic probe but not the AVX-512 bf16 and AMX ones (torch 2.11).
    GPU packages run no CPU kernels. CPU packages (``device`` "cpu") keep the probe."""
    if device == "cpu":
        return nullcontext()
    return torch._inductor.config.patch({"cpp.vec_isa_ok": False})
