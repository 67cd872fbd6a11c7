"""The engine: networks shared by every session on one device, and the sessions made from them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.audio.hubert import CHUNK_SAMPLES, OnnxHubertRunner, TorchHubertRunner, find_official_hubert, valid_features
from engine.audio.standin_hubert import build_standin
from engine.backends.base import Backend, BackendError
from engine.backends.torch_backend import TorchBackend, default_device
from engine.diffusion.ddim import DEFAULT_STEPS, DDIMSampler
from engine.diffusion.graphed import GraphedSampler
from engine.motion.conditions import NEUTRAL, Emotion
from engine.networks import OFFICIAL_FILENAMES, write_random_checkpoints
from engine.session import HOP_FRAMES, Session

if TYPE_CHECKING:
    from avatars.cache import Avatar

LIVE_OVERLAP = 75
OFFLINE_OVERLAP = 10
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
    base = Path(os.environ.get("DITTO_CACHE_DIR", Path.home() / ".cache" / "ditto-live"))
    directory = base / f"random-weights-seed{seed}"
    if not all((directory / f).is_file() for f in OFFICIAL_FILENAMES.values()):
        write_random_checkpoints(directory, seed=seed)
    return directory


class Engine:
    """Shared networks (one backend), the audio encoder and per-seed samplers; opens sessions."""

    def __init__(
        self, backend: Backend, hubert, steps: int = DEFAULT_STEPS, render_batch: int | None = None, use_graphs: bool = True
    ) -> None:
        self.backend = backend
        self.device = backend.device
        self.hubert = hubert
        self.steps = steps
        # Graph capture is the torch backend's; TensorRT plans are enqueued call by call until a real
        # TensorRT has shown that capturing execute_async_v3 with per-stream contexts works here.
        self.use_graphs = use_graphs and isinstance(backend, TorchBackend)
        self.render_batch = render_batch or (8 if self.device.type == "cuda" else 2)
        self.cond_width = backend.cond_width
        self._samplers: dict[int, GraphedSampler] = {}
        if use_graphs and isinstance(backend, TorchBackend):
            backend.capture_render(tuple(sorted({self.render_batch, HOP_FRAMES})))
        with torch.inference_mode():
            silence = torch.zeros(1, CHUNK_SAMPLES)
            self.silence_feature = valid_features(hubert.encode_batch(silence)).reshape(-1, 1024)[0].to(self.device).float()

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
        """Load the networks from official checkpoints (or random stand-ins when None) onto ``device``.

        ``compile_networks`` (torch backend, CUDA): fuse kernels with torch.compile; it costs about a
        minute at start and per new batch size, and pays off for live serving and long renders.
        """
        device = torch.device(device) if device is not None else default_device()
        folder = models_dir(checkpoints) if checkpoints is not None else random_checkpoints()
        if backend == "auto":
            backend = "tensorrt" if plans is not None else "torch"
        if backend == "torch":
            nets = TorchBackend(folder, device=device, compile_networks=compile_networks)
        elif backend == "tensorrt":
            from engine.backends.tensorrt_backend import TensorRTBackend

            if plans is None:
                raise BackendError("the tensorrt backend needs --plans DIR (build them with python -m compile.build_plans)")
            nets = TensorRTBackend(plans, checkpoints=folder, device=device)
        else:
            raise BackendError(f"unknown backend {backend!r}: choose torch, tensorrt or auto")
        return cls(nets, hubert_runner(checkpoints, device), steps=steps)

    def sampler_for_seed(self, seed: int) -> GraphedSampler:
        """The (graph-captured) DDIM sampler whose per-step noise comes from ``seed``; shared by sessions with that seed."""
        if seed not in self._samplers:
            sampler = DDIMSampler(self.steps, seed=seed, device=self.device)
            prepare = getattr(self.backend, "lmdm_prepare", None)
            denoiser = self.backend.lmdm_prepared if prepare is not None else self.backend.lmdm
            self._samplers[seed] = GraphedSampler(sampler, denoiser, self.cond_width, self.use_graphs, prepare)
        return self._samplers[seed]

    def session(
        self, avatar: Avatar, overlap: int = LIVE_OVERLAP, emotion: Emotion = NEUTRAL, seed: int = 0
    ) -> Session:
        """A new session speaking with ``avatar``; ``overlap`` is the latency knob (75: a window per 200 ms hop)."""
        return Session(self, avatar, overlap=overlap, emotion=emotion, seed=seed)


def hubert_runner(checkpoints: str | Path | None, device: torch.device):
    """The official streaming HuBERT ONNX when the checkpoints have it, else our stand-in on ``device``."""
    path = find_official_hubert(models_dir(checkpoints)) if checkpoints is not None else None
    if path is not None:
        return OnnxHubertRunner(path)
    return TorchHubertRunner(build_standin(), device=device)
