"""Placement on a Ray Serve cluster: the capacity router against Serve's default router with refusal and retry.

    python -m bench.cluster_placement [--rounds 5] [--out bench/results/DATE_cpu2_cluster_placement.json]

A local Ray cluster with two fake GPUs runs the application twice, once per placement: two engine
replicas of ``--runtime`` (default: the tests' synthetic runtime admitting 2 sessions each, so the
cluster holds 4). Each round opens as many sessions as the cluster holds, all at once (a burst)
and then one by one, through Serve's proxy, and records per POST its answer and time, and the
refusals the ingress retried. A 503 while the cluster had room is a misplacement: what the
router is for. Run from the repository root (the replicas import it through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from harness.nginx import free_port

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = "tests.cluster.small_runtime:build"


async def post(http: aiohttp.ClientSession, base: str) -> tuple[int, float, dict | None]:
    started = time.perf_counter()
    async with http.post(f"{base}/sessions", json={"avatar": "anna"}) as response:
        body = await response.json() if response.status == 201 else None
        return response.status, (time.perf_counter() - started) * 1000, body


async def refused(http: aiohttp.ClientSession, base: str) -> int:
    async with http.get(f"{base}/sessions") as response:
        return (await response.json())["refused"]


async def end(http: aiohttp.ClientSession, sessions: list[dict]) -> None:
    """End each session once it streams (ended earlier, a session can miss its worker: see the cluster tests)."""
    for session in sessions:
        for _ in range(120):
            async with http.get(session["urls"]["self"]) as response:
                if (await response.json())["counters"].get("frames_released", 0) > 0:
                    break
            await asyncio.sleep(0.25)
        async with http.delete(session["urls"]["self"]) as response:
            await response.read()


async def rounds(base: str, count: int, capacity: int) -> dict[str, Any]:
    """``count`` rounds of a burst and a one-by-one fill of ``capacity`` sessions."""
    results: dict[str, Any] = {}
    async with aiohttp.ClientSession() as http:
        for kind in ("burst", "one_by_one"):
            answers, times, retried = [], [], 0
            for _ in range(count):
                before = await refused(http, base)
                if kind == "burst":
                    replies = await asyncio.gather(*(post(http, base) for _ in range(capacity)))
                else:
                    replies = [await post(http, base) for _ in range(capacity)]
                retried += await refused(http, base) - before
                answers += [status for status, _, _ in replies]
                times += [ms for _, ms, _ in replies]
                await end(http, [body for _, _, body in replies if body is not None])
                await asyncio.sleep(2.0)  # the next round starts from fresh reports
            results[kind] = {
                "posts": len(answers),
                "placed": answers.count(201),
                "misplaced_503": answers.count(503),
                "refusals_retried": retried,
                "post_ms_p50": round(float(np.percentile(times, 50)), 1),
                "post_ms_p99": round(float(np.percentile(times, 99)), 1),
            }
    return results


def measure(rounds_count: int, runtime: str, capacity: int) -> dict[str, Any]:
    import ray
    from ray import serve

    from cluster.app import APP_NAME, ClusterOptions, application
    from cluster.replica import ReplicaConfig

    port = free_port()
    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        logging_level="ERROR",
    )
    found: dict[str, Any] = {}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for mode, router in (("capacity_router", True), ("default_router_retry", False)):
            replica = ReplicaConfig(service={"device": "cpu", "workers": 1, "runtime": runtime}, drain_seconds=5.0)
            options = ClusterOptions(replica=replica, replicas=2, http=("127.0.0.1", port), capacity_router=router)
            serve.run(application(options), name=APP_NAME, route_prefix="/")
            time.sleep(3.0)  # first reports in
            found[mode] = asyncio.run(rounds(f"http://127.0.0.1:{port}", rounds_count, capacity))
            serve.delete(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtime", default=RUNTIME, help="module:function building each core's runtime")
    parser.add_argument("--capacity", type=int, default=4, help="sessions the whole cluster admits (2 replicas)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    found = measure(args.rounds, args.runtime, args.capacity)
    if args.out:
        args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(table(found))
    return 0


def table(found: dict[str, Any]) -> str:
    """One row per router and kind of round: placed, wrong 503s, refusals retried, POST time."""
    lines = [
        "| router | rounds | posts | placed | wrong 503 | refusals retried | POST ms p50/p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, kinds in found.items():
        for kind, r in kinds.items():
            lines.append(
                f"| {mode} | {kind} | {r['posts']} | {r['placed']} | {r['misplaced_503']} | {r['refusals_retried']} | "
                f"{r['post_ms_p50']}/{r['post_ms_p99']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
