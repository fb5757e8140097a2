"""The one narrow interface between every transport and the node.

A transport turns bytes into a `Delivery` and hands it to an `OfferSink` (the node's intake). It knows nothing of
Docker, of policy or of how the work is run: it only knows how to ask the offerer for the work (`claim`), how to
carry the signed result back (`reply`), and when the offerer has stopped waiting (`scope`), because those are
properties of the wire it owns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from transports.wire.jobs import OutputChunk
from transports.wire.reasons import Rejection
from transports.wire.sealed import Payload

# Asks the offerer for the right to run this offer. True means granted. Direct offers are addressed to us and need
# no claim; gossip and BLE offers are heard by many and must be claimed so that each runs once.
ClaimFn = Callable[[], Awaitable[bool]]
# Carries the signed result (wire bytes) back to the offerer.
ReplyFn = Callable[[bytes], Awaitable[None]]
# Carries one chunk of live output to a following offerer; False once it no longer takes any.
StreamFn = Callable[[OutputChunk], Awaitable[bool]]


async def _no_claim_needed() -> bool:
    return True


@dataclass(slots=True)
class Delivery:
    raw: bytes
    transport: str
    # The authenticated sender where the transport has one: a libp2p PeerID string, or a BLE address.
    sender: str | None
    reply: ReplyFn
    claim: ClaimFn = field(default=_no_claim_needed)
    # True when the offerer addressed this node itself, over a stream it authenticated (the direct protocol): the
    # one route on which a v2 offer with `audience.to` is taken, and on which a claimed offer never is.
    direct: bool = False
    # The job's cancel scope, owned by the transport: it cancels it when the offerer stops waiting (its stream
    # closed or timed out, or it sent an abort). The worker runs the job inside it, so the cancel reaches the
    # container. A scope may be cancelled before the worker enters it: the job then never starts.
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    # Where the transport can carry live output to the offerer as it comes (a direct offer stream): used when the
    # offer asks for it (`follow`). None: the result is the only answer.
    stream: StreamFn | None = None
    # A sealed offer's payload, set by `claim` when the grant carried it: opened and checked against the offer's
    # digests, or why not (`payload_mismatch`, `malformed`). None for a clear offer, or before the grant.
    payload: Payload | Rejection | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    offer_id: bytes


Verdict = Admitted | Rejection


class OfferSink(Protocol):
    """What every transport delivers into. Implemented by `mesh.intake.Intake`."""

    async def deliver(self, delivery: Delivery) -> Verdict: ...

    @property
    def participating(self) -> bool:
        """False while the sandbox gate has withdrawn the node: transports stop taking offers."""
        ...


class Transport(Protocol):
    """A way offers reach the node (direct streams, gossip, BLE, a coordinator's /pull): one lifecycle for all.

    `run` serves until cancelled, delivering into `sink`; it calls `task_status.started()` once it takes offers, so
    the node starts each with `nursery.start(transport.run, sink)`, and one cancel drains them all.
    """

    name: str

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...


class Service(Protocol):
    """What the node runs beside its transports that takes no offers (bootstrap, discovery, relay): the same
    lifecycle, without a sink."""

    name: str

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...
