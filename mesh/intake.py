"""The one intake: every transport delivers here, and everything admitted is `origin=remote`.

Checks run cheapest first, so that garbage costs almost nothing and only well-formed, fresh, unseen offers cost a
signature verification: size, decode, version, clock, replay cache, signature, per-peer rate limit, policy, and
last the sandbox gate. Every rejection is a `Rejection` with a reason code, counted by transport and reason. The
queue of admitted work is bounded; when it is full the offer is refused with `busy`, never dropped silently.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import trio

from executor.contract import LANGUAGES
from mesh.codec import DEFAULT_MAX_MESSAGE_BYTES
from mesh.limits import RateLimiter, ReplayCache
from mesh.metrics import NodeMetrics
from mesh.offers import ClockPolicy, ReceivedOffer, check_clock, now_ms, parse_offer
from mesh.reasons import Reason, Rejected, Rejection
from transports.base import Admitted, Delivery, Verdict


@dataclass(frozen=True)
class IntakePolicy:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    clock: ClockPolicy = field(default_factory=ClockPolicy)
    languages: frozenset[str] = frozenset(LANGUAGES)
    # None admits every offerer; otherwise only these public keys. The deny list always applies.
    allow_offerers: frozenset[bytes] | None = None
    deny_offerers: frozenset[bytes] = frozenset()
    rate_per_offerer: float = 5.0  # offers a second, sustained
    burst_per_offerer: float = 20.0
    queue_size: int = 32
    replay_capacity: int = 100_000

    @property
    def replay_ttl_s(self) -> float:
        # An offer must be remembered for as long as the clock check could still let it in.
        return (self.clock.max_ttl_ms + 2 * self.clock.max_skew_ms) / 1000


@dataclass(slots=True)
class Job:
    """An admitted offer waiting for a worker. Origin is decided here, never read from the offer."""

    received: ReceivedOffer
    delivery: Delivery
    admitted_at: float
    origin: Literal["remote"] = "remote"


class _VerifiedDigests:
    """Digests of offers whose signature the gossip validator already checked, so the intake does not repeat it."""

    def __init__(self, capacity: int = 4096) -> None:
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._capacity = capacity

    def add(self, digest: bytes) -> None:
        self._digests[digest] = None
        if len(self._digests) > self._capacity:
            self._digests.popitem(last=False)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._digests


class Intake:
    def __init__(
        self,
        policy: IntakePolicy,
        *,
        participating: Callable[[], bool],
        metrics: NodeMetrics | None = None,
        clock_ms: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._participating = participating
        self.metrics = metrics or NodeMetrics()
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._replays = ReplayCache(policy.replay_ttl_s, policy.replay_capacity)
        self._rates = RateLimiter(policy.rate_per_offerer, policy.burst_per_offerer)
        self._verified = _VerifiedDigests()
        self._send, self.jobs = trio.open_memory_channel[Job](policy.queue_size)
        # Plain counters beside the Prometheus ones: cheap to read in tests and in the demo.
        self.admitted: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()

    @property
    def participating(self) -> bool:
        return self._participating()

    # -- the entry point of every transport ------------------------------------------------------------------

    async def deliver(self, delivery: Delivery) -> Verdict:
        try:
            received = self._check(delivery)
        except Rejected as rejected:
            return self._refuse(delivery.transport, rejected.rejection)
        job = Job(received, delivery, self._monotonic())
        try:
            self._send.send_nowait(job)
        except trio.WouldBlock:
            return self._refuse(delivery.transport, Rejection(Reason.BUSY, "the intake queue is full"))
        except trio.ClosedResourceError:
            return self._refuse(delivery.transport, Rejection(Reason.SHUTTING_DOWN, "the node is shutting down"))
        self.admitted[delivery.transport] += 1
        self.metrics.offer_admitted(delivery.transport)
        return Admitted(received.offer.offer_id)

    def validate(self, raw: bytes) -> Rejection | None:
        """The stateless part of the checks, for gossip's topic validator: invalid offers are never forwarded.

        No replay cache and no rate limit here: forwarding a valid offer we have already run is gossip's business
        (its content-addressed message ids collapse duplicates), and it must not use up the offerer's budget.
        """
        try:
            received = self._parse(raw)
            self._verify(received)
        except Rejected as rejected:
            return self._refuse("gossip-validator", rejected.rejection)
        return None

    def close(self) -> None:
        self._send.close()

    # -- the checks, in order ----------------------------------------------------------------------------------

    def _parse(self, raw: bytes) -> ReceivedOffer:
        received = parse_offer(raw, max_size=self.policy.max_message_bytes)
        check_clock(received.offer, now=self._clock_ms(), policy=self.policy.clock)
        return received

    def _verify(self, received: ReceivedOffer) -> None:
        digest = received.digest
        if digest in self._verified:
            return
        if not received.signature_valid():
            raise Rejected(Reason.BAD_SIGNATURE, "offer signature does not verify against its offerer")
        self._verified.add(digest)

    def _check(self, delivery: Delivery) -> ReceivedOffer:
        received = self._parse(delivery.raw)
        offer = received.offer
        now = self._monotonic()
        if self._replays.seen(offer.offerer, offer.offer_id, now):
            raise Rejected(Reason.REPLAYED, "this offer id from this offerer was already taken")
        self._verify(received)
        # Remembered only once the signature holds, so that forgeries cannot burn a real offerer's offer ids.
        self._replays.remember(offer.offerer, offer.offer_id, now)
        # Rate limited by offerer: it is the identity the signature proves, whichever peer forwarded the bytes.
        if not self._rates.allow(offer.offerer.hex(), now):
            raise Rejected(Reason.RATE_LIMITED, "this offerer is over its rate")
        if offer.language not in self.policy.languages:
            raise Rejected(Reason.LANGUAGE_NOT_ALLOWED, f"{offer.language} is not run by this node")
        if offer.offerer in self.policy.deny_offerers or (
            self.policy.allow_offerers is not None and offer.offerer not in self.policy.allow_offerers
        ):
            raise Rejected(Reason.OFFERER_DENIED, "the operator's policy does not take work from this offerer")
        if not self._participating():
            raise Rejected(Reason.SANDBOX_UNAVAILABLE, "this node cannot sandbox, so it takes no remote work")
        return received

    def _refuse(self, transport: str, rejection: Rejection) -> Rejection:
        self.rejected[(transport, str(rejection.reason))] += 1
        self.metrics.offer_rejected(transport, str(rejection.reason))
        return rejection
