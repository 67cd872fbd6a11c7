"""Streaming HuBERT audio features: 16 kHz samples in, one 1024-d feature per 25-fps video frame out.

The contract of Ditto's ``hubert_streaming_fix_kv.onnx`` (its ``core/aux_models/hubert_stream.py``): input
``input_values`` (1, N) float32 at 16 kHz, output ``encoding_out`` (T, 1024) at 50 rows/s.
Chunking 3-5-2 (past, current, future video frames of 640 samples): the stream starts with
1920 zero samples; chunk j is samples [3200 j, 3200 j + 6480) of that padded stream; its rows
[-14:-4] (10 rows), averaged in pairs, are the features of real video frames 5j..5j+4. So a
hop's 5 features need 2 frames (+80 samples) of audio after it: the look-ahead.

The reference's offline features (``Wav2FeatHubert.wav2feat``, used for file renders) cut the
same chunks from a clip with 2000 leading zeros instead of 1920, so each chunk starts 80
samples earlier; ``offline_features`` reproduces them, frame count included.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from engine.graph_pool import GraphPool
from engine.timebase import FPS, HOP_FRAMES, SAMPLE_RATE, SAMPLES_PER_FRAME

PAST_FRAMES, FUTURE_FRAMES = 3, 2
"""The 3-5-2 chunking's context: video frames of audio before and after a hop's ``HOP_FRAMES`` (5)."""
ROWS_PER_FRAME = 2
CHUNK_SAMPLES = (PAST_FRAMES + HOP_FRAMES + FUTURE_FRAMES) * SAMPLES_PER_FRAME + 80
HOP_SAMPLES = HOP_FRAMES * SAMPLES_PER_FRAME
LEAD_ZEROS = PAST_FRAMES * SAMPLES_PER_FRAME
OFFLINE_LEAD_ZEROS = CHUNK_SAMPLES - (HOP_FRAMES + FUTURE_FRAMES) * SAMPLES_PER_FRAME
"""2000: the reference's offline clips start with this many zeros (80 more than a stream's 1920)."""
FEATURE_DIM = 1024
OFFICIAL_FILE = "hubert_streaming_fix_kv.onnx"
INPUT_NAME = "input_values"
OUTPUT_NAME = "encoding_out"
MAX_BATCH = 32
_END_ROW = -FUTURE_FRAMES * ROWS_PER_FRAME


class HubertRunner(Protocol):
    """Runs the encoder on 6480-sample chunks; outputs live on ``device``."""

    device: torch.device
    graphs: bool
    """Whether ``capture`` records CUDA graphs of the encoder (the runtime captures them at warm-up)."""
    buckets: tuple[int, ...]
    """The batch sizes captured so far."""

    def capture(self, pool: GraphPool | None = None) -> None:
        """Capture the encoder for streaming chunks at its batch buckets, in ``pool`` (only where ``graphs``)."""

    def encode(self, chunk: torch.Tensor) -> torch.Tensor:
        """One chunk (1, N) -> encoding (T, 1024) float32."""

    def encode_batch(self, chunks: torch.Tensor) -> torch.Tensor:
        """Chunks (B, N) -> encodings (B, T, 1024) float32."""


def valid_features(encoding: torch.Tensor, current: int = HOP_FRAMES) -> torch.Tensor:
    """Encodings (..., T, 1024) -> the current hop's features (..., current, 1024): the ``current`` frames before the
    look-ahead (rows [-14:-4] at 5), each the mean of its two rows."""
    first = -(current + FUTURE_FRAMES) * ROWS_PER_FRAME
    if encoding.shape[-2] < -first or encoding.shape[-1] != FEATURE_DIM:
        raise ValueError(f"encoding must be (..., T>={-first}, {FEATURE_DIM}), got {tuple(encoding.shape)}")
    rows = encoding[..., first:_END_ROW, :]
    return rows.reshape(*rows.shape[:-2], current, ROWS_PER_FRAME, FEATURE_DIM).mean(-2)


def frames_for_samples(num_samples: int) -> int:
    """Video frames (25 fps) that cover ``num_samples`` at 16 kHz: ceil(N / 640)."""
    return math.ceil(num_samples / SAMPLES_PER_FRAME)


class OnnxHubertRunner:
    """The official ONNX file (or our stand-in) in onnxruntime: CUDA provider when available, else CPU.

    Keeps the official batch-1 contract; ``encode_batch`` runs chunks one by one. Outputs are
    CPU tensors (onnxruntime hands back host arrays).
    """

    def __init__(self, path: str | Path, providers: list[str] | None = None) -> None:
        import onnxruntime as ort  # here, not at import: only the official file runs in it (35 ms of every start)

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"HuBERT ONNX file not found: {path} (expected hubert_streaming_fix_kv.onnx)")
        if providers is None:
            available = ort.get_available_providers()
            providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        self.session = ort.InferenceSession(str(path), providers=providers)
        self.graphs = False
        self.buckets: tuple[int, ...] = ()
        inputs = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if inputs != [INPUT_NAME] or OUTPUT_NAME not in outputs:
            raise ValueError(
                f"{path} has inputs {inputs} and outputs {outputs}; the HuBERT streaming contract needs "
                f"input {INPUT_NAME!r} and output {OUTPUT_NAME!r}"
            )
        self.device = torch.device("cpu")

    def encode(self, chunk: torch.Tensor) -> torch.Tensor:
        """One chunk (1, N) -> encoding (T, 1024) float32 on the CPU."""
        if chunk.ndim != 2 or chunk.shape[0] != 1:
            raise ValueError(f"chunk must be (1, N), got {tuple(chunk.shape)}")
        feed = chunk.detach().to("cpu", torch.float32).numpy()
        (out,) = self.session.run([OUTPUT_NAME], {INPUT_NAME: feed})
        if out.ndim != 2 or out.shape[1] != FEATURE_DIM:
            raise ValueError(f"{OUTPUT_NAME} must be (T, {FEATURE_DIM}), the model returned {out.shape}")
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def encode_batch(self, chunks: torch.Tensor) -> torch.Tensor:
        """Chunks (B, N) -> encodings (B, T, 1024), one session run per chunk."""
        return torch.stack([self.encode(chunk[None]) for chunk in chunks])

    def capture(self, pool: GraphPool | None = None) -> None:
        """Refuses: onnxruntime runs the file as it is, no graphs of ours."""
        raise RuntimeError("the onnxruntime HuBERT captures no graphs (graphs is False)")


def find_official_hubert(models: Path) -> Path | None:
    """The published streaming HuBERT ONNX in ``../aux_models`` of the models folder (or beside it), if present."""
    for candidate in (models.parent / "aux_models" / OFFICIAL_FILE, models / OFFICIAL_FILE):
        if candidate.is_file():
            return candidate
    return None


GRAPH_BUCKETS = (1, 2, 4, 8, 16, MAX_BATCH)
"""Chunks per call captured as CUDA graphs: a HuBERT-Large call is ~400 small kernels, whose launches a replay skips."""


class TorchHubertRunner:
    """A batched PyTorch encoder module, (B, N) -> (B, T, 1024), on any device, in fp32.

    On CUDA, ``capture`` records the encoder for streaming chunks (N = 6480) at a few batch sizes;
    a call replays the smallest graph that fits, padded with zero chunks (rows are independent).
    An unbatched graph such as an onnx2torch conversion of the official file, (1, N) -> (T, 1024),
    needs a wrapper that runs it chunk by chunk and stacks the results before it is handed here.
    """

    def __init__(self, module: nn.Module, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.module = module.to(self.device, torch.float32).eval()
        self.graphs = self.device.type == "cuda"
        self._graphs: dict[int, _GraphedEncoder] = {}

    @property
    def buckets(self) -> tuple[int, ...]:
        """The batch sizes captured so far (empty on the CPU)."""
        return tuple(sorted(self._graphs))

    def capture(self, buckets: tuple[int, ...] = GRAPH_BUCKETS, pool: GraphPool | None = None) -> None:
        """Capture one graph per bucket of streaming chunks, largest first, in ``pool`` (by default one of its own);
        CUDA only."""
        if not self.graphs:
            raise RuntimeError(f"HuBERT on {self.device} captures no graphs (CUDA only)")
        pool = pool or GraphPool(self.device)
        for batch in sorted(set(buckets) - set(self._graphs), reverse=True):
            self._graphs[batch] = _GraphedEncoder(self.module, batch, self.device, pool)

    @torch.no_grad()
    def encode_batch(self, chunks: torch.Tensor) -> torch.Tensor:
        """Chunks (B, N) -> encodings (B, T, 1024) float32 on ``device``."""
        if chunks.ndim != 2:
            raise ValueError(f"chunks must be (B, N), got {tuple(chunks.shape)}")
        chunks = chunks.to(torch.float32)
        if self.device.type == "cuda":
            # Audio is the one thing that crosses to the GPU: from pinned memory the copy is asynchronous.
            chunks = chunks.pin_memory()
        bucket = next((b for b in self.buckets if b >= chunks.shape[0]), None)
        if bucket is not None and chunks.shape[1] == CHUNK_SAMPLES:
            return self._graphs[bucket](chunks)
        out = self.module(chunks.to(self.device, non_blocking=True))
        if out.ndim != 3 or out.shape[0] != chunks.shape[0] or out.shape[2] != FEATURE_DIM:
            raise ValueError(f"the module must return (B, T, {FEATURE_DIM}), it returned {tuple(out.shape)}")
        return out

    def encode(self, chunk: torch.Tensor) -> torch.Tensor:
        """One chunk (1, N) -> encoding (T, 1024)."""
        if chunk.ndim != 2 or chunk.shape[0] != 1:
            raise ValueError(f"chunk must be (1, N), got {tuple(chunk.shape)}")
        return self.encode_batch(chunk)[0]


class _GraphedEncoder:
    """The encoder captured for ``batch`` streaming chunks, with static input and output buffers."""

    def __init__(self, module: nn.Module, batch: int, device: torch.device, pool: GraphPool) -> None:
        self.input = torch.zeros(batch, CHUNK_SAMPLES, device=device)
        with pool.warm_up(), torch.no_grad():
            module(self.input)
        self.graph = torch.cuda.CUDAGraph()
        with pool.capture(self.graph), torch.no_grad():
            self.output = module(self.input)

    def __call__(self, chunks: torch.Tensor) -> torch.Tensor:
        """Host or device chunks (b <= batch, 6480) -> encodings (b, T, 1024), a copy the next call cannot overwrite."""
        n = chunks.shape[0]
        self.input[:n].copy_(chunks, non_blocking=True)
        self.input[n:].zero_()
        self.graph.replay()
        return self.output[:n].clone()


class AudioChunker:
    """Cuts one 16 kHz stream into HuBERT's chunks, with no encoder attached: 3-5-2 frames (past, current, future) by
    default; ``current`` frames per hop otherwise, the chunk keeping its 6480 samples (more past, the same look-ahead).

    ``take`` hands out the chunks completed so far (a hop's features need its 80 ms look-ahead);
    ``take_final`` ends the stream, zero-padding so every real video frame, ceil(samples / 640)
    of them, gets exactly one feature. The caller encodes the chunks (batched across streams)
    and keeps the first ``frames`` features of the result.
    """

    def __init__(self, current: int = HOP_FRAMES) -> None:
        if not 1 <= current <= PAST_FRAMES + HOP_FRAMES:
            raise ValueError(f"a HuBERT hop is 1 to {PAST_FRAMES + HOP_FRAMES} frames, got {current}")
        self.current = current
        self.hop_samples = current * SAMPLES_PER_FRAME
        self.lead_zeros = CHUNK_SAMPLES - (current + FUTURE_FRAMES) * SAMPLES_PER_FRAME - 80
        self.reset()

    def reset(self) -> None:
        """Forget all audio: the next push starts a new stream."""
        self._buffer = np.zeros(self.lead_zeros, dtype=np.float32)
        self.samples_pushed = 0
        self.frames_emitted = 0

    def push(self, samples: np.ndarray) -> None:
        """Append 1-D float32 samples at 16 kHz."""
        if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
            raise TypeError(
                "push() takes 1-D float32 numpy samples at 16 kHz; convert with engine.audio.pcm.to_mono_16k "
                f"or StreamingResampler (got {type(samples).__name__} {getattr(samples, 'dtype', '')} "
                f"{getattr(samples, 'shape', '')})"
            )
        self._buffer = np.concatenate([self._buffer, samples])
        self.samples_pushed += samples.size

    @property
    def complete_chunks(self) -> int:
        """Chunks whose audio, look-ahead included, has all arrived."""
        if self._buffer.size < CHUNK_SAMPLES:
            return 0
        return (self._buffer.size - CHUNK_SAMPLES) // self.hop_samples + 1

    def samples_for_chunks(self, count: int) -> int:
        """Samples still to push before ``count`` chunks (those complete now included) are complete."""
        return max(CHUNK_SAMPLES + self.hop_samples * (count - 1) - self._buffer.size, 0) if count > 0 else 0

    def take(self, limit: int | None = None) -> tuple[np.ndarray, int]:
        """Up to ``limit`` complete chunks (k, 6480) and the number of features they yield (``current`` each)."""
        count = self.complete_chunks if limit is None else min(limit, self.complete_chunks)
        return self._cut(count), count * self.current

    def take_final(self) -> tuple[np.ndarray, int]:
        """End of stream: the chunks for every remaining real frame and how many features to keep; then reset."""
        missing = frames_for_samples(self.samples_pushed) - self.frames_emitted
        count = math.ceil(missing / self.current)
        needed = (count - 1) * self.hop_samples + CHUNK_SAMPLES if count else 0
        if self._buffer.size < needed:
            self._buffer = np.concatenate([self._buffer, np.zeros(needed - self._buffer.size, np.float32)])
        chunks = self._cut(count)
        self.reset()
        return chunks, missing

    def _cut(self, count: int) -> np.ndarray:
        """The first ``count`` chunks of the buffer; drops the consumed hops."""
        if count == 0:
            return np.zeros((0, CHUNK_SAMPLES), np.float32)
        starts = np.arange(count) * self.hop_samples
        chunks = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(self._buffer, CHUNK_SAMPLES)[starts])
        self._buffer = self._buffer[count * self.hop_samples :]
        self.frames_emitted += count * self.current
        return chunks


def encode_chunks(runner: HubertRunner, chunks: np.ndarray, current: int = HOP_FRAMES) -> torch.Tensor:
    """Chunks (k, 6480) -> their features (k·current, 1024) on ``runner.device``."""
    return valid_features(encodings(runner, chunks), current).reshape(-1, FEATURE_DIM)


def encodings(runner: HubertRunner, chunks: np.ndarray) -> torch.Tensor:
    """Chunks (k, 6480) -> their encodings (k, T, 1024) on ``runner.device``, in batches of up to MAX_BATCH."""
    if chunks.shape[0] == 0:
        return torch.empty(
            0, ROWS_PER_FRAME * (PAST_FRAMES + HOP_FRAMES + FUTURE_FRAMES), FEATURE_DIM, device=runner.device
        )
    tensor = torch.from_numpy(chunks)
    return torch.cat([runner.encode_batch(tensor[i : i + MAX_BATCH]) for i in range(0, chunks.shape[0], MAX_BATCH)])


class HubertFeatureStream:
    """Per-stream feature extractor: an ``AudioChunker`` with its encoder, for single-stream use.

    ``push`` returns (5k, 1024) features, five per completed hop; ``flush`` ends the stream so that
    every real video frame has exactly one feature. Features live on ``runner.device``.
    """

    def __init__(self, runner: HubertRunner, current: int = HOP_FRAMES) -> None:
        self.runner = runner
        self.chunker = AudioChunker(current)

    def reset(self) -> None:
        """Forget all audio: the next push starts a new stream."""
        self.chunker.reset()

    def push(self, samples: np.ndarray) -> torch.Tensor:
        """Add samples; return the features of every hop whose chunk is now complete (possibly none)."""
        self.chunker.push(samples)
        chunks, _ = self.chunker.take()
        return encode_chunks(self.runner, chunks, self.chunker.current)

    def flush(self) -> torch.Tensor:
        """End of stream: features for the remaining real frames (zero audio after the end), then reset."""
        chunks, keep = self.chunker.take_final()
        return encode_chunks(self.runner, chunks, self.chunker.current)[:keep]


def extract_features(runner: HubertRunner, samples: np.ndarray) -> torch.Tensor:
    """Offline: the streaming features of a whole 16 kHz clip, (ceil(N / 640), 1024)."""
    stream = HubertFeatureStream(runner)
    return torch.cat([stream.push(samples), stream.flush()])


def offline_frame_count(num_samples: int) -> int:
    """Frames of a clip as the reference's offline mode counts them: ceil(N / 16000 · 25) in floating point.

    This equals ceil(N / 640) except at some exact multiples of 640 samples (4480 is the first),
    where the float product lands just above an integer and the clip gets one more frame.
    """
    return math.ceil(num_samples / SAMPLE_RATE * FPS)


def offline_chunks(samples: np.ndarray) -> np.ndarray:
    """The reference's offline HuBERT chunks (k, 6480) of a whole 16 kHz clip: 2000 zeros before it, 6480 after,
    a chunk every 5 frames. Chunk starts are computed as the reference does, int(i · 0.04 · 16000), which falls
    one sample short at some frames (1615 is the first)."""
    if not isinstance(samples, np.ndarray) or samples.ndim != 1 or samples.size == 0:
        raise ValueError(
            f"samples must be a non-empty 1-D array of 16 kHz audio, got {getattr(samples, 'shape', type(samples))}"
        )
    count = offline_frame_count(samples.size)
    zeros = np.zeros(OFFLINE_LEAD_ZEROS, np.float32)
    padded = np.concatenate([zeros, samples.astype(np.float32, copy=False), np.zeros(CHUNK_SAMPLES, np.float32)])
    starts = [int(i * 0.04 * SAMPLE_RATE) for i in range(0, count, HOP_FRAMES)]
    return np.stack([padded[s : s + CHUNK_SAMPLES] for s in starts])


def offline_features(runner: HubertRunner, samples: np.ndarray) -> torch.Tensor:
    """The reference's offline features of a whole 16 kHz clip, (offline_frame_count(N), 1024) on ``runner.device``."""
    return encode_chunks(runner, offline_chunks(samples))[: offline_frame_count(samples.size)]
