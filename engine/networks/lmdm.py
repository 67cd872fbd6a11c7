"""LMDM, Ditto's motion-diffusion denoiser: a FiLM transformer over 80-frame windows of 265-d motion.

``LMDM.forward(x, cond_frame, cond, time_cond) -> (pred_noise, x_start)`` is one denoiser call
of the DDIM loop, with classifier-free guidance (weight 2) and the noise prediction inside, as
the official graph exposes it. The conditional and unconditional passes run as one batch of 2B.
The state dict equals the official file's ``model_state_dict``; the diffusion schedule is
recomputed, never loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from engine.networks.lmdm_blocks import (
    DecoderStack,
    DenseFiLM,
    EncoderLayer,
    FiLMDecoderLayer,
    RotaryAttention,
    RotaryEmbedding,
    SinusoidalTimeEmbedding,
)
from engine.timebase import SEQ_FRAMES

MOTION_DIM = 265
COND_DIM = 1103
LATENT_DIM = 512
FF_DIM = 1024
NUM_HEADS = 8
NUM_DECODER_LAYERS = 8
NUM_ENCODER_LAYERS = 2
TIME_TOKENS = 2
GUIDANCE_WEIGHT = 2.0
DIFFUSION_STEPS = 1000
COSINE_OFFSET = 0.008
MAX_BETA = 0.999

_BIAS_STD = 0.02
_FILM_GAIN = 0.3
_OUTPUT_GAIN = 0.15
_SCHEDULE_BUFFERS = ("sqrt_recip_one_minus_alphas_cumprod", "sqrt_recip_alphas_cumprod_minus_one")


class WindowCondition(NamedTuple):
    """A window's condition encoded once for all its denoiser calls (both guidance halves, 2B rows).

    Everything that depends on the step but not on x is tabulated per step of the schedule:
    ``modulation`` (S,2B,layers,3,1024) the FiLM parameters, ``time_kv`` per layer the keys and
    values of the two time tokens (S,2,512); ``step_of_time`` (1000,) maps t to its row.
    """

    memory_kv: list[tuple[torch.Tensor, torch.Tensor]]
    modulation: torch.Tensor
    time_kv: list[tuple[torch.Tensor, torch.Tensor]]
    step_of_time: torch.Tensor


def _cosine_alphas_cumprod() -> torch.Tensor:
    """ᾱ of the cosine schedule: betas in float64, clipped to 0.999, then α and cumprod in float32."""
    steps = torch.arange(DIFFUSION_STEPS + 1, dtype=torch.float64)
    f = torch.cos((steps / DIFFUSION_STEPS + COSINE_OFFSET) / (1 + COSINE_OFFSET) * math.pi / 2) ** 2
    alphas_bar = f / f[0]
    betas = (1 - alphas_bar[1:] / alphas_bar[:-1]).clamp(0.0, MAX_BETA)
    return torch.cumprod(1.0 - betas.to(torch.float32), dim=0)


class MotionDecoder(nn.Module):
    """The official ``MotionDecoder`` (its exact state-dict keys), as single and guided passes."""

    def __init__(self, cond_dim: int = COND_DIM) -> None:
        super().__init__()
        self.cond_dim = cond_dim
        self.null_cond_embed = nn.Parameter(torch.zeros(1, SEQ_FRAMES, LATENT_DIM))
        self.null_cond_hidden = nn.Parameter(torch.zeros(1, LATENT_DIM))
        # One rotary module shared by every layer, as in the official tree (hence 11 `rotary.freqs` keys).
        self.rotary = RotaryEmbedding(LATENT_DIM, max_positions=SEQ_FRAMES + TIME_TOKENS)
        self.time_mlp = nn.Sequential(
            SinusoidalTimeEmbedding(LATENT_DIM), nn.Linear(LATENT_DIM, 4 * LATENT_DIM), nn.Mish()
        )
        self.to_time_cond = nn.Sequential(nn.Linear(4 * LATENT_DIM, LATENT_DIM))
        self.to_time_tokens = nn.Sequential(
            nn.Linear(4 * LATENT_DIM, TIME_TOKENS * LATENT_DIM), nn.Unflatten(-1, (TIME_TOKENS, LATENT_DIM))
        )
        self.norm_cond = nn.LayerNorm(LATENT_DIM)
        self.input_projection = nn.Linear(2 * MOTION_DIM, LATENT_DIM)
        self.cond_encoder = nn.Sequential(
            *(EncoderLayer(LATENT_DIM, NUM_HEADS, FF_DIM, self.rotary) for _ in range(NUM_ENCODER_LAYERS))
        )
        self.cond_projection = nn.Linear(cond_dim, LATENT_DIM)
        self.non_attn_cond_projection = nn.Sequential(
            nn.LayerNorm(LATENT_DIM), nn.Linear(LATENT_DIM, LATENT_DIM), nn.SiLU(), nn.Linear(LATENT_DIM, LATENT_DIM)
        )
        self.seqTransDecoder = DecoderStack(
            [FiLMDecoderLayer(LATENT_DIM, NUM_HEADS, FF_DIM, self.rotary) for _ in range(NUM_DECODER_LAYERS)]
        )
        self.final_layer = nn.Linear(LATENT_DIM, MOTION_DIM)

    def denoise(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor, keep_cond: bool
    ) -> torch.Tensor:
        """One decoder pass predicting x_start; ``keep_cond=False`` is the unconditional (null) pass."""
        h = self._project_input(x, cond_frame)
        t_hidden = self.time_mlp(time_cond)
        if keep_cond:
            tokens = self.cond_encoder(self.cond_projection(cond))
            hidden = self.non_attn_cond_projection(tokens.mean(dim=-2))
        else:
            tokens = self.null_cond_embed.expand(x.shape[0], -1, -1)
            hidden = self.null_cond_hidden
        return self._decode(h, tokens, hidden, t_hidden)

    def guided_denoise(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor, weight: float
    ) -> torch.Tensor:
        """Classifier-free guided x_start, unc + (cond - unc)·weight, both passes in one batch of 2B.

        Only the condition tokens and the FiLM hidden differ between the halves; the input
        projection, time embedding and condition encoder run once, on B rows.
        """
        batch = x.shape[0]
        h = self._project_input(x, cond_frame)
        t_hidden = self.time_mlp(time_cond)
        tokens = self.cond_encoder(self.cond_projection(cond))
        hidden = self.non_attn_cond_projection(tokens.mean(dim=-2))
        out = self._decode(
            h.repeat(2, 1, 1),
            torch.cat((tokens, self.null_cond_embed.expand(batch, -1, -1))),
            torch.cat((hidden, self.null_cond_hidden.expand(batch, -1))),
            t_hidden.repeat(2, 1),
        )
        return self._guide(out, weight)

    @staticmethod
    def _guide(out: torch.Tensor, weight: float) -> torch.Tensor:
        """unc + (cond − unc)·weight in float32, from the (2B,...) output of the batched passes."""
        conditioned, unconditioned = out.float().unflatten(0, (2, -1)).unbind(0)
        return unconditioned + (conditioned - unconditioned) * weight

    def _project_input(self, x: torch.Tensor, cond_frame: torch.Tensor) -> torch.Tensor:
        return self.input_projection(self.input_rows(x, cond_frame))

    @staticmethod
    def input_rows(x: torch.Tensor, cond_frame: torch.Tensor) -> torch.Tensor:
        """The input projection's rows: each frame's motion beside the window's condition frame."""
        return torch.cat((x, cond_frame.unsqueeze(1).expand(-1, x.shape[1], -1)), dim=-1)

    def _decode(
        self, h: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor, t_hidden: torch.Tensor
    ) -> torch.Tensor:
        t = self.to_time_cond(t_hidden) + hidden
        memory = self.norm_cond(torch.cat((tokens, self.to_time_tokens(t_hidden)), dim=-2))
        memory_kv = self.seqTransDecoder.project_memory(self.rotary(memory), memory)
        return self.final_layer(self.seqTransDecoder(h, memory_kv, self.seqTransDecoder.modulation(t)))


