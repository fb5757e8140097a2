"""Connection-level defences of a libp2p host (issue 11): what one peer, or one address, can make the node hold.

`open_host` applies all of them, configured by one `Defences`:

| attack | defence | module |
|---|---|---|
| reconnecting 250 times makes the node deaf | the inbound handler lives as long as its connection | `inbound` |
| idle or slow sockets hold every slot | 3 s handshake timeout; per-source cap and rate; pending cap | `admission` |
| fresh keys, full handshakes, at a high rate | per-source rate; established inbound and total caps | `rcmgr` |
| one key reconnecting in a loop | per-PeerID connection rate | `rcmgr` |
| data pushed past the yamux window | session closed at the first excess byte | `yamux` |
| many streams, or slow readers | inbound streams per connection capped; window at most 1 MiB | `yamux` |
| N connections take N x 0.2 s to close | concurrent close, bounded by a grace period | `shutdown` |
| refused sockets reopened at once | refused sockets held open, unread, for 3 s | `admission` |
| a peer sending invalid messages | strikes, then a ban: its connections and streams refused for 10 min | `penalties` |

Every refusal is reported once, by reason, to `Refusals` (and from there to the node's metrics).
"""

from __future__ import annotations

import logging
import resource
from collections import Counter
from dataclasses import dataclass, field

from libp2p.abc import IHost
from libp2p.network.config import ConnectionConfig
from libp2p.rcmgr import ResourceManager

from transports.hardening.admission import AdmissionLimits, SourceAdmission, source_key
from transports.hardening.inbound import ConnectionScopedSwarm, GuardedSwarm, PeerBanned, install_guarded_swarm
from transports.hardening.penalties import PenaltyBox, PenaltyLimits
from transports.hardening.rcmgr import ConnectionBudget, resource_manager
from transports.hardening.refusals import Refusal, Refusals, RefusalSink
from transports.hardening.shutdown import close_fast
from transports.hardening.yamux import BoundedYamux, StreamLimits, install_bounded_yamux

log = logging.getLogger(__name__)

FD_RESERVE = 512

__all__ = [
    "AdmissionLimits",
    "BoundedYamux",
    "ConnectionBudget",
    "ConnectionScopedSwarm",
    "Defences",
    "GuardedSwarm",
    "PeerBanned",
    "PenaltyBox",
    "PenaltyLimits",
    "Refusal",
    "RefusalSink",
    "Refusals",
    "StreamLimits",
    "close_fast",
    "ensure_file_descriptors",
    "install_defences",
    "refusal_counts",
    "source_key",
]


@dataclass(frozen=True, slots=True)
class Defences:
    # An honest Noise + yamux handshake takes milliseconds, on loopback or across a continent; libp2p's default
    # (10 s) let 250 silent sockets hold the node for 10 s at a time.
    handshake_timeout: float = 3.0
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    connections: ConnectionBudget = field(default_factory=ConnectionBudget)
    streams: StreamLimits = field(default_factory=StreamLimits)
    close_grace: float = 0.5  # how long closing the host waits for its connections' GO_AWAYs
    penalties: PenaltyLimits = field(default_factory=PenaltyLimits)

    def connection_config(self, *, max_connections_per_peer: int) -> ConnectionConfig:
        """The swarm's own limits, sized so that ours decide.

        The swarm's inbound limiter (`max_connections - min_connections`) holds a slot for every inbound handler:
        established connections, pending handshakes, evicted handshakes until their task has run once more to give
        the slot back, and refused sockets being held; it closes sockets past it silently, before admission sees
        them. `max_connections` also caps live connections in `add_conn`. Both are sized above what admission and
        rcmgr's `ConnectionLimits` allow, so that those refuse first, with a reason. No minimum: the auto-connector
        is stopped.
        """
        admission = self.admission
        cap = self.connections.max_total + 2 * admission.max_pending + admission.max_held
        return ConnectionConfig(
            max_connections_per_peer=max_connections_per_peer,
            max_connections=cap,
            min_connections=0,
            low_watermark=0,
            high_watermark=cap,
            inbound_upgrade_timeout=self.handshake_timeout,
        )

    def resource_manager(self) -> ResourceManager:
        return resource_manager(self.connections)

    @property
    def file_descriptors(self) -> int:
        """Descriptors the node may hold under attack: every connection the limits allow, plus a reserve for the
        rest of the node (listeners, the Docker socket, its files)."""
        admission = self.admission
        return self.connections.max_total + 2 * admission.max_pending + admission.max_held + FD_RESERVE


def install_defences(host: IHost, defences: Defences, refusals: Refusals, penalties: PenaltyBox | None = None) -> None:
    """Apply the defences that hook into `host` (built by `new_host` with `connection_config()` and
    `resource_manager()`, not yet running): admission, the slot fix and the ban gate in the swarm, bounds in yamux."""
    ensure_file_descriptors(defences.file_descriptors)
    penalties = penalties if penalties is not None else PenaltyBox(defences.penalties)
    install_guarded_swarm(host, SourceAdmission(defences.admission), refusals, penalties)
    install_bounded_yamux(host, defences.streams, refusals)


def ensure_file_descriptors(needed: int) -> None:
    """Raise the soft limit on open files to `needed` when the hard limit allows (Go's runtime raises it to the
    hard limit for every program): with the common soft limit of 1024, a thousand idle sockets would exhaust the
    node's descriptors, and `accept` would fail for everyone. Warn when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            log.warning(
                "open files are limited to %d; under attack the node may need %d: raise `ulimit -n`", target, needed
            )


def refusal_counts(host: IHost) -> Counter[Refusal]:
    """What the defences of `host` refused so far, by reason (empty for a host without them)."""
    swarm = host.get_network()
    return swarm.refusals.counts if isinstance(swarm, GuardedSwarm) else Counter()
