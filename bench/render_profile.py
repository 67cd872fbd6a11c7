"""Where the render's and the LMDM's GPU time goes, per kernel and per layer, and what other formulations cost.

``python -m bench.render_profile --out DIR`` (CUDA, random weights) writes ``kernels_render.txt``
(top kernels of the compiled, graphed warp+decode bucket), ``layers.json`` (every convolution of
the eager warp network and decoder: ms/frame and TFLOP/s), ``conv_variants.json`` (the warp's big
3-D convolutions as cuDNN 3-D convolutions vs 2-D convolutions over depth planes) and
``lmdm.json`` (LMDM samplers, ``--lmdm-variants`` of ``LMDM_VARIANTS``: ms per window at each
batch, kernels per DDIM step by kind, error against the fp32 CPU window; ATen operators and
Inductor launches per step of the plain and the fused step; ``--parts lmdm`` also runs on the
CPU, without the kernel profile), ``attention.json`` (the LMDM's attention shapes under each SDPA
backend: µs and kernels per call),
``speed.json`` (the render and LMDM speeds with their error against fp32 modules) and
``decoder.json`` (the plain, the fused-SPADE and the composed-shortcut decoder, alone and after
the warp network, per frame at each batch, with FLOPs and error against fp32; ``--parts decoder
--device cpu`` runs it eagerly on a CPU, slowly, with ``--batches 1 --repeat 1``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from bench.common import lmdm_ops
from bench.common.parts import render_inputs_with_motion
from bench.common.stats import psnr
from engine.backends.torch_backend import TorchBackend
from engine.diffusion.ddim import denoiser_step
from engine.diffusion.graphed import BucketedSampler
from engine.diffusion.schedule import ddim_schedule
from engine.engine import Engine, random_checkpoints
from engine.motion.vector import MOTION_DIM
from engine.networks.depth_planes import as_planes, shifted_sum, stacked_weight
from engine.networks.lmdm_fused import FusedLMDMStep
from engine.timebase import DEFAULT_STEPS, SEQ_FRAMES
from engine.timing import gpu_time

BATCH = 16


def median_ms(fn, repeat: int = 20) -> float:
    """Median CUDA-event milliseconds of ``fn``."""
    return statistics.median(gpu_time(fn, repeat))


def kernel_rows(prof, frames: int, top: int = 25) -> tuple[list[dict], float]:
    """The top CUDA kernels by total device time: name, calls, ms per frame, share."""
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events)
    rows = []
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        rows.append(
            {
                "kernel": e.key[:110],
                "calls": e.count,
                "ms_per_frame": e.self_device_time_total / 1e3 / frames,
                "share": e.self_device_time_total / total,
            }
        )
    return rows, total / 1e3


def profile_graphed_render(backend: TorchBackend, out: Path) -> dict:
    """Top kernels of the captured warp+decode graph at BATCH frames."""
    backend.capture_render((BATCH,))
    feature = torch.randn(BATCH, 32, 16, 64, 64, device="cuda", dtype=backend.dtype)
    kp_s = (torch.rand(BATCH, 21, 3, device="cuda") - 0.5) * 0.6
    kp_d = kp_s + 0.02 * torch.randn_like(kp_s)
    run = lambda: backend.render(feature, kp_s, kp_d)  # noqa: E731
    per_frame = median_ms(run) / BATCH
    replays = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
        torch.cuda.synchronize()
    rows, total_ms = kernel_rows(prof, BATCH * replays)
    lines = [
        f"graphed warp+decode, batch {BATCH}: {per_frame:.3f} ms/frame (events); kernels sum "
        f"{total_ms / BATCH / replays:.3f} ms/frame"
    ]
    lines += [
        f"{r['share'] * 100:6.2f}%  {r['ms_per_frame']:.4f} ms/frame  x{r['calls'] // replays:<4} {r['kernel']}"
        for r in rows
    ]
    (out / "kernels_render.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]), flush=True)
    return {"graphed_ms_per_frame": per_frame, "kernels_ms_per_frame": total_ms / BATCH / replays}


def conv_flops(module: nn.Module, output: torch.Tensor) -> float:
    """2 x MACs of a convolution from its weight and output shapes."""
    weight = module.weight
    return 2.0 * output.numel() * weight[0].numel()


def layer_times(backend: TorchBackend, out: Path) -> dict:
    """Per-convolution device time of the eager warp network and decoder at BATCH frames."""
    warp, decoder = backend.network("warp_network"), backend.network("decoder")
    records: dict[str, list] = {}
    hooks = []
    for prefix, net in (("warp", warp), ("decoder", decoder)):
        for name, module in net.named_modules():
            if not isinstance(module, (nn.Conv2d, nn.Conv3d)):
                continue

            def pre(mod, args, key=f"{prefix}.{name}"):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                records.setdefault(key, [None, None, 0.0, ""])[0] = start

            def post(mod, args, output, key=f"{prefix}.{name}"):
                stop = torch.cuda.Event(enable_timing=True)
                stop.record()
                entry = records[key]
                entry[1] = stop
                entry[2] = conv_flops(mod, output)
                entry[3] = f"{tuple(args[0].shape[1:])}->{tuple(output.shape[1:])} k{tuple(mod.kernel_size)}"

            hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    feature = torch.randn(BATCH, 32, 16, 64, 64, device="cuda", dtype=backend.dtype)
    kp = (torch.rand(BATCH, 21, 3, device="cuda", dtype=backend.dtype) - 0.5) * 0.6
    totals: dict[str, list[float]] = {}
    with torch.inference_mode():
        for rep in range(6):
            torch.cuda.synchronize()
            backend.decode(backend.warp(feature, kp, kp + 0.01))
            torch.cuda.synchronize()
            if rep < 2:
                continue
            for key, (start, stop, _, _) in records.items():
                totals.setdefault(key, []).append(start.elapsed_time(stop))
        eager_warp = median_ms(lambda: backend.network("warp_network")(feature, kp, kp + 0.01), 5)
        eager_decoder = median_ms(
            lambda: decoder(torch.randn(BATCH, 256, 64, 64, device="cuda", dtype=backend.dtype)), 5
        )
    for h in hooks:
        h.remove()
    layers = []
    for key, times in totals.items():
        ms = statistics.median(times)
        flops = records[key][2]
        layers.append(
            {
                "layer": key,
                "shape": records[key][3],
                "ms_per_frame": ms / BATCH,
                "gflop_per_frame": flops / BATCH / 1e9,
                "tflops": flops / ms / 1e9,
            }
        )
    layers.sort(key=lambda r: -r["ms_per_frame"])
    result = {
        "batch": BATCH,
        "eager_warp_ms_per_frame": eager_warp / BATCH,
        "eager_decoder_ms_per_frame": eager_decoder / BATCH,
        "convs": layers,
    }
    (out / "layers.json").write_text(json.dumps(result, indent=1))
    print(f"eager warp {eager_warp / BATCH:.3f} ms/frame, decoder {eager_decoder / BATCH:.3f} ms/frame; top convs:")
    for r in layers[:14]:
        print(
            f"  {r['layer']:<52} {r['shape']:<44} {r['ms_per_frame']:.4f} ms/frame {r['tflops']:6.1f} TFLOP/s",
            flush=True,
        )
    return result


def planes_conv(x: torch.Tensor, weight2d: torch.Tensor, bias: torch.Tensor, k: int, out_ch: int) -> torch.Tensor:
    """A 3-D convolution as ``engine.networks.depth_planes`` computes it: a 2-D convolution over depth planes, a shifted
    sum."""
    y = F.conv2d(as_planes(x, weight2d.shape[1]), weight2d, padding=k // 2)
    return shifted_sum(y, x.shape[0], k, weight2d.shape[0] // k, out_ch) + bias.view(-1, 1, 1, 1)


def conv_variants(dtype: torch.dtype, out: Path) -> list[dict]:
    """The warp's heaviest 3-D convolutions in other formulations: ms/frame, TFLOP/s and error against fp32.

    The convolutions come from the plain warp network (the backend's own runs them over depth planes already).
    """
    from engine.networks import OFFICIAL_FILENAMES, load_network

    folder = random_checkpoints()
    warp = load_network("warp_network", folder / OFFICIAL_FILENAMES["warp_network"], "cuda", dtype, fold_batchnorm=True)
    dense = warp.dense_motion_network
    cases = [
        ("mask 142->22 k7", dense.mask, 16, 64),
        ("hourglass final 142->142 k3", dense.hourglass.decoder.conv, 16, 64),
        ("encoder0 110->64 k3", dense.hourglass.encoder.down_blocks[0].conv, 16, 64),
        ("up4 128->32 k3", dense.hourglass.decoder.up_blocks[4].conv, 16, 64),
        ("up3 256->64 k3", dense.hourglass.decoder.up_blocks[3].conv, 16, 32),
    ]
    results = []
    for label, conv, depth, size in cases:
        weight, bias = conv.weight, conv.bias
        o, c, k = weight.shape[:3]
        x = torch.randn(BATCH, c, depth, size, size, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last_3d
        )
        flops = 2.0 * BATCH * o * depth * size * size * c * k**3
        with torch.inference_mode():
            reference = F.conv3d(x[:2].float(), weight.float(), bias.float(), padding=k // 2)

            def error(y: torch.Tensor) -> float | None:
                if y.shape[1:] != reference.shape[1:]:
                    return None
                return float((y[:2].float() - reference).norm() / reference.norm())

            def record(name: str, fn) -> None:
                torch.backends.cudnn.benchmark = name.endswith("benchmark")
                y = fn()
                ms = median_ms(fn)
                results.append(
                    {
                        "conv": label,
                        "variant": name,
                        "ms_per_frame": ms / BATCH,
                        "tflops": flops / ms / 1e9,
                        "rel_err": error(y),
                    }
                )
                print(
                    f"  {label:<30} {name:<40} {ms / BATCH:.4f} ms/frame {flops / ms / 1e9:6.1f} TFLOP/s err "
                    f"{results[-1]['rel_err'] or float('nan'):.1e}",
                    flush=True,
                )

            record("conv3d", lambda: F.conv3d(x, weight, bias, padding=k // 2))
            record("conv3d benchmark", lambda: F.conv3d(x, weight, bias, padding=k // 2))
            for pad_o, pad_c in ((o, c), (math.ceil(o / 8) * 8, math.ceil(c / 16) * 16)):
                w2 = stacked_weight(weight, pad_o, pad_c).contiguous(memory_format=torch.channels_last)
                planes = as_planes(x, pad_c)
                tag = f"out{pad_o * k} in{pad_c}"
                record(f"2d planes conv only {tag}", lambda: F.conv2d(planes, w2, padding=k // 2))
                record(f"2d planes conv only {tag} benchmark", lambda: F.conv2d(planes, w2, padding=k // 2))
                fused = torch.compile(planes_conv)
                record(f"2d planes + shift-sum {tag} benchmark", lambda: fused(x, w2, bias, k, o))
    torch.backends.cudnn.benchmark = False
    (out / "conv_variants.json").write_text(json.dumps(results, indent=1))
    return results


LMDM_VARIANTS = ("plain", "fused_tf32", "fp16_products", "runtime", "autotuned")


def lmdm_sampler(backend: TorchBackend, variant: str, buckets: tuple[int, ...]) -> BucketedSampler:
    """An LMDM sampler captured at ``buckets``: "plain" the plain prepared step compiled, the update eager;
    "fused_tf32" ``FusedLMDMStep`` with fp32 products (TF32) compiled, its window preparation eager (as the runtime
    ran before fp16 products, though with today's fused step); "fp16_products" the same with fp16 products; "runtime"
    the backend's step and
    preparation as the runtime runs them; "autotuned" the runtime's step compiled with max-autotune
    (Triton GEMMs with fused epilogues, no cuBLAS split-K), its preparation as the runtime's."""
    net = backend.network("lmdm")
    schedule = ddim_schedule(DEFAULT_STEPS, backend.device)
    times = schedule.times
    compiled = (lambda fn, **kw: torch.compile(fn, **kw)) if backend.device.type == "cuda" else (lambda fn, **kw: fn)
    if variant == "plain":
        step, prepare = denoiser_step(compiled(net.forward_prepared)), net.prepare_window
    elif variant == "runtime":
        step, prepare = backend.lmdm_step, backend.lmdm_prepare
    else:
        fused = FusedLMDMStep(net, None if variant == "fused_tf32" else backend.dtype)
        autotuned = variant == "autotuned"
        step = compiled(fused.ddim_step, mode="max-autotune-no-cudagraphs" if autotuned else None)
        prepare = backend.lmdm_prepare if autotuned else fused.prepare_window
    sampler = BucketedSampler(schedule, step, net.cond_dim, (SEQ_FRAMES, MOTION_DIM), lambda c: prepare(c, times))
    sampler.capture(buckets)
    # The graphs are captured, so this variant's compiled code is not called again: the next variant's
    # compiles (the same code objects) start from a clean cache instead of running into its limit.
    torch._dynamo.reset()
    return sampler


def attention_backends(out: Path) -> dict:
    """The LMDM's attention shapes (8 heads of 64, 80 queries over 80 or 82 keys, fp16) under each SDPA backend:
    µs per call replayed in a CUDA graph of 16 calls, and kernels per call (cuDNN adds a memset)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result = {}
    for rows in (2, 32):
        q = torch.randn(rows, 8, 80, 64, device="cuda", dtype=torch.float16)
        kv = torch.randn(rows, 8, 82, 64, device="cuda", dtype=torch.float16)
        expected = F.scaled_dot_product_attention(q.float(), kv.float(), kv.float())
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            name = f"{backend.name.lower()}_rows{rows}"
            try:
                with sdpa_kernel(backend):
                    call = graphed(lambda: [F.scaled_dot_product_attention(q, kv, kv) for _ in range(16)][-1])
                    got = F.scaled_dot_product_attention(q, kv, kv)
            except RuntimeError as error:
                result[name] = {"error": str(error).splitlines()[0]}
                continue
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0]
            result[name] = {
                "us_per_call": median_ms(call) / 16 * 1e3,
                "kernels_per_call": len(kernels) / 16,
                "max_abs_err_vs_fp32": float((got.float() - expected).abs().max()),
            }
            print(
                f"attention {name}: {result[name]['us_per_call']:.2f} us/call, {result[name]['kernels_per_call']:.1f} "
                "kernels/call",
                flush=True,
            )
    (out / "attention.json").write_text(json.dumps(result, indent=1))
    return result


def kernel_kinds(names: list[str]) -> dict[str, int]:
    """CUDA kernels by kind: GEMMs, cuBLAS split-K reduces, memsets, attention, Triton (Inductor), other."""
    kinds = Counter()
    for name in names:
        if name.startswith("triton"):
            kinds["triton"] += 1
        elif "splitKreduce" in name:
            kinds["splitk_reduce"] += 1
        elif name.startswith("Memset") or name.startswith("Memcpy"):
            kinds["memset_memcpy"] += 1
        elif any(k in name for k in ("gemm", "cutlass", "xmma")):
            kinds["gemm"] += 1
        elif any(k in name for k in ("sdpa", "flash", "fmha", "attention")):
            kinds["attention"] += 1
        else:
            kinds["other"] += 1
    return dict(kinds)


def window_ms(fn, device: torch.device, repeat: int) -> float:
    """Median milliseconds of ``fn``: CUDA events on a GPU, wall clock on the CPU."""
    if device.type == "cuda":
        return median_ms(fn, repeat)
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def lmdm_profile(out: Path, batches: tuple[int, ...], variants: tuple[str, ...]) -> dict:
    """The LMDM samplers ``variants`` (``LMDM_VARIANTS``): ms per window and kernels per DDIM step at each batch, each
    window's error against the fp32 CPU window, and the plain and fused steps' ATen operators and Inductor
    launches. Runs on the CPU too (slowly)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "steps": 25}
    counts_net = TorchBackend(random_checkpoints(), device=device, networks=("lmdm",), compile_networks=False).network(
        "lmdm"
    )
    schedule = ddim_schedule(DEFAULT_STEPS, device)
    for variant in ("plain", "fused"):
        steps = (lmdm_ops.plain_variant if variant == "plain" else lmdm_ops.fused_variant)(counts_net)
        with torch.inference_mode():
            inputs = lmdm_ops.step_inputs(counts_net, schedule, 1, steps.prepare, device)
        result[f"{variant}_step_counts"] = {
            "aten_per_step_b1": lmdm_ops.count_aten(steps.step, inputs),
            "inductor_per_step_b1": lmdm_ops.count_inductor(steps, inputs),
        }
        print(
            f"lmdm {variant} step: {result[f'{variant}_step_counts']['aten_per_step_b1']['ops']} ATen ops eager, "
            f"{result[f'{variant}_step_counts']['inductor_per_step_b1']['launches']} launches compiled ({device.type} "
            "Inductor, fp32)",
            flush=True,
        )
    del counts_net
    torch._dynamo.reset()
    backend = TorchBackend(random_checkpoints(), device=device, networks=("lmdm",))
    g = torch.Generator(device=device).manual_seed(0)
    top = max(max(batches), 2)
    x = torch.randn(top, SEQ_FRAMES, MOTION_DIM, device=device, generator=g)
    cond_frame = torch.randn(top, MOTION_DIM, device=device, generator=g) * 0.3
    cond = torch.randn(top, SEQ_FRAMES, 1103, device=device, generator=g)
    noise = torch.randn(DEFAULT_STEPS - 1, top, SEQ_FRAMES, MOTION_DIM, device=device, generator=g)
    windows = {}
    for variant in variants:
        sampler = lmdm_sampler(backend, variant, batches)
        for batch in batches:
            run = lambda: sampler(x[:batch], cond_frame[:batch], cond[:batch], noise[:, :batch])  # noqa: E731
            row = {"window_ms": window_ms(run, device, 20 if device.type == "cuda" else 2)}
            if device.type == "cuda":
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0]
                busy = sum(e.device_time for e in kernels) / 1e3
                row |= {
                    "kernels_per_step": len(kernels) / 25,
                    "kinds_per_step": {k: n / 25 for k, n in kernel_kinds([e.name for e in kernels]).items()},
                    "kernel_busy_ms": busy,
                    "idle_share": 1 - busy / row["window_ms"],
                    "top": kernel_rows(prof, 1, top=12)[0],
                }
            result.setdefault(variant, {})[f"batch{batch}"] = row
            print(
                f"lmdm {variant} batch {batch}: window {row['window_ms']:.2f} ms"
                + (
                    f", {row['kernels_per_step']:.0f} kernels/step {row['kinds_per_step']}"
                    if "kernels_per_step" in row
                    else ""
                ),
                flush=True,
            )
        windows[variant] = sampler(x[:2], cond_frame[:2], cond[:2], noise[:, :2]).float().cpu()
        (out / "lmdm.json").write_text(json.dumps(result, indent=1))
    reference = fp32_cpu_window(x[:2], cond_frame[:2], cond[:2], noise[:, :2])
    for variant, window in windows.items():
        result[variant]["window_rel_err_vs_fp32_cpu"] = float((window - reference).norm() / reference.norm())
        print(
            f"lmdm {variant} window (batch 2) vs fp32 CPU: relative error "
            f"{result[variant]['window_rel_err_vs_fp32_cpu']:.2e}"
        )
    (out / "lmdm.json").write_text(json.dumps(result, indent=1))
    print(f"{'':14}" + "".join(f"{'b' + str(b) + ' ms':>10}{'k/step':>8}" for b in batches) + f"{'rel err':>10}")
    for variant in variants:
        row = result[variant]
        cells = "".join(
            f"{row[f'batch{b}']['window_ms']:>10.2f}{row[f'batch{b}'].get('kernels_per_step', float('nan')):>8.0f}"
            for b in batches
        )
        print(f"{variant:<14}{cells}{row['window_rel_err_vs_fp32_cpu']:>10.2e}")
    return result


