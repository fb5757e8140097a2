"""libp2p's resource manager (rcmgr), configured for the limits of it that work in py-libp2p 0.8.1.

What it enforces correctly, and we use:
- established connections, inbound, outbound, total and per peer (`ConnectionLimits`, checked in `Swarm.add_conn`
  against the live connection table);
- new connections per PeerID per second (a token bucket, checked once the handshake has named the peer).

What is kept out of the way, and why (each reproduced in the research notes, libp2p-network.md section 3):
- its global connection counter (`ResourceLimits.max_connections`) counts every inbound handshake twice, so that
  concurrent handshakes can all be refused, and it leaks one unit per `ConnectionLimits` refusal: the limit is set
  out of reach. (`ConnectionScopedSwarm.add_conn` also releases the leaked unit, so the counter stays true.)
- its swarm-wide stream semaphore (`max_streams`) queues streams instead of refusing them, so one peer holding
  streams blocks everyone's: it is set out of reach too, and streams are bounded per connection by `BoundedYamux`.
- graceful degradation lowers every limit by 20% per exhaustion event, so that an attack shrinks the node for
  honest peers: off.
- the circuit breaker, once open, is never half-opened again by `acquire_connection`: off.
- memory limits and pending-connection limits are never consulted by 0.8.1: memory is bounded by `BoundedYamux`,
  pending handshakes by `SourceAdmission`.
"""

from __future__ import annotations

from dataclasses import dataclass

from libp2p.rcmgr import ResourceLimits, ResourceManager
from libp2p.rcmgr.connection_limits import ConnectionLimits

OUT_OF_REACH = 1 << 30


@dataclass(frozen=True, slots=True)
class ConnectionBudget:
    max_inbound: int = 64  # established inbound connections
    max_outbound: int = 32  # established outbound connections
    # Two, not one: a peer that reconnects at once finds its old connection still being torn down (libp2p takes
    # 0.2 s to drop it). The host still keeps one connection per peer (ConnectionConfig.max_connections_per_peer).
    max_per_peer: int = 2
    peer_rate: float = 2.0  # new connections per second from one PeerID, sustained
    peer_burst: float = 10.0  # and in a burst
    total: int | None = None  # established connections in both directions; None: max_inbound + max_outbound

    def __post_init__(self) -> None:
        if min(self.max_inbound, self.max_outbound, self.max_per_peer, self.max_total) < 1:
            raise ValueError("connection budgets must allow at least one connection")
        if self.peer_rate <= 0 or self.peer_burst < 1:
            raise ValueError("a peer's connection rate must be positive and its burst at least 1")

    @property
    def max_total(self) -> int:
        return self.max_inbound + self.max_outbound if self.total is None else self.total


def resource_manager(budget: ConnectionBudget) -> ResourceManager:
    return ResourceManager(
        limits=ResourceLimits(max_connections=OUT_OF_REACH, max_streams=OUT_OF_REACH, max_memory_mb=OUT_OF_REACH),
        connection_limits=ConnectionLimits(
            max_established_inbound=budget.max_inbound,
            max_established_outbound=budget.max_outbound,
            max_established_per_peer=budget.max_per_peer,
            max_established_total=budget.max_total,
        ),
        enable_graceful_degradation=False,
        enable_circuit_breaker=False,
        connections_per_peer_per_sec=budget.peer_rate,
        burst_connections_per_peer=budget.peer_burst,
    )
