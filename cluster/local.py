"""The Ray cluster ``python -m apps.serve --ray`` runs on, and the word its replicas are told to stop now by.

Joining an existing cluster (``RAY_ADDRESS``) leaves its addresses and its files to the operator who started it; a
local cluster started here keeps to loopback when the service was given a loopback address: its node address is
127.0.0.1, so the processes that bind the node's address (Serve's proxy, the agents) bind loopback, and the dashboard
is off. Its files are the service's (``cluster.ray_files``), removed when it stops, or kept where the operator named
a place for them (``RAY_TMPDIR``) and after a failure.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from cluster.ray_files import RayFiles
from serving.access import is_loopback

STOP_NOW = b"ditto:stop-now"
"""The key in Ray's internal store that tells draining replicas to end their sessions now (a second Ctrl-C)."""


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
        options = {"_node_ip_address": "127.0.0.1", "include_dashboard": False}
        said = "ray: a local cluster on this machine, node address 127.0.0.1, no dashboard"
    else:
        options = {}
        said = "ray: a local cluster on this machine at its node address (the service is served beyond loopback)"
    if os.environ.get("RAY_TMPDIR"):
        ray.init(logging_level="WARNING", **options)
        return RayCluster(f"{said}; its files stay in {os.environ['RAY_TMPDIR']}/ray (RAY_TMPDIR)")
    files = RayFiles()
    try:
        files.init(logging_level="WARNING", **options)
    except BaseException as exc:
        RayCluster(said, files).shutdown(failed=isinstance(exc, Exception))  # a Ctrl-C is no failure to explain
        raise
    return RayCluster(f"{said}; its files in {files.path} (removed at the stop)", files)


def request_stop_now(now: bool = True) -> None:
    """Tell every draining replica to end its live sessions now (``now=False``: clear the word, before a deploy)."""
    from ray.experimental import internal_kv

    if now:
        internal_kv._internal_kv_put(STOP_NOW, b"1", overwrite=True)
    else:
        internal_kv._internal_kv_del(STOP_NOW)


def stop_now_requested() -> bool:
    """Whether the service is being stopped now (its replicas' drains end at once)."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_initialized() and internal_kv._internal_kv_exists(STOP_NOW)
