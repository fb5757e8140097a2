"""Why the connection-level defences refused something, and where each refusal is counted.

Every refusal a guard makes -- a socket closed at accept, a handshake that ran out of time, a stream reset, a session
closed for ignoring flow control -- is reported once, with one of these reasons, to a `RefusalSink`. The node wires
the sink to its Prometheus registry (`mesh.metrics.NodeMetrics.connection_refused`); tests pass a `Counter`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from enum import StrEnum

from transports.wire.reasons import Reason

log = logging.getLogger(__name__)


class Refusal(StrEnum):
    # Admission of a new inbound socket, before any byte is read (transports.hardening.admission)
    SOURCE_CONCURRENCY = Reason.SOURCE_CONCURRENCY  # too many live connections from one source address (IPv6: one /64)
    SOURCE_RATE = Reason.SOURCE_RATE  # new connections from one source faster than its token bucket refills
    PENDING_FULL = Reason.PENDING_FULL  # the oldest handshake in progress, dropped: the pending handshakes were full
    GATED = Reason.GATED  # the connection gate (the operator's deny or allow list) refused the address
    # The handshake (multistream, Noise, yamux), bounded by the handshake timeout
    HANDSHAKE_TIMEOUT = Reason.HANDSHAKE_TIMEOUT  # an idle or slow socket: closed when the timeout ran out
    HANDSHAKE_FAILED = Reason.HANDSHAKE_FAILED  # no common protocol, a bad Noise handshake, a socket closed mid-way
    # libp2p's resource manager, once the PeerID is known (transports.hardening.rcmgr)
    CONNECTION_LIMIT = Reason.CONNECTION_LIMIT  # established connections: inbound, total or per peer
    PEER_RATE = Reason.PEER_RATE  # new connections from one PeerID faster than its token bucket refills
    # yamux, on an established connection (transports.hardening.yamux)
    WINDOW_VIOLATION = Reason.WINDOW_VIOLATION  # data past the receive window: the session is closed
    STREAM_CAP = Reason.STREAM_CAP  # more inbound streams open on one connection than allowed: the new one is reset
    # Peers penalised for invalid messages (transports.hardening.penalties): each cut-off once, then each refusal
    INVALID_GOSSIP = Reason.INVALID_GOSSIP  # its gossip score fell below the graylist threshold: banned, cut off
    INVALID_FRAMES = Reason.INVALID_FRAMES  # too many invalid direct-stream frames: banned and disconnected
    PEER_BANNED = Reason.PEER_BANNED  # a connection or stream of a banned peer, refused until its ban ends
    # Peers refused for want of room (transports.hardening.holdoff)
    RETRY_TOO_SOON = Reason.RETRY_TOO_SOON  # an offer sent before its peer's retry hint ran out: refused unparsed
    RETRY_IGNORED = Reason.RETRY_IGNORED  # too many of those: banned and disconnected


RefusalSink = Callable[[Refusal], None]


class Refusals:
    """The one place a guard reports a refusal: counted here, then passed on to the sink, if there is one.

    A sink that raises must not turn a refusal into a crash of the guard that made it (the guards run inside
    libp2p's tasks), so its errors are logged and dropped.
    """

    def __init__(self, sink: RefusalSink | None = None) -> None:
        self.counts: Counter[Refusal] = Counter()
        self.sink = sink

    def __call__(self, reason: Refusal) -> None:
        self.counts[reason] += 1
        if self.sink is not None:
            try:
                self.sink(reason)
            except Exception:
                log.exception("the refusal sink failed on %s", reason)
