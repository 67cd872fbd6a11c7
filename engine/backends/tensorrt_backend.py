"""The TensorRT backend: runs the plans of ``compile.build_plans`` (format: ``engine.plans``) on the engine's own device
tensors.

It picks, among the plan directories it is given, the one that can run on this GPU with the
TensorRT libraries installed here, deciding from the manifests alone, so an unsupported GPU
(TensorRT-RTX plans on an H200) or a machine without one is told why, and what to use instead,
before anything is loaded. It then checks the plan files and checkpoints against the manifest
and each plan's bindings against the I/O contract below. TensorRT-RTX compiles kernels on the
GPU at first use; their cache is read from and written back next to the plans, so the second
start is quick. Each plan gets one execution context per CUDA stream; a call binds the caller's
tensors by address and enqueues on the caller's current stream (``execute_async_v3``), so
nothing is copied to the host.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from engine.backends.base import Backend, BackendError
from engine.networks import NETWORK_NAMES
from engine.plans.checks import PlanMismatch, check_plans, rebuild_command, why_not_here
from engine.plans.graphs import BATCH, SPECS, GraphSpec
from engine.plans.libraries import FULL, RTX, import_builder, installed_builders
from engine.plans.manifest import GraphEntry, Manifest, ManifestError, file_sha256, plan_dirs, read_manifest
from engine.plans.targets import GpuInfo, present_gpu

REQUIRED_PLANS: tuple[str, ...] = NETWORK_NAMES
_TORCH_DTYPES: dict[str, torch.dtype] = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "BF16": torch.bfloat16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "INT8": torch.int8,
    "UINT8": torch.uint8,
    "BOOL": torch.bool,
}


def torch_dtype(trt_dtype: Any) -> torch.dtype:
    """The torch dtype of a ``tensorrt.DataType`` (by its enum name)."""
    name = str(trt_dtype).rsplit(".", 1)[-1]
    if name not in _TORCH_DTYPES:
        raise BackendError(f"a plan binds a tensor of TensorRT type {name}, which this backend does not map to torch")
    return _TORCH_DTYPES[name]


@dataclass(frozen=True)
class PlanIO:
    """A plan's bindings: input and output names in order, their dtypes and the inputs' (min, opt, max) shapes."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dtypes: dict[str, torch.dtype]
    ranges: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    @classmethod
    def from_engine(cls, trt: ModuleType, engine: Any) -> PlanIO:
        """What a deserialized engine binds (profile 0)."""
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        inputs = tuple(n for n in names if is_input[n])
        return cls(
            inputs,
            tuple(n for n in names if not is_input[n]),
            {n: torch_dtype(engine.get_tensor_dtype(n)) for n in names},
            {n: tuple(tuple(s) for s in engine.get_tensor_profile_shape(n, 0)) for n in inputs},  # type: ignore[misc]
        )

    @classmethod
    def from_manifest(cls, entry: GraphEntry) -> PlanIO:
        """What the manifest says the plan binds (read from the network the builder compiled)."""
        tensors = [*entry.io.get("inputs", []), *entry.io.get("outputs", [])]
        return cls(
            tuple(t["name"] for t in entry.io.get("inputs", [])),
            tuple(t["name"] for t in entry.io.get("outputs", [])),
            {t["name"]: getattr(torch, t["dtype"]) for t in tensors},
            {name: tuple(tuple(s) for s in triple) for name, triple in entry.profiles.items()},  # type: ignore[misc]
        )


