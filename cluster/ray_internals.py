"""Ray's private names the cluster needs, in one place: the switch that makes a local cluster take loopback for its
node address, and the cluster's internal key-value store (where the service's word to stop now is kept).

- ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``: False makes ``ray._private.services.get_node_ip_address`` answer
  loopback (Ray's own rule for macOS and Windows); ``loopback_node_address`` turns it off while a local cluster
  starts. No option of ``ray.init`` does it: an explicit 127.0.0.1 is replaced with the machine's address.
- ``ray.experimental.internal_kv._internal_kv_put``, ``_internal_kv_del``, ``_internal_kv_exists`` and
  ``_internal_kv_initialized``: the GCS's key-value store, which every process of the cluster reads; Ray has no public
  name for it.

Checked against ray 2.60.0 (pinned in constraints.txt; pyproject.toml's ``ray`` extra allows ``ray[serve]>=2.60``).
What breaks if upstream changes them: a moved module or a renamed function fails at once (ImportError,
AttributeError), at the start of a local cluster on loopback or when the service stops and its replicas drain. If Ray
stops reading ``ENABLE_RAY_CLUSTER`` for the node address, nothing fails: a local cluster started for a loopback
service listens on the machine's address again (``tests/cluster/test_cpu_engine.py`` checks every socket it opens).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def loopback_node_address() -> Iterator[None]:
    """Ray takes loopback for the node address of a local cluster started meanwhile."""
    from ray._private import ray_constants

    enabled = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


def kv_put(key: bytes, value: bytes) -> None:
    """Set ``key`` in the cluster's internal store (overwriting)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True)


def kv_delete(key: bytes) -> None:
    """Remove ``key`` from the cluster's internal store."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key)


def kv_has(key: bytes) -> bool:
    """Whether this process is connected to a cluster whose internal store holds ``key``."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_initialized() and internal_kv._internal_kv_exists(key)