def fp32_cpu_window(x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The 25-step window of the plain fp32 LMDM on the CPU: the reference the GPU samplers' error is taken against."""
    from engine.diffusion.ddim import ddim_loop
    from engine.networks import OFFICIAL_FILENAMES, load_network

    lmdm = load_network("lmdm", random_checkpoints() / OFFICIAL_FILENAMES["lmdm"], "cpu", torch.float32)
    with torch.inference_mode():
        return ddim_loop(
            lmdm, x.cpu(), cond_frame.cpu(), cond.cpu(), ddim_schedule(DEFAULT_STEPS, torch.device("cpu")), noise.cpu()
        )


def speed_table(out: Path) -> dict:
    """The issue's table: graphed warp+decode ms/frame at 5/16/32, LMDM window ms at 1/4/16, with fidelity against
    fp32."""
    from engine.networks import OFFICIAL_FILENAMES, load_network

    result: dict = {}
    backend = TorchBackend(random_checkpoints(), device="cuda", networks=("warp_network", "decoder"))
    backend.capture_render((5, 16, 32))
    g = torch.Generator(device="cuda").manual_seed(0)
    feature, kp_s, kp_d = render_inputs_with_motion(32, torch.device("cuda"), g)
    for batch in (5, 16, 32):
        ms = median_ms(lambda b=batch, net=backend: net.render(feature[:b], kp_s[:b], kp_d[:b]))
        result[f"render_ms_per_frame_b{batch}"] = ms / batch
        print(f"render batch {batch}: {ms / batch:.3f} ms/frame", flush=True)
    fast = backend.render(feature[:5], kp_s[:5], kp_d[:5]).float().clone()
    folder = random_checkpoints()
    torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        warp = load_network(
            "warp_network", folder / OFFICIAL_FILENAMES["warp_network"], "cuda", torch.float32, fold_batchnorm=True
        )
        decoder = load_network(
            "decoder", folder / OFFICIAL_FILENAMES["decoder"], "cuda", torch.float32, fold_batchnorm=True
        )
        reference = decoder(warp(feature[:5], kp_s[:5], kp_d[:5]))
    torch.backends.cudnn.allow_tf32 = True
    result["render_psnr_vs_fp32_db"] = psnr(fast, reference, peak=1.0)
    print(
        f"render fp16 (graphed, depth planes) vs fp32 plain modules: PSNR {result['render_psnr_vs_fp32_db']:.1f} dB",
        flush=True,
    )
    del backend, warp, decoder

    engine = Engine.from_checkpoints(None, device="cuda", steps=DEFAULT_STEPS)
    sampler = engine.sampler()
    sampler.capture((1, 4, 16))
    x = torch.randn(16, SEQ_FRAMES, MOTION_DIM, device="cuda", generator=g)
    cond_frame = torch.randn(16, MOTION_DIM, device="cuda", generator=g) * 0.3
    cond = torch.randn(16, SEQ_FRAMES, engine.cond_width, device="cuda", generator=g)
    noise = torch.randn(DEFAULT_STEPS - 1, 16, SEQ_FRAMES, MOTION_DIM, device="cuda", generator=g)
    for batch in (1, 4, 16):
        ms = median_ms(lambda: sampler(x[:batch], cond_frame[:batch], cond[:batch], noise[:, :batch]))
        result[f"lmdm_window_ms_b{batch}"] = ms
        print(f"lmdm batch {batch}: {ms:.2f} ms per call", flush=True)
    window = sampler(x[:2], cond_frame[:2], cond[:2], noise[:, :2]).cpu()
    expected = fp32_cpu_window(x[:2], cond_frame[:2], cond[:2], noise[:, :2])
    result["lmdm_window_rel_err_vs_fp32_cpu"] = float((window - expected).norm() / expected.norm())
    print(
        "lmdm window (graphed, fp16 products and attention) vs fp32 CPU: relative error "
        f"{result['lmdm_window_rel_err_vs_fp32_cpu']:.2e}",
        flush=True,
    )
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(32, 8, 80, 64, device="cuda", dtype=dtype)
        kv = torch.randn(32, 8, 82, 64, device="cuda", dtype=dtype)
        result[f"sdpa_b16_cross_ms_{str(dtype)[6:]}"] = median_ms(lambda: F.scaled_dot_product_attention(q, kv, kv))
    (out / "speed.json").write_text(json.dumps(result, indent=1))
    return result


def per_call_ms(fn: Callable[[], object], repeat: int, device: torch.device) -> float:
    """Median milliseconds per call: CUDA events on a GPU, wall time after one warm-up call on a CPU."""
    if device.type == "cuda":
        return median_ms(fn, repeat)
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graphed(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    """``fn`` (over static inputs) captured into a CUDA graph after two warm-up calls on a side stream; returns
    replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        fn()
    return graph.replay


def gflop_per_frame(net: nn.Module) -> float:
    """Convolution GFLOP (2 x MACs) of one 64x64 feature through ``net``, counted on the meta device."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        dtype = next(net.parameters()).dtype
        copy.deepcopy(net).to("meta")(torch.zeros(1, 256, 64, 64, device="meta", dtype=dtype))
    return counter.get_total_flops() / 1e9


def decoder_variants(out: Path, device: torch.device, batches: list[int], repeat: int) -> dict:
    """Plain vs fused-SPADE decoder (``use_fused_spade``) vs that with composed shortcuts (``use_composed_shortcuts``),
    alone and after the warp network, ms/frame at each batch.

    On CUDA (fp16, channels-last) every variant is torch.compiled and timed as a CUDA graph
    replay, as the backend runs the render; on a CPU (fp32) it runs eagerly.
    """
    from engine.networks import OFFICIAL_FILENAMES, load_network

    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    folder = random_checkpoints()
    plain = load_network("decoder", folder / OFFICIAL_FILENAMES["decoder"], device, dtype, fold_batchnorm=True)
    fused = copy.deepcopy(plain)
    fused.use_fused_spade()
    composed = copy.deepcopy(fused)
    composed.use_composed_shortcuts()
    variants = {"plain": plain, "fused": fused, "composed": composed}
    result: dict = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": str(dtype),
        "batches": batches,
    }
    for name, net in variants.items():
        result[f"{name}_gflop_per_frame"] = gflop_per_frame(net)
        if cuda:
            net.to(memory_format=torch.channels_last)
    gflop = ", ".join(f"{name} {result[f'{name}_gflop_per_frame']:.1f}" for name in variants)
    print(f"decoder GFLOP/frame: {gflop}", flush=True)

    g = torch.Generator(device=device).manual_seed(0)
    feature = torch.randn(max(batches), 256, 64, 64, device=device, generator=g, dtype=dtype)
    volume = torch.randn(max(batches), 32, 16, 64, 64, device=device, generator=g) * 0.5
    kp_s = (torch.rand(max(batches), 21, 3, device=device, generator=g) - 0.5) * 0.6
    kp_d = kp_s + 0.02 * torch.randn(max(batches), 21, 3, device=device, generator=g)
    if cuda:
        feature = feature.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        reference_net = load_network(
            "decoder", folder / OFFICIAL_FILENAMES["decoder"], device, torch.float32, fold_batchnorm=True
        )
        reference = reference_net(feature[:2].float())
        for name, net in variants.items():
            decoded = net(feature[:2]).float()
            result[f"{name}_max_abs_err_vs_fp32_plain"] = float((decoded - reference).abs().max())
            result[f"{name}_psnr_vs_fp32_plain_db"] = psnr(decoded, reference, peak=1.0)
    torch.backends.cudnn.allow_tf32 = True
    del reference_net
    for name in variants:
        print(
            f"{name} ({str(dtype)[6:]}) vs plain fp32: max abs {result[f'{name}_max_abs_err_vs_fp32_plain']:.2e}, "
            f"PSNR {result[f'{name}_psnr_vs_fp32_plain_db']:.1f} dB",
            flush=True,
        )

    backend = TorchBackend(folder, device=device, networks=("warp_network",), compile_networks=cuda)
    run = {name: torch.compile(net) if cuda else net for name, net in variants.items()}
    for batch in batches:
        f, v, s, d = feature[:batch], volume[:batch].to(dtype), kp_s[:batch].to(dtype), kp_d[:batch].to(dtype)
        for name, net in run.items():
            cases = {"decoder": lambda: net(f), "render": lambda: net(backend.warp(v, s, d))}
            for what, fn in cases.items():
                with torch.inference_mode():
                    call = graphed(fn) if cuda else fn
                    ms = per_call_ms(call, repeat, device) / batch
                result[f"{what}_{name}_ms_per_frame_b{batch}"] = ms
                del call
                if cuda:
                    torch.cuda.empty_cache()
    columns = [f"{what} {name}" for what in ("decoder", "render") for name in variants]
    lines = [
        f"ms/frame {'batch':>5} " + " ".join(f"{c:>17}" for c in columns) + f"  decoder TFLOP/s {', '.join(variants)}"
    ]
    for batch in batches:
        row = [result[f"{what}_{name}_ms_per_frame_b{batch}"] for what in ("decoder", "render") for name in variants]
        tflops = [result[f"{name}_gflop_per_frame"] / ms / 1e3 for name, ms in zip(variants, row)]
        cells = " ".join(f"{ms:>17.3f}" for ms in row)
        lines.append(f"{'':8} {batch:>5} {cells}  {', '.join(f'{t:.1f}' for t in tflops)}")
    print("\n".join(lines), flush=True)
    (out / "decoder.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parts = ["speed", "lmdm", "attention", "variants", "layers", "graph", "decoder"]
    parser.add_argument("--parts", nargs="*", default=parts, choices=parts)
    parser.add_argument("--device", default="cuda", help="the decoder part only: cuda, or cpu (eager, fp32, slow)")
    parser.add_argument("--batches", type=int, nargs="+", default=[5, 16, 32], help="the decoder part's batch sizes")
    parser.add_argument("--repeat", type=int, default=20, help="the decoder part's timed calls per case")
    parser.add_argument(
        "--lmdm-batches", nargs="*", type=int, default=[1, 4, 16], help="window batches timed by --parts lmdm"
    )
    parser.add_argument(
        "--lmdm-variants",
        nargs="*",
        default=["fused_tf32", "runtime"],
        choices=LMDM_VARIANTS,
        help="LMDM samplers timed by --parts lmdm",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if "decoder" in args.parts:
        decoder_variants(args.out, torch.device(args.device), args.batches, args.repeat)
    if "speed" in args.parts:
        speed_table(args.out)
    if "attention" in args.parts:
        attention_backends(args.out)
    if "lmdm" in args.parts:
        lmdm_profile(args.out, tuple(args.lmdm_batches), tuple(args.lmdm_variants))
    if "variants" in args.parts or "layers" in args.parts:
        eager = TorchBackend(
            random_checkpoints(), device="cuda", networks=("warp_network", "decoder"), compile_networks=False
        )
        if "variants" in args.parts:
            conv_variants(eager.dtype, args.out)
        if "layers" in args.parts:
            layer_times(eager, args.out)
    if "graph" in args.parts:
        compiled = TorchBackend(random_checkpoints(), device="cuda", networks=("warp_network", "decoder"))
        profile_graphed_render(compiled, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
