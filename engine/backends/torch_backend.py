"""The PyTorch backend: our network modules in fp16 and channels-last on a GPU, fp32 on the CPU.

It is the numerical reference for the TensorRT backend and the backend measured on GPUs
without TensorRT. On CUDA the warp network's 3-D convolutions run over depth planes
(``engine.networks.depth_planes``: the same function, cuDNN's faster 2-D kernels) and the
decoder's SPADEs in merged convolutions (``engine.networks.spade_fused``: the same function in
fewer, larger convolutions and 11% fewer FLOPs). Render batches of fixed bucket sizes are
captured into CUDA graphs (``capture_render``) so that a 5-frame hop costs one graph launch instead of hundreds of
kernel launches; a smaller batch runs in the next bucket's graph, padded. torch.compile keeps
its compiled kernels in an on-disk cache (``$DITTO_CACHE_DIR/torch-compile``) so a second
start of the same configuration skips most of the compile time.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from engine.backends.aot_calls import PrepareCall, RenderCall, StepCall, contiguous, module_tensors
from engine.backends.base import Backend, BackendError, Capabilities
from engine.cache_root import cache_root
from engine.graph_pool import GraphPool
from engine.networks import OFFICIAL_FILENAMES, load_network
from engine.networks.lmdm_fused import FusedLMDMStep, FusedWindow
from engine.plans.packages import StalePackages, Target, load_packages

log = logging.getLogger(__name__)

_MOTION_KEYS = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
_CONV_NETWORKS = ("appearance_extractor", "warp_network", "decoder")
_COMPILED = {"lmdm", "warp_network", "decoder"}
_ON_FIRST_USE = ("appearance_extractor", "motion_extractor")
"""Loaded at their first call, not at start: the runtime never calls them (registration loads its own), and the
motion extractor is 112 MB of the six networks' 711."""