class LMDM(MotionDecoder):
    """The denoiser call of the DDIM loop: guided x_start and the noise it implies, from (x_t, t).

    Inputs are cast to the weights' dtype; the guidance and the noise prediction run in float32
    (the t≈19 coefficients are ≈24 and cancel), and the outputs come back in ``x``'s dtype.
    """

    def __init__(self, cond_dim: int = COND_DIM) -> None:
        super().__init__(cond_dim)
        alphas_cumprod = _cosine_alphas_cumprod()
        self.register_buffer("alphas_cumprod", alphas_cumprod, persistent=False)
        self.register_buffer(_SCHEDULE_BUFFERS[0], torch.sqrt(1.0 / (1.0 - alphas_cumprod)), persistent=False)
        self.register_buffer(_SCHEDULE_BUFFERS[1], torch.sqrt(1.0 / alphas_cumprod - 1), persistent=False)

    def forward(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_inputs(x, cond_frame, cond, time_cond)
        dtype = self.final_layer.weight.dtype
        x_start = self.guided_denoise(x.to(dtype), cond_frame.to(dtype), cond.to(dtype), time_cond, GUIDANCE_WEIGHT)
        return self._with_noise(x, x_start, time_cond)

    def prepare_window(self, cond: torch.Tensor, times: torch.Tensor) -> WindowCondition:
        """What every denoiser call of one window shares, for the S diffusion steps ``times`` (S,) int64.

        The condition encoder, the memory's layer norm (row-wise) and each layer's cross-attention
        keys/values of the 80 condition rows depend on neither x nor t; the time tokens' keys and
        values and the FiLM parameters depend on t and the window, not on x. A DDIM loop computes
        them once per window instead of once per step; ``forward_prepared`` then equals ``forward``.
        """
        batch = cond.shape[0]
        tokens = self.cond_encoder(self.cond_projection(cond.to(self.final_layer.weight.dtype)))
        hidden = self.non_attn_cond_projection(tokens.mean(dim=-2))
        tokens = torch.cat((tokens, self.null_cond_embed.expand(batch, -1, -1)))
        hidden = torch.cat((hidden, self.null_cond_hidden.expand(batch, -1)))
        memory = self.norm_cond(tokens)
        t_hidden = self.time_mlp(times)
        t = self.to_time_cond(t_hidden).unsqueeze(1) + hidden
        time_rows = self.norm_cond(self.to_time_tokens(t_hidden))
        step_of_time = torch.zeros(DIFFUSION_STEPS, dtype=torch.int64, device=times.device)
        step_of_time[times] = torch.arange(times.shape[0], device=times.device)
        return WindowCondition(
            self.seqTransDecoder.project_memory(self.rotary(memory), memory),
            self.seqTransDecoder.modulation(t),
            self.seqTransDecoder.project_memory(self.rotary(time_rows, offset=SEQ_FRAMES), time_rows),
            step_of_time,
        )

    def forward_prepared(
        self, x: torch.Tensor, cond_frame: torch.Tensor, prepared: WindowCondition, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` for a window whose condition went through ``prepare_window`` (every row at the same step)."""
        dtype = self.final_layer.weight.dtype
        step = prepared.step_of_time[time_cond[:1]]
        h = self._project_input(x.to(dtype), cond_frame.to(dtype)).repeat(2, 1, 1)
        rows = h.shape[0]
        memory_kv = [
            (
                torch.cat((k, tk[step].expand(rows, -1, -1)), dim=-2),
                torch.cat((v, tv[step].expand(rows, -1, -1)), dim=-2),
            )
            for (k, v), (tk, tv) in zip(prepared.memory_kv, prepared.time_kv)
        ]
        out = self.final_layer(self.seqTransDecoder(h, memory_kv, prepared.modulation[step].squeeze(0)))
        return self._with_noise(x, self._guide(out, GUIDANCE_WEIGHT), time_cond)

    def _with_noise(
        self, x: torch.Tensor, x_start: torch.Tensor, time_cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(pred_noise, x_start) in x's dtype, the noise implied by x_start at step t computed in float32."""
        a = self.sqrt_recip_one_minus_alphas_cumprod[time_cond].view(-1, 1, 1)
        b = self.sqrt_recip_alphas_cumprod_minus_one[time_cond].view(-1, 1, 1)
        pred_noise = a * x.float() - x_start / b
        return pred_noise.to(x.dtype), x_start.to(x.dtype)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> LMDM:
        """Follow the module's device but keep the schedule float32: ᾱ_999 = 2.4e-9 underflows in fp16."""
        kept = {name: self._buffers[name] for name in ("alphas_cumprod", *_SCHEDULE_BUFFERS)}
        super()._apply(fn, recurse)
        for name, original in kept.items():
            self._buffers[name] = original.to(self._buffers[name].device)
        return self

    def _check_inputs(
        self, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, time_cond: torch.Tensor
    ) -> None:
        batch = x.shape[0] if x.dim() == 3 else -1
        expected = {
            "x": (x, (batch, SEQ_FRAMES, MOTION_DIM)),
            "cond_frame": (cond_frame, (batch, MOTION_DIM)),
            "cond": (cond, (batch, SEQ_FRAMES, self.cond_dim)),
            "time_cond": (time_cond, (batch,)),
        }
        for name, (tensor, shape) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"LMDM: {name} has shape {tuple(tensor.shape)}, expected {shape} "
                    f"(B windows of {SEQ_FRAMES} frames, motion {MOTION_DIM}, condition {self.cond_dim})"
                )
        if time_cond.dtype.is_floating_point or time_cond.dtype == torch.bool:
            raise ValueError(
                f"LMDM: time_cond must hold integer timesteps 0..{DIFFUSION_STEPS - 1}, got {time_cond.dtype}"
            )


def build(state_dict: dict[str, torch.Tensor] | None = None) -> LMDM:
    """LMDM shaped for ``state_dict`` (condition width from ``cond_projection.weight``), or for D=1103."""
    if state_dict is None:
        return LMDM()
    weight = state_dict["cond_projection.weight"]
    if weight.dim() != 2 or weight.shape[0] != LATENT_DIM:
        raise ValueError(f"cond_projection.weight has shape {tuple(weight.shape)}, expected ({LATENT_DIM}, D)")
    return LMDM(cond_dim=int(weight.shape[1]))


@torch.no_grad()
def randomize(module: LMDM, generator: torch.Generator) -> None:
    """Deterministic random weights, every number from ``generator``; x_start comes out finite, std O(0.5).

    Linear weights are N(0, gain²/fan_in); FiLM generators get a small gain so that their
    scales stay near 1, the output layer a reduced one.
    """

    def normal(tensor: torch.Tensor, std: float, mean: float = 0.0) -> None:
        tensor.copy_(mean + std * torch.randn(tensor.shape, generator=generator))

    films = {id(m.block[1]) for m in module.modules() if isinstance(m, DenseFiLM)}
    gains = {id(module.final_layer): _OUTPUT_GAIN} | dict.fromkeys(films, _FILM_GAIN)
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            normal(sub.weight, gains.get(id(sub), 1.0) / math.sqrt(sub.in_features))
            normal(sub.bias, _BIAS_STD)
        elif isinstance(sub, RotaryAttention):
            normal(sub.in_proj_weight, 1.0 / math.sqrt(sub.in_proj_weight.shape[1]))
            normal(sub.in_proj_bias, _BIAS_STD)
        elif isinstance(sub, nn.LayerNorm):
            normal(sub.weight, 0.1, mean=1.0)
            normal(sub.bias, _BIAS_STD)
    normal(module.null_cond_embed, 1.0)
    normal(module.null_cond_hidden, 1.0)


def finalize(module: LMDM, fold_batchnorm: bool = False) -> None:
    """Rebuild the rotary cos/sin tables from the loaded ``rotary.freqs`` (LMDM has no BatchNorm)."""
    module.rotary.refresh()
