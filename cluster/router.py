"""A Serve request router that places new sessions by the capacity each engine replica reports.

Every replica reports its free capacity (``EngineReplica.record_routing_stats``: the engine's own
admission less its live sessions) every ``request_routing_stats_period_s``. A report is up to a
period old when a burst of sessions arrives, so the router also counts the sessions it has sent
to each replica that the replica's reports do not count yet (each report says how many create calls
the replica has answered), and takes them off. ``create`` calls go to the
replica with the most room first, after every replica that has not yet refused this POST (the
ingress names those in the call, so a retry never lands on a replica that just said no while
another is untried); every other call to any replica. When no replica has room the ranking still
names one (a full replica refuses at once, and the ingress answers 503): a router that named none
would leave the request waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from cluster import reports

PLACING = "create"
"""The engine replica's method that opens a session: the only call placed by capacity."""
Replica = TypeVar("Replica")
FORGET_AFTER = 2
"""Reports after its last send past which a send a replica never answered (routed elsewhere) is no longer held
against it."""


@dataclass
class Sent:
    """Sessions this router sent to one replica since a baseline: the replica's answered count in a report."""

    count: int = 0
    answered: int = 0
    """The replica's ``answered`` at the baseline."""
    seq: int | None = None
    """The report's ``seq`` at the last send."""

    def pending(self, report: Mapping[str, Any]) -> int:
        """Sent and not yet answered by the time of ``report``: the sessions its ``free`` does not count."""
        if self.seq is not None and report.get("seq", 0) - self.seq >= FORGET_AFTER:
            return 0
        return max(0, self.count - (report.get("answered", 0) - self.answered))


def placement_order(
    replicas: Sequence[Replica], free: Callable[[Replica], int], refused: Collection[str], key: Callable[[Replica], str]
) -> list[Replica]:
    """``replicas`` in the order a new session is offered to them: those that have not refused it yet first, each
    group by ``free`` room, most first."""
    return sorted(replicas, key=lambda r: (key(r) not in refused, free(r)), reverse=True)


class CapacityRouter(FIFOMixin, RequestRouter):
    """Rank replicas for a new session by their reported free capacity, less the sessions sent since that report."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._sent: dict[ReplicaID, Sent] = {}

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or pending_request.metadata.call_method != PLACING:
            return [candidate_replicas]
        self._publish()
        refused = pending_request.args[1] if len(pending_request.args) > 1 else ()
        ranked = placement_order(candidate_replicas, self.free, refused, key=lambda r: r.replica_id.unique_id)
        if ranked:
            self._count(ranked[0])
        return [[replica] for replica in ranked]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def _publish(self) -> None:
        reports.REPORTED.clear()
        reports.REPORTED.update({r.replica_id.unique_id: dict(r.routing_stats) for r in self.curr_replicas.values()})

    def free(self, replica: RunningReplica) -> int:
        """Sessions ``replica`` can still take: its last report less what was sent to it that the report does not
        count."""
        stats = replica.routing_stats
        if "free" not in stats:
            return 0  # not reported yet (just started): after every replica that has room
        sent = self._sent.get(replica.replica_id)
        return stats["free"] - (sent.pending(stats) if sent is not None else 0)

    def _count(self, replica: RunningReplica) -> None:
        """One more session sent to ``replica``. Counted when chosen, not once routed: the requests of a burst are
        ranked concurrently, and each must see the ones ranked before it."""
        stats = replica.routing_stats
        sent = self._sent.get(replica.replica_id)
        if sent is None or sent.pending(stats) == 0:  # everything sent before is in the report: a new baseline
            sent = self._sent[replica.replica_id] = Sent(answered=stats.get("answered", 0))
        sent.count += 1
        sent.seq = stats.get("seq")