def default_device() -> torch.device:
    """The first CUDA device when there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class TorchBackend(Backend):
    """Runs the six networks as PyTorch modules loaded from official-layout checkpoints."""

    name = "torch"

    def __init__(
        self,
        checkpoints: str | Path,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        networks: tuple[str, ...] = tuple(OFFICIAL_FILENAMES),
        compile_networks: bool = True,
    ) -> None:
        """``compile_networks``: on CUDA, fuse the LMDM, warp and decoder with torch.compile (about a minute at
        start)."""
        self.device = torch.device(device) if device is not None else default_device()
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError("the torch backend was asked for CUDA, but torch sees no CUDA device")
        self.dtype = dtype or (torch.float16 if self.device.type == "cuda" else torch.float32)
        self._checkpoints = Path(checkpoints)
        self._nets: dict[str, torch.nn.Module] = {}
        self._deferred = {name for name in networks if name in _ON_FIRST_USE}
        for name in networks:
            if name not in self._deferred:
                self._nets[name] = self._load(name)
        self._run = dict(self._nets)
        started = time.perf_counter()
        if self.device.type == "cuda":
            # TF32 matmuls for the fp32 LMDM: its products at tensor-core rate, a sampled window within 1e-3 relative.
            torch.backends.cuda.matmul.allow_tf32 = True
            if compile_networks:
                use_compile_cache()
                # Default dynamism: the first bucket compiles static, the second marks the batch
                # axis dynamic, and every later bucket reuses that one compile.
                for name in _COMPILED & set(self._nets):
                    self._run[name] = CompiledOnFirstCall(self._nets[name])
        # The DDIM step of the sampler: the LMDM in fewer kernels, with the update, its layers' products
        # in the backend's dtype (fp16 on CUDA); the window preparation compiled too (engine.networks.lmdm_fused).
        self._lmdm_step = self._lmdm_prepare = self._fused = None
        if "lmdm" in self._nets:
            fused = self._fused = FusedLMDMStep(self._nets["lmdm"], self.dtype)
            self._lmdm_step, self._lmdm_prepare = fused.ddim_step, fused.prepare_window
            if self.device.type == "cuda" and compile_networks:
                self._lmdm_step, self._lmdm_prepare = (
                    CompiledOnFirstCall(self._lmdm_step),
                    CompiledOnFirstCall(self._lmdm_prepare),
                )
        log.debug(
            "the fused LMDM step set up in %.2f s (torch.compile waits for a first call)", time.perf_counter() - started
        )
        self.cond_width = self._nets["lmdm"].cond_dim if "lmdm" in self._nets else 0
        self.capabilities = Capabilities(
            fused_ddim_step=self._lmdm_step is not None,
            render_graphs=self.device.type == "cuda" and {"warp_network", "decoder"} <= set(self._nets),
        )
        self._graphs: dict[int, _GraphedRender] = {}
        self._pool: GraphPool | None = None
        self.captures = 0
        self._packages: dict[tuple[str, int], Callable[..., Any]] = {}
        self.package_calls = 0
        """Calls served by a compiled package (the rest ran torch's own path)."""
        compiled = self.device.type == "cuda" and compile_networks
        self.packages_status = (
            "torch.compile at warm-up (no compiled packages asked for)"
            if compiled
            else "eager (no compiled packages asked for)"
        )

    def _load(self, name: str) -> torch.nn.Module:
        """Network ``name`` from its checkpoint, on this backend's device in the layout its calls run fastest in."""
        started = time.perf_counter()
        # fp32 where fp16 breaks the numbers: the motion extractor's LayerNorm/GRN statistics overflow, and the
        # LMDM's last DDIM steps multiply its noise prediction's error about 24 times.
        dtype_for = torch.float32 if name in ("motion_extractor", "lmdm", "stitch_network") else self.dtype
        net = load_network(
            name, self._checkpoints / OFFICIAL_FILENAMES[name], self.device, dtype_for, fold_batchnorm=True
        )
        if name == "warp_network" and self.device.type == "cuda":
            net.dense_motion_network.use_depth_planes()
        if name == "decoder" and self.device.type == "cuda":
            net.use_fused_spade()
        if name in _CONV_NETWORKS and self.device.type == "cuda":
            _to_channels_last(net)
        net.requires_grad_(False)
        log.debug("loaded %s onto %s in %.2f s", name, self.device, time.perf_counter() - started)
        return net

    def _net(self, name: str) -> torch.nn.Module:
        """A loaded network; one deferred to its first use (``_ON_FIRST_USE``) is loaded now."""
        if name in self._deferred:
            self._nets[name] = self._load(name)
            self._deferred.discard(name)
        return self._nets[name]

    def load_packages(self, plans: str | Path, steps: int) -> str:
        """Use the ahead-of-time compiled packages under ``plans`` for this device (``compile.aot_build``) when they
        match this process, these checkpoints and ``steps``; otherwise keep torch.compile. Returns what was used, and
        why."""
        target = Target.here(self.device, self.dtype)
        files = {name: self._checkpoints / OFFICIAL_FILENAMES[name] for name in self._nets}
        try:
            self._packages = load_packages(Path(plans), target, steps, files, self._call_weights)
        except StalePackages as exc:
            self.packages_status = f"compiled packages not used: {exc}"
            log.warning("%s", self.packages_status)
        else:
            calls = sorted({f"{call} x{batch}" for call, batch in self._packages})
            self.packages_status = f"{len(self._packages)} compiled packages for {target.device} ({', '.join(calls)})"
            log.info("%s", self.packages_status)
        return self.packages_status

    def _call_weights(self, call: str) -> Mapping[str, torch.Tensor]:
        """The tensors a package of ``call`` runs on, named as its module was exported
        (``engine.backends.aot_calls``)."""
        if call == "render":
            return module_tensors(RenderCall(self._nets["warp_network"], self._nets["decoder"]))
        return module_tensors(PrepareCall(self._fused) if call == "lmdm_prepare" else StepCall(self._fused))

    def network(self, name: str) -> torch.nn.Module:
        """The loaded module for ``name`` (for export, benchmarks and parity checks)."""
        if name not in self._nets and name not in self._deferred:
            raise BackendError(f"network {name!r} was not loaded by this backend")
        return self._net(name)

    @torch.inference_mode()
    def lmdm(self, x, cond_frame, cond, time_cond):
        return self._run["lmdm"](x, cond_frame, cond, time_cond)

    @torch.inference_mode()
    def lmdm_prepare(self, cond: torch.Tensor, times: torch.Tensor) -> FusedWindow:
        """Encode a window's condition once for all its denoiser calls at ``times`` (see
        ``FusedLMDMStep.prepare_window``)."""
        package = self._packages.get(("lmdm_prepare", cond.shape[0]))
        if package is not None:
            self.package_calls += 1
            return FusedWindow(*package(*contiguous((cond, times))))
        if self._lmdm_prepare is None:
            return super().lmdm_prepare(cond, times)
        return self._lmdm_prepare(cond, times)

    @torch.inference_mode()
    def lmdm_step(self, x, cond_frame, prepared: FusedWindow, time_cond, coefficients, noise):
        """One DDIM step (``ddim.DDIMStep``) of a window encoded by ``lmdm_prepare``: ``lmdm`` plus the update,
        fused."""
        package = self._packages.get(("lmdm_step", x.shape[0]))
        if package is not None and noise.shape == x.shape:
            self.package_calls += 1
            return package(*contiguous((x, cond_frame, *prepared, time_cond, coefficients, noise)))
        if self._lmdm_step is None:
            return super().lmdm_step(x, cond_frame, prepared, time_cond, coefficients, noise)
        return self._lmdm_step(x, cond_frame, prepared, time_cond, coefficients, noise)

    @torch.inference_mode()
    def stitch(self, kp_source, kp_driving):
        return self._nets["stitch_network"](kp_source.float(), kp_driving.float())

    @torch.inference_mode()
    def warp(self, feature_3d, kp_source, kp_driving):
        return self._run["warp_network"](feature_3d.to(self.dtype), kp_source.to(self.dtype), kp_driving.to(self.dtype))

    @torch.inference_mode()
    def decode(self, feature):
        return self._run["decoder"](feature.to(self.dtype))

    @torch.inference_mode()
    def appearance(self, image):
        return self._net("appearance_extractor")(image.to(self.dtype))

    @torch.inference_mode()
    def motion(self, image):
        out = self._net("motion_extractor")(image.float())
        return dict(zip(_MOTION_KEYS, out))

    @torch.inference_mode()
    def render(self, feature_3d, kp_source, kp_driving):
        """Warp+decode; in the smallest captured bucket that holds the batch (its output is valid until the next
        render)."""
        batch = kp_source.shape[0]
        bucket = next((b for b in sorted(self._graphs) if b >= batch), None)
        if bucket is not None:
            return self._graphs[bucket](feature_3d, kp_source, kp_driving)
        if self.device.type == "cpu":
            # One frame per call: bit-identical to a batched call, and faster per frame on the CPU.
            frames = zip(feature_3d.split(1), kp_source.split(1), kp_driving.split(1))
            return torch.cat([self.warp_decode(*frame) for frame in frames])
        return self.warp_decode(feature_3d, kp_source, kp_driving)

    @torch.inference_mode()
    def warp_decode(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        """``decode(warp(...))`` of one batch, in its compiled package when there is one for this batch size."""
        package = self._packages.get(("render", kp_source.shape[0]))
        if package is not None:
            self.package_calls += 1
            dt = self.dtype
            return package(*contiguous((feature_3d.to(dt), kp_source.to(dt), kp_driving.to(dt))))
        return self.decode(self.warp(feature_3d, kp_source, kp_driving))

    def capture_render(self, batch_sizes: tuple[int, ...], pool: GraphPool | None = None) -> None:
        """Capture warp+decode into one CUDA graph per bucket, largest first, in ``pool`` (by default one of the
        backend's own) (CUDA only)."""
        if not self.capabilities.render_graphs:
            super().capture_render(batch_sizes, pool)
        self._pool = pool or self._pool or GraphPool(self.device)
        for batch in sorted(set(batch_sizes) - set(self._graphs), reverse=True):
            self._graphs[batch] = _GraphedRender(self, batch, self._pool)
            self.captures += 1
        self.render_batch_sizes = tuple(sorted(self._graphs))


class CompiledOnFirstCall:
    """``torch.compile(fn)``, made at the first call: a start whose calls all run in compiled packages never imports
    the compiler (torch.compile's first use imports dynamo and inductor, seconds of a start: a start before and after
    this deferral, bench/results/2026-12-01_h200_start_with_packages.json, 2026-12-02_h200_start_with_packages.json)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            self._compiled = torch.compile(self.fn)
        return self._compiled(*args, **kwargs)


def use_compile_cache() -> Path:
    """Point torch.compile's on-disk cache at ``$DITTO_CACHE_DIR/torch-compile`` unless the user chose one."""
    folder = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "torch-compile")))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@torch.no_grad()
