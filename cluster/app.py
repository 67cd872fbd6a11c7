"""The Ray Serve application: the ``sessions`` ingress and one ``engine`` replica per GPU.

Built three ways: ``application(ClusterOptions(...))`` in Python (the tests), ``build`` for a
``serve deploy`` config (``cluster/serve.yaml``), and ``run`` behind ``python -m apps.serve --ray``.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from cluster.ingress import ATTEMPTS, SessionsIngress
from cluster.local import REPLICA_GRPC, request_stop_now, start_ray
from cluster.replica import DRAIN_SECONDS, EngineReplica, ReplicaConfig, default_health_timeout, render_limits
from cluster.router import CapacityRouter
from serving.access import is_loopback, resolve_token
from serving.processes import ServiceOptions

APP_NAME = "ditto"
SHUTDOWN_MARGIN = 30.0
"""Seconds past the drain that Serve gives a replica to stop its engine before it kills it."""
ROUTING_PERIOD = 1.0
"""Seconds between two capacity reports of a replica."""
HEALTH_PERIOD = 5.0
NORMAL_PRIORITY = {"RAY_worker_niceness": "0"}
"""Ray starts its workers at nice 15; an engine replica (and the core and workers it starts) runs a real-time loop and
must not yield its cores to every other process of the node."""
SERVICE_ARGS = tuple(f.name for f in fields(ServiceOptions) if f.name not in ("launched", "core_restarts"))
"""The serve config's ``args`` that are ``serving.service.ServiceOptions`` fields of every replica's engine (all but
the launch time, as each replica times its own start, and the core's restarts: Serve replaces a replica whose core
died)."""


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
        ray_actor_options={
            "num_gpus": options.gpus_per_replica,
            "num_cpus": 0,
            "runtime_env": {"env_vars": NORMAL_PRIORITY},
        },
        max_ongoing_requests=64,
        health_check_period_s=options.health_period,
        health_check_timeout_s=options.replica.health_timeout + 5.0,
        graceful_shutdown_timeout_s=options.replica.drain_seconds + SHUTDOWN_MARGIN,
        request_router_config=RequestRouterConfig(request_routing_stats_period_s=options.routing_period, **router),
    )
    ingress = serve.deployment(SessionsIngress, name="sessions").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}
    )
    renders = options.replica.service.get("renders")
    upload_mb = None if renders is None else render_limits(renders).max_mb
    config = asdict(options.replica)
    return ingress.bind(engine.bind(config), options.replica.token, options.http, options.attempts, upload_mb)


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
    service = {"device": "cuda", **{k: args[k] for k in SERVICE_ARGS if k in args}}
    if service.get("renders") is not None:
        render_limits(service["renders"])  # a bad renders mapping fails the deploy, not every replica's start
    health = float(args.get("health_timeout", default_health_timeout(service["device"])))
    replica = ReplicaConfig(
        service=service,
        host=replica_host,
        token=token,
        drain_seconds=float(args.get("drain_seconds", DRAIN_SECONDS)),
        health_timeout=health,
    )
    gpus = 1.0 if service["device"] == "cuda" else 0.0
    return application(
        ClusterOptions(
            replica=replica,
            replicas=int(args.get("replicas", 1)),
            gpus_per_replica=float(args.get("gpus_per_replica", gpus)),
            http=(host, int(port)),
            health_period=float(args.get("health_period", HEALTH_PERIOD)),
        )
    )


@dataclass(frozen=True)
class DeployOptions:
    """What ``run`` deploys: every replica's service, the device it runs on, where Serve's proxy listens, the token,
    and how many replicas of how many GPUs each."""

    service: ServiceOptions
    """Every replica's service, the single server's options (its device is ``device``'s)."""
    device: str | None = None
    """cuda or cpu; None: cuda when the Ray cluster has a GPU."""
    http: tuple[str, int] = ("127.0.0.1", 8000)
    token: str | None = None
    """Required from every client; None: none on loopback, one generated (and printed) beyond it."""
    replicas: int | None = None
    """None: one per ``gpus_per_replica`` GPUs of the cluster (one on the CPU)."""
    gpus_per_replica: float = 1.0


def run(deploy: DeployOptions) -> int:
    """``python -m apps.serve --ray``: deploy on the Ray cluster (``RAY_ADDRESS``, or a local one), until Ctrl-C or
    SIGTERM; then delete the application, its replicas ending their sessions now. A local cluster's files are removed
    when it stops, and kept after a failure (its logs say why)."""
    started = time.monotonic()
    cluster = start_ray(deploy.http[0])
    print(cluster.said, file=sys.stderr)
    if is_loopback(deploy.http[0]):
        print(REPLICA_GRPC, file=sys.stderr)
    try:
        code = serve_until_stopped(deploy, started)
    except BaseException as exc:
        cluster.shutdown(failed=isinstance(exc, Exception))  # a Ctrl-C while deploying is no failure to explain
        raise
    cluster.shutdown()
    print("stopped", file=sys.stderr)
    return code


def serve_until_stopped(deploy: DeployOptions, started: float) -> int:
    """Deploy the application on the Ray cluster this process joined, serve until Ctrl-C or SIGTERM, then stop it
    (``stop``); 1 when the cluster has no GPU for ``--device cuda``."""
    import ray
    from ray import serve

    from engine.engine import RANDOM_WEIGHTS_NOTICE

    host, port = deploy.http
    token, generated = resolve_token(host, deploy.token)
    gpus = ray.cluster_resources().get("GPU", 0)
    device = deploy.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        print("error: --ray with --device cuda: the Ray cluster has no GPU", file=sys.stderr)
        return 1
    notice = RANDOM_WEIGHTS_NOTICE if deploy.service.checkpoints is None else ""
    if notice:
        print(notice, file=sys.stderr)
    service = asdict(replace(deploy.service, device=device, launched=None))
    per_replica = deploy.gpus_per_replica if device == "cuda" else 0.0
    replicas = deploy.replicas or (max(1, int(gpus // per_replica)) if per_replica else 1)
    replica = ReplicaConfig(
        service=service, host=host, token=token, notice=notice, health_timeout=default_health_timeout(device)
    )
    options = ClusterOptions(replica=replica, replicas=replicas, gpus_per_replica=per_replica, http=(host, port))
    request_stop_now(False)
    print(f"cluster: deploying {replicas} engine replica(s) on {device} (each warms up its engine)...", file=sys.stderr)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(options), name=APP_NAME, route_prefix="/")
    if generated:
        print(f"token (give it to clients): {token}", file=sys.stderr)
    suffix = f"?token={token}" if token else ""
    print(
        f"cluster: ready in {time.monotonic() - started:.0f} s: {replicas} engine replica(s) on {device}; sessions: "
        f"POST http://{host}:{port}/sessions{suffix} (each replica's URL is in its log line and its sessions' urls)"
        + (f"; render jobs: POST http://{host}:{port}/renders{suffix}" if deploy.service.renders else ""),
        file=sys.stderr,
    )
    stopped = Stopped()
    stopped.wait()
    stop()
    return 0  # a local cluster's Serve goes with it (serve.shutdown would only add Ray's "graceful_shutdown failed")


class Stopped:
    """Ctrl-C (SIGINT) or SIGTERM came: the service stops (its replicas end their sessions now)."""

    def __init__(self) -> None:
        self.signalled = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._received)

    def _received(self, signum: int, frame: Any) -> None:
        self.signalled = True

    def wait(self) -> None:
        """Return once a signal came."""
        while not self.signalled:
            time.sleep(0.1)


def stop() -> None:
    """Delete the application, its replicas told to end their live sessions now (push sockets closed with 1001,
    recordings finished), and wait until it is gone. Serve's own removal of a replica (scale-down, a redeploy) drains
    instead: the replica waits for its sessions to end (``ReplicaConfig.drain_seconds``)."""
    from ray import serve

    print("stopping: ending the live sessions, flushing their outputs...", file=sys.stderr)
    request_stop_now()
    serve.delete(APP_NAME, _blocking=False)
    while APP_NAME in serve.status().applications:
        time.sleep(0.2)