def check_contract(spec: GraphSpec, io: PlanIO, where: str | Path) -> None:
    """Raise PlanMismatch unless a plan binds what this backend passes: the spec's input names in order,
    its outputs, the dtypes of the spec's precision policy, its ranks and its whole batch range."""
    problems = []
    if io.inputs != spec.input_names or not set(spec.output_names) <= set(io.outputs):
        problems.append(
            f"binds inputs {list(io.inputs)} and outputs {list(io.outputs)}, "
            f"expected {list(spec.input_names)} and {list(spec.output_names)}"
        )
    for tensor in (*spec.inputs, *spec.outputs):
        wanted = getattr(torch, spec.plan_dtype(tensor))
        if tensor.name in io.dtypes and io.dtypes[tensor.name] != wanted:
            problems.append(f"binds {tensor.name} as {io.dtypes[tensor.name]}, expected {wanted}")
    for tensor in spec.inputs:
        low, _, high = io.ranges.get(tensor.name, ((), (), ()))
        if len(low) != len(tensor.shape):
            problems.append(f"has no rank-{len(tensor.shape)} profile for {tensor.name}")
        elif tensor.shape[0] == BATCH and (low[0], high[0]) != (spec.ranges[BATCH][0], spec.ranges[BATCH][2]):
            problems.append(
                f"accepts batch {low[0]}..{high[0]} for {tensor.name}, expected "
                f"{spec.ranges[BATCH][0]}..{spec.ranges[BATCH][2]} (engine/plans/graphs.py)"
            )
    if problems:
        raise PlanMismatch(f"{where}: " + "; ".join(problems) + ": rebuild the plan")


def select_plans(plans: str | Path, gpu: GpuInfo | None, installed: Mapping[str, str]) -> tuple[Path, Manifest]:
    """The plan directory at or under ``plans`` that can run on ``gpu`` with the ``installed`` builders, or a
    BackendError saying for each directory why not (decided from the manifests: nothing is loaded)."""
    directories = plan_dirs(plans)
    if not directories:
        raise BackendError(
            f"no plans in {plans}; build them once (any machine, no GPU needed, with TensorRT-RTX): "
            f"python -m compile.build_plans --checkpoints <ditto_pytorch/models> --out {plans}"
        )
    reasons = []
    for directory in directories:
        try:
            manifest = read_manifest(directory)
        except ManifestError as exc:
            reasons.append(str(exc))
            continue
        reason = why_not_here(manifest, gpu, installed)
        if reason is None:
            return directory, manifest
        reasons.append(f"{directory}: {reason}")
    raise BackendError("no plans here can run on this machine:\n  " + "\n  ".join(reasons))


class _RuntimeCache:
    """TensorRT-RTX's cache of the kernels it compiles on this GPU, kept in a file next to the plans."""

    def __init__(self, engine: Any, path: Path) -> None:
        self.path = path
        self.cache = engine.create_runtime_config().create_runtime_cache()
        if path.is_file() and not self.cache.deserialize(path.read_bytes()):
            self.cache.reset()  # written by another version or GPU: start over, the file is replaced on save

    def runtime_config(self, engine: Any) -> Any:
        """A runtime config for ``engine`` that compiles into, and reuses, this cache."""
        config = engine.create_runtime_config()
        config.set_runtime_cache(self.cache)
        return config

    def save(self) -> None:
        """Write the cache atomically; a read-only plan directory only costs the next start its compile time."""
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(memoryview(self.cache.serialize()))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)