def _to_channels_last(net: torch.nn.Module) -> None:
    """Put 4-D weights in channels-last and 5-D weights in channels-last-3d (cuDNN's fast layouts)."""
    for param in net.parameters():
        if param.dim() == 4:
            param.data = param.data.contiguous(memory_format=torch.channels_last)
        elif param.dim() == 5:
            param.data = param.data.contiguous(memory_format=torch.channels_last_3d)


class _GraphedRender:
    """Warp+decode for one bucket, captured once into a CUDA graph with static buffers; rows past the batch are
    padding."""

    def __init__(self, backend: TorchBackend, batch: int, pool: GraphPool) -> None:
        dev, dt = backend.device, backend.dtype
        self.feature = torch.zeros(batch, 32, 16, 64, 64, device=dev, dtype=dt)
        self.kp_s = torch.zeros(batch, 21, 3, device=dev, dtype=dt)
        self.kp_d = torch.zeros(batch, 21, 3, device=dev, dtype=dt)
        with pool.warm_up(), torch.inference_mode():
            for _ in range(2):
                backend.warp_decode(self.feature, self.kp_s, self.kp_d)
        self.graph = torch.cuda.CUDAGraph()
        with pool.capture(self.graph), torch.inference_mode():
            self.out = backend.warp_decode(self.feature, self.kp_s, self.kp_d)

    def __call__(self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor) -> torch.Tensor:
        n = kp_source.shape[0]
        self.feature[:n].copy_(feature_3d)
        self.kp_s[:n].copy_(kp_source)
        self.kp_d[:n].copy_(kp_driving)
        self.graph.replay()
        return self.out[:n]
