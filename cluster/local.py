"""The Ray cluster ``python -m apps.serve --ray`` runs on, and the word its replicas are told to stop now by.

Joining an existing cluster (``RAY_ADDRESS``) leaves its addresses and its files to the operator who started it; a
local cluster started here keeps to loopback when the service was given a loopback address: Ray takes 127.0.0.1 for
its node address (``cluster.ray_internals.loopback_node_address``: otherwise it replaces even an explicit
127.0.0.1 with the machine's address), so every process of the cluster listens on loopback only (GCS, raylet, agents,
every worker's gRPC server, Serve's proxy and controller), but one socket per Serve replica: Ray Serve binds the
replica's inter-deployment gRPC server to every interface (``[::]:0``, no option moves it; Ray's token authentication
guards it). The dashboard is off. Its files are the service's (``cluster.ray_files``), removed when it stops, or kept
where the operator named a place for them (``RAY_TMPDIR``) and after a failure.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass

from cluster.ray_files import RayFiles
from cluster.ray_internals import kv_delete, kv_has, kv_put, loopback_node_address
from serving.access import is_loopback

REPLICA_GRPC = (
    "ray: one socket per Serve replica listens beyond loopback: Ray Serve 2.60 binds each replica's inter-deployment "
    "gRPC server to every interface ([::], a port of its choosing; no option moves it; Ray's token authentication "
    "guards it); to keep it off the network, refuse inbound connections on the other interfaces (docs/cluster.md)"
)
"""What the service says at start when it was told loopback: the one thing of Ray's that does not keep to it."""
STOP_NOW = b"ditto:stop-now"
"""The key in Ray's internal store that tells draining replicas to end their sessions now (the service's Ctrl-C)."""


@dataclass(frozen=True)
class RayCluster:
    """The Ray cluster the service runs on, as ``start_ray`` joined or started it."""

    said: str
    """What was done, for the log."""
    files: RayFiles | None = None
    """The files of a local cluster started here; None: joined, or where RAY_TMPDIR says (the operator's)."""

    def shutdown(self, failed: bool = False) -> None:
        """Leave the cluster (a local one shuts down) and remove its files; after a failure they are kept (Ray's logs
        say what failed) and the log says where."""
        import ray

        ray.shutdown()
        if self.files is None:
            return
        if failed:
            kept = f"ray: the cluster's files are kept in {self.files.path} (its logs: {self.files.logs})"
            print(kept, file=sys.stderr)
        else:
            self.files.remove()


def start_ray(host: str) -> RayCluster:
    """Join ``RAY_ADDRESS`` or start a local Ray cluster (on loopback when ``host`` is)."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level="WARNING")
        said = f"ray: joined the cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} (its addresses are its operator's)"
        return RayCluster(said)
    if is_loopback(host):
        options, starting, where = {"include_dashboard": False}, loopback_node_address(), "on loopback, no dashboard"
    else:
        options, starting, where = {}, nullcontext(), "(the service is served beyond loopback)"
    files = None if os.environ.get("RAY_TMPDIR") else RayFiles()
    with starting:
        if files is None:
            ray.init(logging_level="WARNING", **options)
        else:
            try:
                files.init(logging_level="WARNING", **options)
            except BaseException as exc:
                RayCluster(where, files).shutdown(failed=isinstance(exc, Exception))  # Ctrl-C: no failure to explain
                raise
    said = f"ray: a local cluster at node address {ray.util.get_node_ip_address()} {where}"
    if files is None:
        return RayCluster(f"{said}; its files stay in {os.environ['RAY_TMPDIR']}/ray (RAY_TMPDIR)")
    return RayCluster(f"{said}; its files in {files.path} (removed at the stop)", files)


def request_stop_now(now: bool = True) -> None:
    """Tell every draining replica to end its live sessions now (``now=False``: clear the word, before a deploy)."""
    if now:
        kv_put(STOP_NOW, b"1")
    else:
        kv_delete(STOP_NOW)


def stop_now_requested() -> bool:
    """Whether the service is being stopped now (its replicas' drains end at once)."""
    return kv_has(STOP_NOW)