class _Plan:
    """One deserialized engine: its bindings and one execution context per CUDA stream."""

    def __init__(
        self, trt: ModuleType, spec: GraphSpec, engine: Any, path: Path, context_config: Callable[[], Any] | None
    ) -> None:
        self.spec = spec
        self.path = path
        self.engine = engine
        self.io = PlanIO.from_engine(trt, engine)
        check_contract(spec, self.io, path)
        self.inputs, self.outputs = list(self.io.inputs), list(self.io.outputs)
        self.dtypes, self.ranges = self.io.dtypes, self.io.ranges
        self._context_config = context_config
        self._contexts: dict[int, Any] = {}
        self._lock = threading.Lock()

    def batch_range(self) -> tuple[int, int]:
        """Smallest and largest batch the plan's profile accepts (its first input's first axis)."""
        low, _, high = self.ranges[self.inputs[0]]
        return int(low[0]), int(high[0])

    def _context(self, stream: int) -> Any:
        if stream not in self._contexts:
            if self._context_config is None:
                context = self.engine.create_execution_context()
            else:
                context = self.engine.create_execution_context(runtime_config=self._context_config())
            if context is None:
                raise BackendError(
                    f"{self.spec.name}: TensorRT could not create an execution context (out of GPU memory?)"
                )
            self._contexts[stream] = context
        return self._contexts[stream]

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        low, _, high = self.ranges[name]
        if len(shape) != len(low) or any(not lo <= s <= hi for s, lo, hi in zip(shape, low, high)):
            axis = self.spec.inputs[self.inputs.index(name)].shape
            raise BackendError(
                f"{self.spec.name}: input {name} has shape {shape}; the plan {self.path.name} accepts "
                f"{tuple(low)} to {tuple(high)} (axes {axis}). Batch limits live in engine/plans/graphs.py; "
                "change them there and rebuild the plan"
            )

    def run(self, inputs: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        """Bind ``inputs`` and fresh outputs by address and enqueue on the current stream of ``device``."""
        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise BackendError(f"{self.spec.name}: missing input(s) {missing}")
        stream = torch.cuda.current_stream(device)
        # Casts made here stay referenced until the enqueue; after that the caching allocator may reuse
        # their memory, but only for work ordered after this call on the same stream.
        bound: list[torch.Tensor] = []
        with self._lock:
            context = self._context(stream.cuda_stream)
            for name in self.inputs:
                tensor = inputs[name]
                if tensor.device != device:
                    raise BackendError(
                        f"{self.spec.name}: input {name} is on {tensor.device}; the plans run on {device} "
                        "and this backend never copies between devices or to the host"
                    )
                tensor = tensor.to(self.dtypes[name]).contiguous()
                self._check_shape(name, tuple(tensor.shape))
                if not context.set_input_shape(name, tuple(tensor.shape)):
                    raise BackendError(f"{self.spec.name}: TensorRT refused shape {tuple(tensor.shape)} for {name}")
                context.set_tensor_address(name, tensor.data_ptr())
                bound.append(tensor)
            outputs = {}
            for name in self.outputs:
                out = torch.empty(tuple(context.get_tensor_shape(name)), dtype=self.dtypes[name], device=device)
                context.set_tensor_address(name, out.data_ptr())
                outputs[name] = out
            if not context.execute_async_v3(stream.cuda_stream):
                raise BackendError(f"{self.spec.name}: TensorRT could not enqueue {self.path.name}; its log says why")
        return outputs


class TensorRTBackend(Backend):
    """Ditto's networks as TensorRT plans; float tensors are cast on device to each binding's dtype."""

    name = "tensorrt"

    def __init__(
        self, plans: str | Path = "plans", checkpoints: str | Path | None = None, device: str | torch.device = "cuda"
    ) -> None:
        """Load the plans that can run here from ``plans`` (a plan directory, or the root holding them).

        With ``checkpoints`` (the directory of the official .pth files) every plan is checked
        against the checkpoint it was built from; without it, the plans are trusted as built.
        """
        requested = torch.device(device)
        if requested.type != "cuda":
            raise BackendError(f"the TensorRT backend runs on a CUDA device, not {requested}")
        installed = installed_builders()
        if not installed:
            import_builder(RTX)  # raises TensorRTUnavailable, which says how to install it
        gpu = present_gpu(requested.index or 0)
        plan_dir, manifest = select_plans(plans, gpu, installed)
        assert gpu is not None  # select_plans accepts no plan without a GPU
        self.device = torch.device("cuda", gpu.index)
        self.dtype = torch.float16
        missing = [n for n in REQUIRED_PLANS if n not in manifest.graphs]
        if missing:
            command = rebuild_command(manifest, missing, plan_dir.parent)
            raise PlanMismatch(f"{plan_dir} has no plan for {', '.join(missing)}; build them: {command}")
        hashes = None if checkpoints is None else _checkpoint_hashes(Path(checkpoints), manifest.graphs.values())
        check_plans(plan_dir, manifest, graphs=manifest.graphs, checkpoint_sha256=hashes)
        self.plan_dir = plan_dir
        trt = import_builder(manifest.builder or FULL)
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._cache: _RuntimeCache | None = None
        self._plans: dict[str, _Plan] = {}
        with torch.cuda.device(self.device):
            for name, entry in manifest.graphs.items():
                path = plan_dir / entry.file
                engine = runtime.deserialize_cuda_engine(path.read_bytes())
                if engine is None:
                    command = rebuild_command(manifest, [name], plan_dir.parent)
                    raise PlanMismatch(f"TensorRT cannot load {path}; rebuild it: {command}")
                config = None
                if manifest.builder == RTX:
                    if self._cache is None:
                        self._cache = _RuntimeCache(engine, plan_dir / f"runtime-cache-{gpu.arch}.bin")
                        weakref.finalize(self, self._cache.save)
                    config = functools.partial(self._cache.runtime_config, engine)
                self._plans[name] = _Plan(trt, SPECS[name], engine, path, config)
        low, high = self._plans["warp_network"].batch_range()
        self.render_batch_sizes = tuple(range(low, high + 1))
        self.cond_width = int(self._plans["lmdm"].ranges["cond"][0][2])

    def save_runtime_cache(self) -> None:
        """Write TensorRT-RTX's kernel cache next to the plans now (it is also written when the backend goes)."""
        if self._cache is not None:
            self._cache.save()

    @property
    def graphs(self) -> tuple[str, ...]:
        """Names of the loaded plans."""
        return tuple(self._plans)

    def batch_range(self, graph: str) -> tuple[int, int]:
        """Smallest and largest batch the plan ``graph`` accepts."""
        return self._plans[graph].batch_range()

    def run(self, graph: str, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run one plan by name (e.g. ``hubert`` with ``input_values``) and return its outputs by name."""
        if graph not in self._plans:
            raise BackendError(f"{self.plan_dir} has no {graph} plan (it has {sorted(self._plans)})")
        return self._plans[graph].run(inputs, self.device)

    def lmdm(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.run("lmdm", x=x, cond_frame=cond_frame, cond=cond, time_cond=time_cond)
        return out["pred_noise"], out["x_start"]

    def stitch(self, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        return self.run("stitch_network", kp_source=kp_source, kp_driving=kp_driving)["out"]

    def warp(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        return self.run("warp_network", feature_3d=feature_3d, kp_source=kp_source, kp_driving=kp_driving)["out"]

    def decode(self, feature: torch.Tensor) -> torch.Tensor:
        return self.run("decoder", feature=feature)["output"]

    def appearance(self, image: torch.Tensor) -> torch.Tensor:
        return self.run("appearance_extractor", image=image)["pred"]

    def motion(self, image: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.run("motion_extractor", image=image)

    def render(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """The merged warp+decode plan when it was built, else warp then decode."""
        if "warp_decoder" in self._plans:
            return self.run("warp_decoder", feature_3d=feature_3d, kp_source=kp_source, kp_driving=kp_driving)["output"]
        return super().render(feature_3d, kp_source, kp_driving)


def _checkpoint_hashes(directory: Path, entries: Any) -> dict[str, str]:
    """sha256 of each checkpoint file the plans were built from, read from ``directory``."""
    files = sorted({f for entry in entries for f in entry.checkpoints})
    missing = [f for f in files if not (directory / f).is_file()]
    if missing:
        raise BackendError(
            f"checkpoint file(s) {missing} not found in {directory}, so the plans cannot be checked against them"
        )
    return {f: file_sha256(directory / f) for f in files}
