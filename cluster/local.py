"""The Ray cluster ``python -m apps.serve --ray`` runs on, and the word its replicas are told to stop now by.

Joining an existing cluster (``RAY_ADDRESS``) leaves its addresses to the operator who started it; a local cluster
started here keeps to loopback when the service was given a loopback address: its node address is 127.0.0.1, so the
processes that bind the node's address (Serve's proxy, the agents) bind loopback, and the dashboard is off.
"""

from __future__ import annotations

import os

from serving.access import is_loopback

STOP_NOW = b"ditto:stop-now"
"""The key in Ray's internal store that tells draining replicas to end their sessions now (a second Ctrl-C)."""


def start_ray(host: str) -> str:
    """Join ``RAY_ADDRESS`` or start a local Ray cluster (on loopback when ``host`` is); returns what it did, for the
    log."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level="WARNING")
        return f"ray: joined the cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} (its addresses are its operator's)"
    if is_loopback(host):
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level="WARNING")
        return "ray: a local cluster on this machine, node address 127.0.0.1, no dashboard"
    ray.init(logging_level="WARNING")
    return "ray: a local cluster on this machine at its node address (the service is served beyond loopback)"


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
