"""Cost of the HuBERT audio encoder per 200 ms hop: our batched PyTorch HuBERT, 1 and 16 sessions, fp32 and fp16.

``python -m bench.hubert [--device cuda] [--config large|small] [--onnxruntime] [--out FILE.json]``

One hop of one session is one 6480-sample chunk; 16 sessions' hops are one batch of 16 chunks.
Each timing is wall time from the chunks in host memory to the (B, 20, 1024) rows on the device
(synchronized): the host-to-device copy, the encoder, eager or replayed from a CUDA graph.
Random weights in the assumed HuBERT-Large architecture (engine/audio/hubert_torch.py): the
cost does not depend on the values, but the real file's architecture is an assumption.
``--onnxruntime`` also times onnxruntime on our exported file (what runs today: the CPU, one
chunk per call), side by side. ``--config small`` (2 layers) runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from bench.common.stats import wall_times
from engine.audio.hubert import CHUNK_SAMPLES, HOP_SAMPLES, INPUT_NAME, OUTPUT_NAME
from engine.audio.hubert_torch import HUBERT_LARGE, HubertConfig, HubertEncoder, export_official_contract, random_hubert
from engine.timebase import SAMPLE_RATE

CONFIGS = {"large": HUBERT_LARGE, "small": HubertConfig(layers=2, ffn=512, conv_channels=64, pos_kernel=16)}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
HOP_MS = 1000 * HOP_SAMPLES / SAMPLE_RATE
CPU = torch.device("cpu")


def encoder_call(
    module: HubertEncoder, chunks: torch.Tensor, device: torch.device, graphed: bool
) -> Callable[[], torch.Tensor]:
    """A call that copies ``chunks`` (host) to the device and encodes them: eager, or a CUDA graph replay."""
    dtype = next(module.parameters()).dtype
    host = chunks.pin_memory() if device.type == "cuda" else chunks
    static = torch.empty(chunks.shape, device=device, dtype=dtype)
    if not graphed:

        def eager() -> torch.Tensor:
            with torch.no_grad():
                return module(static.copy_(host, non_blocking=True))

        return eager
    static.copy_(host)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            module(static)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = module(static)

    def replay() -> torch.Tensor:
        static.copy_(host, non_blocking=True)
        graph.replay()
        return out

    return replay


def speechless_chunks(batch: int, seed: int = 0) -> torch.Tensor:
    """``batch`` chunks of quiet noise (the cost does not depend on the audio)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, CHUNK_SAMPLES, generator=generator) * 0.1


def row(label: str, batch: int, times: list[float]) -> dict[str, object]:
    """One result line: per call, per session's hop, and as a share of the 200 ms the hop lasts."""
    median = statistics.median(times)
    return {
        "runner": label,
        "sessions": batch,
        "ms_per_call_median": round(median, 3),
        "ms_per_call_p90": round(float(np.percentile(times, 90)), 3),
        "ms_per_session_hop": round(median / batch, 3),
        "share_of_a_200ms_hop": round(median / HOP_MS, 4),
        "runs": len(times),
    }


def bench_torch(
    module: HubertEncoder, device: torch.device, batches: list[int], dtypes: list[str], runs: int
) -> list[dict]:
    """Each dtype, eager and (on CUDA) graphed, at each batch; fp16 rows also say how far they are from fp32."""
    results = []
    reference = {}
    for dtype_name in dtypes:
        typed = module.to(device, DTYPES[dtype_name])
        for graphed in (False, True) if device.type == "cuda" else (False,):
            for batch in batches:
                chunks = speechless_chunks(batch)
                call = encoder_call(typed, chunks, device, graphed)
                label = f"torch {dtype_name} {'cuda graph' if graphed else 'eager'}"
                entry = row(label, batch, wall_times(call, device, runs))
                out = call().float()
                if dtype_name == "fp32":
                    reference[batch] = out.clone()
                elif batch in reference:
                    exact = reference[batch]
                    entry["rel_err_vs_fp32"] = float((out - exact).abs().max() / exact.abs().max())
                results.append(entry)
                print(entry, flush=True)
    module.to("cpu", torch.float32)
    return results


def bench_onnxruntime(module: HubertEncoder, batches: list[int], runs: int) -> list[dict]:
    """onnxruntime on our export of the same weights, one chunk per call as the official graph takes it."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = export_official_contract(module, Path(tmp) / "hubert.onnx")
        for provider in [
            p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()
        ]:
            session = ort.InferenceSession(str(path), providers=[provider])
            for batch in batches:
                feeds = [c[None].numpy() for c in speechless_chunks(batch)]
                times = wall_times(
                    lambda: [session.run([OUTPUT_NAME], {INPUT_NAME: f}) for f in feeds], CPU, runs, warmup=1
                )
                entry = row(
                    f"onnxruntime {provider.removesuffix('ExecutionProvider')} fp32, chunk by chunk", batch, times
                )
                results.append(entry)
                print(entry, flush=True)
    return results


def print_table(result: dict) -> None:
    """The short table, last thing printed."""
    print(
        f"\nHuBERT per 200 ms hop on {result['hardware']['device']} ({result['config']}, random weights, assumed "
        "architecture)"
    )
    print(f"{'runner':<48} {'sessions':>8} {'ms/call':>9} {'ms/session':>11} {'of 200 ms':>10}")
    for r in result["results"]:
        print(
            f"{r['runner']:<48} {r['sessions']:>8} {r['ms_per_call_median']:>9.2f} "
            f"{r['ms_per_session_hop']:>11.3f} {100 * r['share_of_a_200ms_hop']:>9.1f}%"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="large")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "fp16"])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--onnxruntime", action="store_true", help="also time onnxruntime on an export of the same weights"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench.hubert: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    dtypes = [d for d in args.dtypes if device.type == "cuda" or d == "fp32"]  # CPU half matmuls are not a target
    module = random_hubert(CONFIGS[args.config], seed=0)
    result: dict[str, object] = {
        "benchmark": "hubert",
        "what": "wall ms from host chunks to device rows per call; one 6480-sample chunk per session per 200 ms hop",
        "weights": "random, assumed HuBERT-Large architecture (not the official file)",
        "config": args.config,
        "hardware": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "cpu_threads": torch.get_num_threads(),
        },
        "software": {"torch": torch.__version__, "onnxruntime": ort.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results = bench_torch(module, device, args.batches, dtypes, args.runs)
    if args.onnxruntime:
        results += bench_onnxruntime(module, args.batches, max(3, args.runs // 5))
    result["results"] = results
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
