"""What the runtime's loop thread dispatches per tick, stage by stage: ATen operators for live speaking sessions.

``python -m bench.loop_ops --avatar DIR [--sessions 8] [--seconds 8] [--out FILE.json]``

Every eager operator the loop dispatches releases and retakes the GIL, so in a server, where output
threads want the GIL too, the loop's time per tick grows with its operator count. This runs a CPU
runtime batched as on CUDA (``batch_sessions``), feeds each live session the bundled speech in real
time, and counts the operators of each stage of the busiest ticks. The LMDM sampler and warp+decode
are stubbed (on CUDA each is one graph replay; counting their eager CPU operators would mislead), so
the motion is meaningless: only the counts are measured. HuBERT runs eagerly here (a graph on CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from bench.common.lmdm_ops import AtenCounter
from bench.common.sessions import HOP, speech
from engine.render.paste_back import PasteBack
from engine.runtime import runtime as runtime_module
from engine.runtime.config import RuntimeConfig
from engine.runtime.pipeline import SessionPipeline
from engine.runtime.runtime import Runtime

LOOP_THREAD = "ditto-runtime"
STAGES: tuple[tuple[object, str, str], ...] = (
    (SessionPipeline, "intake", "intake (audio and commands)"),
    (Runtime, "_encode_features", "HuBERT features (eager here)"),
    (SessionPipeline, "window_request", "window requests"),
    (SessionPipeline, "complete", "window completion (fuse, smooth)"),
    (SessionPipeline, "pose", "per-session stitching (pose)"),
    (runtime_module, "stitch_posed", "keypoint transform + stitching net (all sessions)"),
    (PasteBack, "__call__", "paste-back"),
    (SessionPipeline, "deliver", "delivery (frames, audio)"),
)
BUSY_TICK_OPS = 100
"""A tick dispatching fewer operators did no hop's work (idle polling)."""


class StageCounts:
    """Operators per stage, counted only on the loop thread; one stage at a time (nested stages count in the outer)."""

    def __init__(self) -> None:
        self.stages: dict[str, Counter[str]] = {}
        self.ticks: list[Counter[str]] = []
        self._local = threading.local()

    def counting(self, label: str, call: Callable) -> Callable:
        def counted(*args, **kwargs):
            if threading.current_thread().name != LOOP_THREAD or getattr(self._local, "inside", False):
                return call(*args, **kwargs)
            counter = AtenCounter()
            self._local.inside = True
            try:
                with counter:
                    return call(*args, **kwargs)
            finally:
                self._local.inside = False
                self.stages.setdefault(label, Counter()).update(counter.ops)
                if self.ticks:
                    self.ticks[-1][label] += sum(counter.ops.values())

        return counted

    def tick(self, call: Callable) -> Callable:
        def counted(*args, **kwargs):
            if threading.current_thread().name != LOOP_THREAD:
                return call(*args, **kwargs)
            self.ticks.append(Counter())
            counter = AtenCounter()
            with counter:
                result = call(*args, **kwargs)
            self.ticks[-1]["total"] = sum(counter.ops.values())
            return result

        return counted


@contextlib.contextmanager
def counted_stages(counts: StageCounts) -> Iterator[None]:
    """Wrap the loop's stage methods and ``_tick`` for counting; put them back afterwards."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in STAGES] + [(Runtime, "_tick", Runtime._tick)]
    try:
        for (owner, name, label), (_, _, original) in zip(STAGES, originals):
            setattr(owner, name, counts.counting(label, original))
        Runtime._tick = counts.tick(Runtime._tick)
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


class NoiseSampler:
    """The runtime's sampler with its calls answered by their own noise (everything else, e.g. its buckets, as is)."""

    def __init__(self, sampler: object) -> None:
        self._sampler = sampler

    def __call__(
        self, noise: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, step_noise: torch.Tensor
    ) -> torch.Tensor:
        return noise.clone()

    def __getattr__(self, name: str) -> object:
        return getattr(self._sampler, name)


def stub_networks(runtime: Runtime) -> None:
    """The sampler hands back its noise and warp+decode a grey render: no eager network operators in the counts."""
    runtime.sampler = NoiseSampler(runtime.sampler)
    runtime.engine.backend.render = lambda f_s, x_s, x_d: torch.full((f_s.shape[0], 3, 512, 512), 0.5)


def measure(avatar_dir: str, sessions: int, seconds: float) -> dict:
    """Counts over the busy ticks of ``sessions`` live sessions fed speech in real time for ``seconds``."""
    from avatars.cache import load_avatar

    counts = StageCounts()
    with counted_stages(counts):
        runtime = Runtime.from_checkpoints(
            None,
            device="cpu",
            config=RuntimeConfig(admission=False, batch_sessions=True, progress=False),
            compile_networks=False,
        )
        try:
            stub_networks(runtime)
            avatar = load_avatar(avatar_dir, torch.device("cpu"))
            audio, rate = speech(seconds + 1)
            live = [runtime.open_session(avatar, live=True, overlap=75, seed=i) for i in range(sessions)]
            stop = threading.Event()
            readers = [threading.Thread(target=_drain, args=(session, stop), daemon=True) for session in live]
            for reader in readers:
                reader.start()
            hop = int(HOP * rate)
            started = time.monotonic()
            for k in range(int(seconds / HOP)):
                for session in live:
                    session.push_audio(audio[k * hop : (k + 1) * hop], rate, block=True)
                time.sleep(max(0.0, started + (k + 1) * HOP - time.monotonic()))
            stop.set()
            for session in live:
                session.close()
            for reader in readers:
                reader.join()
        finally:
            runtime.close()
    busy = [tick for tick in counts.ticks if tick["total"] >= BUSY_TICK_OPS]
    if not busy:
        raise RuntimeError("no tick did a hop's work: the sessions got no audio through")
    peak = max(tick["total"] for tick in busy)
    full = [tick for tick in busy if tick["total"] >= 0.8 * peak]
    per_tick = {label: round(float(np.mean([tick[label] for tick in full])), 1) for _, _, label in STAGES}
    return {
        "sessions": sessions,
        "busy_ticks": len(busy),
        "full_ticks": len(full),
        "ops_per_full_tick": round(float(np.mean([tick["total"] for tick in full])), 1),
        "ops_per_stage_per_full_tick": per_tick,
        "top_ops_per_stage": {label: counter.most_common(6) for label, counter in counts.stages.items()},
    }


def _drain(session, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            session.next_frame(timeout=0.2)
        except TimeoutError:
            continue
        except Exception:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_ops", description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", required=True, help="a cached avatar folder")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="real-time seconds of speech pushed to each session")
    parser.add_argument("--out", type=Path, help="write the counts as JSON here")
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    try:
        result = measure(args.avatar, args.sessions, args.seconds)
    finally:
        torch.set_num_threads(threads)
    result |= {"machine": platform.machine(), "torch": torch.__version__, "device": "cpu (networks stubbed)"}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\n{args.sessions} live sessions, ticks that did a full hop's work ({result['full_ticks']}): ATen operators "
        "per tick"
    )
    print("| stage | ops/tick |\n|---|---|")
    for label, ops in result["ops_per_stage_per_full_tick"].items():
        print(f"| {label} | {ops} |")
    print(f"| whole tick | {result['ops_per_full_tick']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
