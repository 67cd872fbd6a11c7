"""The Ray Serve application: the ``sessions`` ingress and one ``engine`` replica per GPU.

Built three ways: ``application(ClusterOptions(...))`` in Python (the tests), ``build`` for a
``serve deploy`` config (``cluster/serve.yaml``), and ``run`` behind ``python -m apps.serve --ray``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from cluster.ingress import ATTEMPTS, SessionsIngress
from cluster.replica import DRAIN_SECONDS, HEALTH_TIMEOUT, EngineReplica, ReplicaConfig
from cluster.router import CapacityRouter
from serving.access import is_loopback, resolve_token
from serving.service import ServiceOptions

APP_NAME = "ditto"
SHUTDOWN_MARGIN = 30.0
"""Seconds past the drain that Serve gives a replica to stop its engine before it kills it."""
ROUTING_PERIOD = 1.0
"""Seconds between two capacity reports of a replica."""
HEALTH_PERIOD = 5.0
SERVICE_ARGS = ("checkpoints", "device", "steps", "workers", "admission", "avatars", "cache_dir", "runtime")
"""The serve config's ``args`` that are ``serving.service.ServiceOptions`` fields of every replica's engine."""


@dataclass(frozen=True)
class ClusterOptions:
    """How to deploy: replicas and what each runs, the proxy's address, the health, drain and placement settings."""

    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    replicas: int = 1
    gpus_per_replica: float = 1.0
    http: tuple[str, int] = ("127.0.0.1", 8000)
    """Where Serve's HTTP proxy listens (the ingress checks Host against it)."""
    health_period: float = HEALTH_PERIOD
    routing_period: float = ROUTING_PERIOD
    capacity_router: bool = True
    """Place by reported capacity (``CapacityRouter``); False: Serve's default router, refusal and retry only."""
    attempts: int = ATTEMPTS


def application(options: ClusterOptions):
    """The Serve application for ``options`` (``serve.run(application(...), name=APP_NAME)``)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    router = {"request_router_class": CapacityRouter} if options.capacity_router else {}
    engine = serve.deployment(EngineReplica, name="engine").options(
        num_replicas=options.replicas,
        ray_actor_options={"num_gpus": options.gpus_per_replica, "num_cpus": 0},
        max_ongoing_requests=64,
        health_check_period_s=options.health_period,
        health_check_timeout_s=options.replica.health_timeout + 5.0,
        graceful_shutdown_timeout_s=options.replica.drain_seconds + SHUTDOWN_MARGIN,
        request_router_config=RequestRouterConfig(request_routing_stats_period_s=options.routing_period, **router),
    )
    ingress = serve.deployment(SessionsIngress, name="sessions").options(num_replicas=1, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine.bind(asdict(options.replica)), options.replica.token, options.http, options.attempts)


def build(args: dict[str, Any]):
    """``serve deploy``'s application builder (``import_path: cluster.app:build``); ``args`` as in cluster/serve.yaml.

    Beyond loopback a token is required here (it cannot be generated and shown: the builder runs on the cluster).
    """
    host, _, port = str(args.get("http", "127.0.0.1:8000")).rpartition(":")
    replica_host = str(args.get("host", "127.0.0.1"))
    token = args.get("token")
    for bound in (host, replica_host):
        if not is_loopback(bound) and not token:
            raise ValueError(f"serving {bound} (beyond loopback) needs a token: set args.token in the serve config")
    service = {k: args[k] for k in SERVICE_ARGS if k in args}
    replica = ReplicaConfig(
        service=service, host=replica_host, token=token,
        drain_seconds=float(args.get("drain_seconds", DRAIN_SECONDS)), health_timeout=float(args.get("health_timeout", HEALTH_TIMEOUT)),
    )
    gpus = 1.0 if service.get("device", "cuda") == "cuda" else 0.0
    return application(
        ClusterOptions(
            replica=replica, replicas=int(args.get("replicas", 1)), gpus_per_replica=float(args.get("gpus_per_replica", gpus)),
            http=(host, int(port)), health_period=float(args.get("health_period", HEALTH_PERIOD)),
        )
    )


@dataclass(frozen=True)
class DeployOptions:
    """What ``run`` deploys: every replica's service, the device it runs on, where Serve's proxy listens, the token."""

    service: ServiceOptions
    """Every replica's service (its ``SERVICE_ARGS``; the device is ``device``'s)."""
    device: str | None = None
    """cuda or cpu; None: cuda when the Ray cluster has a GPU."""
    http: tuple[str, int] = ("127.0.0.1", 8000)
    token: str | None = None
    """Required from every client; None: none on loopback, one generated (and printed) beyond it."""


def run(deploy: DeployOptions) -> int:
    """``python -m apps.serve --ray``: deploy on the Ray cluster (``RAY_ADDRESS``, or a local one), one replica per
    GPU, until Ctrl-C; then delete the application (its replicas drain first)."""
    import ray
    from ray import serve

    from engine.engine import RANDOM_WEIGHTS_NOTICE

    host, port = deploy.http
    token, generated = resolve_token(host, deploy.token)
    ray.init()
    gpus = int(ray.cluster_resources().get("GPU", 0))
    device = deploy.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        print("error: --ray with --device cuda: the Ray cluster has no GPU", file=sys.stderr)
        return 1
    random_weights = deploy.service.checkpoints is None
    service = {**{k: getattr(deploy.service, k) for k in SERVICE_ARGS}, "device": device}
    replica = ReplicaConfig(service=service, host=host, token=token, notice=RANDOM_WEIGHTS_NOTICE if random_weights else "")
    options = ClusterOptions(replica=replica, replicas=max(1, gpus) if device == "cuda" else 1, gpus_per_replica=1.0 if device == "cuda" else 0.0, http=(host, port))
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(options), name=APP_NAME, route_prefix="/")
    if generated:
        print(f"token (give it to clients): {token}", file=sys.stderr)
    suffix = f"?token={token}" if token else ""
    print(f"cluster: {options.replicas} engine replica(s) on {device}; sessions: POST http://{host}:{port}/sessions{suffix}", file=sys.stderr)

    async def wait() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    asyncio.run(wait())
    print(f"stopping: the replicas drain their sessions (at most {replica.drain_seconds:g} s)...", file=sys.stderr)
    serve.delete(APP_NAME)
    return 0
