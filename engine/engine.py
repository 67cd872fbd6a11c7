"""The engine: the networks shared by every session on one device, loaded from checkpoints or random stand-ins."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.audio.hubert import CHUNK_SAMPLES, OnnxHubertRunner, TorchHubertRunner, find_official_hubert, valid_features
from engine.audio.hubert_torch import HubertWeightsError, load_official_hubert
from engine.audio.standin_hubert import build_standin
from engine.backends.base import Backend, BackendError
from engine.backends.torch_backend import TorchBackend, default_device
from engine.cache_root import cache_root
from engine.controls import Controls
from engine.diffusion.ddim import DDIMSampler, denoiser_step
from engine.diffusion.graphed import BucketedSampler
from engine.diffusion.schedule import ddim_schedule
from engine.motion.vector import MOTION_DIM
from engine.networks import OFFICIAL_FILENAMES, write_random_checkpoints
from engine.official_cfg import official_controls
from engine.plans.packages import hash_checkpoints_ahead
from engine.timebase import DEFAULT_STEPS, SEQ_FRAMES

log = logging.getLogger("ditto.engine")
LIVE_OVERLAP = 75
RANDOM_WEIGHTS_NOTICE = (
    "RANDOM WEIGHTS: no official Ditto checkpoints given, so the networks run on deterministic random "
    "weights in the official layout and a stand-in audio encoder. The output is NOT a face; "
    "get the real weights with `huggingface-cli download digital-avatar/ditto-talkinghead --local-dir checkpoints`."
)


def models_dir(checkpoints: str | Path) -> Path:
    """Where the six .pth files are: ``ditto_pytorch/models`` of an official download, or the folder itself."""
    root = Path(checkpoints)
    nested = root / "ditto_pytorch" / "models"
    return nested if nested.is_dir() else root


def random_checkpoints(seed: int = 0) -> Path:
    """A folder of deterministic random checkpoints in the official layout, written once and cached."""
    directory = cache_root() / f"random-weights-seed{seed}"
    if not all((directory / f).is_file() for f in OFFICIAL_FILENAMES.values()):
        write_random_checkpoints(directory, seed=seed)
    return directory


class Engine:
    """The networks shared by every session on one device: one backend, the audio encoder, the DDIM schedule.

    An engine launches nothing by itself; ``engine.runtime.Runtime`` owns it and is the one
    place GPU work is launched from.
    """

    def __init__(
        self, backend: Backend, hubert, steps: int = DEFAULT_STEPS, default_controls: Controls | None = None
    ) -> None:
        self.backend = backend
        self.default_controls = default_controls or Controls()
        self.device = backend.device
        self.hubert = hubert
        self.steps = steps
        self.cond_width = backend.cond_width
        self.schedule = ddim_schedule(steps, self.device)
        self._step_noise: dict[int, torch.Tensor] = {}
        with torch.inference_mode():
            silence = torch.zeros(1, CHUNK_SAMPLES)
            self.silence_feature = (
                valid_features(hubert.encode_batch(silence)).reshape(-1, 1024)[0].to(self.device).float()
            )

    @classmethod
    def from_checkpoints(
        cls,
        checkpoints: str | Path | None = None,
        device: str | torch.device | None = None,
        backend: str = "torch",
        steps: int = DEFAULT_STEPS,
        plans: str | Path | None = None,
        compile_networks: bool = True,
    ) -> Engine:
        """Load the networks from official checkpoints (or random stand-ins when None) onto ``device``; sessions
        default to the controls of the official cfg beside them (``engine.official_cfg``) when there is one.

        ``compile_networks`` (torch backend, CUDA): fuse kernels with torch.compile; the runtime
        compiles at warm-up only, with an on-disk cache so the next start is quick. ``plans``: the TensorRT
        backend's plans; for the torch backend, where its ahead-of-time compiled packages are (used when they match).
        """
        device = torch.device(device) if device is not None else default_device()
        folder = models_dir(checkpoints) if checkpoints is not None else random_checkpoints()
        if backend == "auto":
            backend = "tensorrt" if plans is not None else "torch"
        if backend == "torch":
            if plans is not None:  # the packages' checkpoint hashes, overlapped with loading the networks
                hash_checkpoints_ahead(folder)
            nets = TorchBackend(folder, device=device, compile_networks=compile_networks)
            if plans is not None:
                nets.load_packages(plans, steps)
        elif backend == "tensorrt":
            from engine.backends.tensorrt_backend import TensorRTBackend

            if plans is None:
                raise BackendError(
                    "the tensorrt backend needs --plans DIR (build them with python -m compile.build_plans)"
                )
            nets = TensorRTBackend(plans, checkpoints=folder, device=device)
        else:
            raise BackendError(f"unknown backend {backend!r}: choose torch, tensorrt or auto")
        defaults = official_controls(folder) if checkpoints is not None else Controls()
        return cls(nets, hubert_runner(checkpoints, device), steps=steps, default_controls=defaults)

    def step_noise(self, seed: int) -> torch.Tensor:
        """The per-step DDIM noise (S−1,1,80,265) of ``seed``, drawn once and reused for every window (as the reference
        does)."""
        if seed not in self._step_noise:
            self._step_noise[seed] = DDIMSampler(self.steps, seed=seed, device=self.device).step_noise
        return self._step_noise[seed]

    def sampler(self) -> BucketedSampler:
        """A batched DDIM sampler over this engine's LMDM (the runtime captures its buckets)."""
        if self.backend.capabilities.fused_ddim_step:
            times = self.schedule.times
            return BucketedSampler(
                self.schedule,
                self.backend.lmdm_step,
                self.cond_width,
                (SEQ_FRAMES, MOTION_DIM),
                lambda cond: self.backend.lmdm_prepare(cond, times),
            )
        return BucketedSampler(
            self.schedule, denoiser_step(self.backend.lmdm), self.cond_width, (SEQ_FRAMES, MOTION_DIM)
        )


def hubert_runner(checkpoints: str | Path | None, device: torch.device):
    """The official streaming HuBERT: on a GPU as our batched PyTorch module loaded from the ONNX's weights
    (onnxruntime when its layout is not the one we map), on the CPU in onnxruntime; our stand-in without it."""
    path = find_official_hubert(models_dir(checkpoints)) if checkpoints is not None else None
    if path is None:
        return TorchHubertRunner(build_standin(), device=device)
    if device.type == "cuda":
        try:
            return load_official_hubert(path, device)
        except HubertWeightsError as exc:
            log.warning("HuBERT stays in onnxruntime: %s", exc)
    return OnnxHubertRunner(path)
