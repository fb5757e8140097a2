"""The one intake: every transport delivers here, and everything admitted is `origin=remote`.

Checks run cheapest first, so that garbage costs almost nothing and only well-formed, fresh, unseen offers cost a
signature verification: size, decode, version, clock, the offer's audience (a v2 offer names the one node it was
sent to, or is claimed, maybe only by invitees: `wrong_audience`, `not_invited`), replay memory, signature, then the
operator's policy (language, offerer lists), `sandbox_required_for_remote_task` for an offer that asks for the
host, the sandbox gate, the offer's minimum sandbox tier (`isolation_insufficient`), room in the queue and in the
replay memory, and last the offerer's rate. Only an offer that passes all of them spends its id (see `mesh.replay`):
a refused offer may be sent again. Every rejection is a `Rejection` with a reason code, counted by transport and
reason.

Admitted jobs wait in a fair queue (`mesh.fairqueue.ClassQueue`), one lane per offerer, in two classes: offerers
this node knows (`mesh.standing`: trusted by the operator, or served here before) and fresh ones. Fresh offerers
together hold at most `fresh_share` of the queue's places and of the workers, so a swarm of new keys cannot take
what established offerers are kept. An offerer's budget follows the workers: it may have at most
`queue_per_offerer` offers unfinished (queued or running; default twice the workers), so it gets more in only as
the workers finish its work, and one with a run going yields its turn to offerers with none. When any bound is
reached the offer is refused with `busy`, never dropped silently. `deliver` never awaits before its verdict, so two
copies of one offer cannot both pass.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import trio

from executor.contract import LANGUAGES
from executor.runcontrol import RunControl
from mesh.fairqueue import ClassQueue
from mesh.jobstream import JobStream
from mesh.limits import RateLimiter
from mesh.metrics import NodeMetrics
from mesh.replay import ReplayMemory
from mesh.standing import Standing
from transports.base import Admitted, Delivery, Verdict
from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES
from transports.wire.needs import Capabilities, unmet_by
from transports.wire.offers import ClockPolicy, ReceivedOffer, TaskOffer, check_clock, meets, now_ms, parse_offer
from transports.wire.reasons import Reason, Rejected, Rejection


@dataclass(frozen=True)
class IntakePolicy:
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    clock: ClockPolicy = field(default_factory=ClockPolicy)
    languages: frozenset[str] = frozenset(LANGUAGES)
    # None admits every offerer; otherwise only these public keys. The deny list always applies.
    allow_offerers: frozenset[bytes] | None = None
    deny_offerers: frozenset[bytes] = frozenset()
    # A ceiling on the ids one offerer spends (it sizes its share of the replay memory); what it gets served is
    # bounded by `queue_per_offerer` and the workers, below.
    rate_per_offerer: float = 5.0  # offers a second, sustained
    burst_per_offerer: float = 20.0
    queue_size: int = 32
    # Offers one offerer may have unfinished (queued or running); None is twice the workers.
    queue_per_offerer: int | None = None
    replay_capacity: int = 100_000
    # Established without having been served here (see mesh.standing); allow_offerers' keys are too.
    trusted_offerers: frozenset[bytes] = frozenset()
    # The part of the queue's places and of the workers that fresh offerers may take, together (at least one each).
    fresh_share: float = 0.5
    # A fresh offerer becomes established once this node has served it over this long (see mesh.standing), and
    # node-wide at most `promotions_per_hour` of them are (a burst of 16).
    established_after_s: float = 600.0
    promotions_per_hour: float = 60.0

    def __post_init__(self) -> None:
        if self.queue_size < 1 or not 1 <= self.per_offerer(1) <= self.queue_size:
            raise ValueError("the queue needs queue_size >= 1 and 1 <= queue_per_offerer <= queue_size")
        if not 0 < self.fresh_share <= 1 or self.promotions_per_hour <= 0 or self.established_after_s < 0:
            raise ValueError("fresh_share must be in (0, 1], promotions_per_hour positive, established_after_s >= 0")

    def per_offerer(self, workers: int) -> int:
        """Offers one offerer may have unfinished, on a node with `workers` workers."""
        if self.queue_per_offerer is not None:
            return self.queue_per_offerer
        return min(self.queue_size, max(2, 2 * workers))

    def fresh_places(self) -> int:
        return max(1, int(self.queue_size * self.fresh_share))

    def fresh_workers(self, workers: int) -> int:
        return max(1, int(workers * self.fresh_share))

    @property
    def established_offerers(self) -> frozenset[bytes]:
        return self.trusted_offerers | (self.allow_offerers or frozenset())

    @property
    def replay_per_offerer(self) -> int:
        # What an offerer within its rate can have admitted while the clock check still lets an offer in: it never
        # runs out of share by behaving.
        window_s = (self.clock.max_ttl_ms + 2 * self.clock.max_skew_ms) / 1000
        return min(self.replay_capacity, int(self.burst_per_offerer + self.rate_per_offerer * window_s) + 1)


@dataclass(slots=True)
class Job:
    """An admitted offer waiting for a worker. Origin is decided here, never read from the offer."""

    received: ReceivedOffer
    delivery: Delivery
    admitted_at: float
    # The offerer's class when it was admitted (see mesh.standing): which share of the queue and workers it uses.
    established: bool = False
    origin: Literal["remote"] = "remote"
    # The run's control (a signed cancel stops it, keeping its output), whether the offerer cancelled it, whether a
    # worker has started it, and its signed answer once sent (mesh/jobcancel.py).
    control: RunControl = field(default_factory=RunControl)
    cancelled: bool = False
    started: bool = False
    signed: bytes | None = None
    answered: trio.Event = field(default_factory=trio.Event)
    # Its output as it comes (mesh/jobstream.py), from the start of its run.
    stream: JobStream | None = None

    def cancel(self) -> None:
        self.cancelled = True
        self.control.stop()

    @property
    def offerer(self) -> bytes:
        return self.received.offer.offerer


class JobQueue:
    """The fair queue as the workers see it: `async for job in queue`, ending once closed and drained."""

    def __init__(self, fair: ClassQueue[Job]) -> None:
        self._fair = fair
        self._waiters = trio.lowlevel.ParkingLot()
        self.closed = False

    def __len__(self) -> int:
        return len(self._fair)

    @property
    def classes(self) -> ClassQueue[Job]:
        return self._fair

    def has_room(self, job: Job) -> bool:
        return self._fair.has_room(job.offerer, job.established)

    def put(self, job: Job) -> None:
        self._fair.put(job.offerer, job, job.established)
        self._waiters.unpark()

    def done(self, job: Job) -> None:
        """A job taken from the queue is finished: its offerer's lane, and its class's workers, have room again."""
        self._fair.done(job.offerer, job.established)
        self._waiters.unpark()  # a fresh job may have been waiting for the fresh share of the workers

    def receive_nowait(self) -> Job:
        found = self._fair.pop()
        if found is not None:
            return found[1]
        if self.closed and not len(self._fair):
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> Job:
        while True:
            try:
                job = self.receive_nowait()
            except trio.WouldBlock:
                await self._waiters.park()
                continue
            await trio.lowlevel.checkpoint()
            return job

    def close(self) -> None:
        self.closed = True
        self._waiters.unpark_all()

    # An iterator of its own, as trio's channels are, not an async generator: a worker cancelled mid-`async for`
    # would leave a generator to the garbage collector, unfinalised (Trio warns of it; nothing closes it).
    def __aiter__(self) -> JobQueue:
        return self

    async def __anext__(self) -> Job:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


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
        replay_journal: Path | None = None,
        peer_id: str | None = None,
        tiers: Callable[[], Collection[str]] = lambda: ("runc",),
        standing_journal: Path | None = None,
        workers: int = 1,
        capabilities: Callable[[], Capabilities | None] = lambda: None,
    ) -> None:
        self.policy = policy
        # The runtimes this node has built and its resources, which an offer's needs must meet (None: python only).
        self._capabilities = capabilities
        self._participating = participating
        # This node's PeerID, which a direct offer's audience must name, and the sandbox tiers it runs now.
        self.peer_id = peer_id
        self._tiers = tiers
        self.metrics = metrics or NodeMetrics()
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._replays = ReplayMemory(
            per_offerer=policy.replay_per_offerer,
            capacity=policy.replay_capacity,
            now_ms=clock_ms,
            journal=replay_journal,
        )
        self._rates = RateLimiter(policy.rate_per_offerer, policy.burst_per_offerer)
        self._verified = _VerifiedDigests()
        self.standing = Standing(
            trusted=policy.established_offerers,
            tenure_s=policy.established_after_s,
            promotions_per_hour=policy.promotions_per_hour,
            monotonic=monotonic,
            journal=standing_journal,
        )
        self.jobs = JobQueue(
            ClassQueue(
                policy.queue_size,
                policy.per_offerer(workers),
                fresh_capacity=policy.fresh_places(),
                fresh_workers=policy.fresh_workers(workers),
                running_share=max(1, workers // 2),
            )
        )
        # Admitted and not yet finished (queued or running), so that an abort from the offerer can find its job.
        # Bounded by the queue and the workers: `finished()` removes each job when its worker is done with it.
        self._pending: dict[tuple[bytes, bytes], Job] = {}
        # Plain counters beside the Prometheus ones: cheap to read in tests and in the demo.
        self.admitted: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()

    @property
    def participating(self) -> bool:
        return self._participating()

    @property
    def queue_depth(self) -> int:
        return len(self.jobs)

    # -- the entry point of every transport ------------------------------------------------------------------

    async def deliver(self, delivery: Delivery) -> Verdict:
        try:
            received = self._admit(delivery)
        except Rejected as rejected:
            return self._refuse(delivery.transport, rejected.rejection)
        self.admitted[delivery.transport] += 1
        self.metrics.offer_admitted(delivery.transport)
        return Admitted(received.offer.offer_id)

    def validate(self, raw: bytes) -> Rejection | None:
        """The stateless part of the checks, for gossip's topic validator: invalid offers are never forwarded.

        No replay memory and no rate limit here: forwarding a valid offer we have already run is gossip's business
        (its content-addressed message ids collapse duplicates), and it must not use up the offerer's budget.
        """
        try:
            received = self._parse(raw)
            self._verify(received)
        except Rejected as rejected:
            return self._refuse("gossip-validator", rejected.rejection)
        return None

    def abort(self, offerer: bytes, offer_id: bytes) -> bool:
        """The offerer stopped waiting: cancel its job's scope, queued or running. False when there is none."""
        job = self._pending.get((offerer, offer_id))
        if job is None:
            return False
        job.delivery.scope.cancel()
        return True

    def pending_job(self, offer_id: bytes) -> Job | None:
        """The job of that offer id, queued or running here, whoever offered it (a cancel names only the id)."""
        return next((job for (_, oid), job in self._pending.items() if oid == offer_id), None)

    def finished(self, job: Job) -> None:
        """A worker is done with a job it took from the queue (once per job)."""
        self._pending.pop((job.offerer, job.received.offer.offer_id), None)
        self.jobs.done(job)

    def served(self, job: Job) -> None:
        """The job's code ran here and its result was handed back: its offerer has history with this node now."""
        self.standing.served(job.offerer)

    def spare_warm(self, job: Job) -> int:
        """Warm containers a job taken from the queue must leave in the pool: the last one is kept for an
        established offerer with no other run going, the one whose latency the classes are there to protect.

        Only while fresh offerers crowd in (another fresh run going, or fresh work queued): a new user alone on a
        quiet node gets the warm container too. (Kept always, every fresh offerer's runs went cold on a pool of
        one, the first ten minutes of every new user's life.)"""
        queue = self.jobs.classes
        if job.established:
            return 0 if queue.established.running(job.offerer) <= 1 else 1
        crowded = queue.fresh.running() > 1 or len(queue.fresh) > 0  # this job is already counted as running
        return 1 if crowded else 0

    def close(self) -> None:
        self.jobs.close()
        self._replays.close()
        self.standing.close()

    # -- the checks, in order ----------------------------------------------------------------------------------

    def _parse(self, raw: bytes) -> ReceivedOffer:
        received = parse_offer(raw, max_size=self.policy.max_message_bytes)
        now = self._clock_ms()
        check_clock(received.offer, now=now, policy=self.policy.clock)
        deadline = received.offer.queue_deadline_ms
        if deadline is not None and deadline <= now:
            # A v3 offer that may wait in a queue only until a time already past: nobody may take it now.
            raise Rejected(Reason.QUEUE_DEADLINE, f"its queueDeadlineMs passed {now - deadline} ms ago")
        return received

    def _verify(self, received: ReceivedOffer) -> None:
        digest = received.digest
        if digest in self._verified:
            return
        if not received.signature_valid():
            raise Rejected(Reason.BAD_SIGNATURE, "offer signature does not verify against its offerer")
        self._verified.add(digest)

    def _admit(self, delivery: Delivery) -> ReceivedOffer:
        """Every check, then the queue, then the id is spent. No await: the verdict is atomic."""
        if self.jobs.closed:
            raise Rejected(Reason.SHUTTING_DOWN, "the node is shutting down")
        received = self._parse(delivery.raw)
        offer = received.offer
        # Before the replay memory: a node the offer was never meant for says so, not "replayed", even where a
        # claimed copy of it already ran.
        self._check_audience(offer, delivery)
        if self._replays.seen(offer.offerer, offer.offer_id):
            raise Rejected(Reason.REPLAYED, "this offer id from this offerer was already taken")
        self._verify(received)
        if offer.language not in self.policy.languages:
            raise Rejected(Reason.LANGUAGE_NOT_ALLOWED, f"{offer.language} is not run by this node")
        if offer.offerer in self.policy.deny_offerers or (
            self.policy.allow_offerers is not None and offer.offerer not in self.policy.allow_offerers
        ):
            raise Rejected(Reason.OFFERER_DENIED, "the operator's policy does not take work from this offerer")
        if offer.sandbox != "docker":
            # Before any claim: a node that would only refuse the run must not take the claim from others.
            raise Rejected(Reason.SANDBOX_REQUIRED, "the offer asks for the host; remote work runs only in the sandbox")
        if not self._participating():
            raise Rejected(Reason.SANDBOX_UNAVAILABLE, "this node cannot sandbox, so it takes no remote work")
        if offer.min_isolation is not None:
            tiers = self._tiers()
            if not any(meets(tier, offer.min_isolation) for tier in tiers):
                runs = ", ".join(sorted(tiers)) or "no tier"
                raise Rejected(
                    Reason.ISOLATION_INSUFFICIENT,
                    f"the offer needs {offer.min_isolation} or stronger; this node runs {runs}",
                )
        # Before any claim: a node without the runtime (or the resources) must not take the claim from one with it.
        unmet = unmet_by(self._capabilities(), offer.needs)
        if unmet is not None:
            raise Rejected(*unmet)
        job = Job(received, delivery, self._monotonic(), established=self.standing.established(offer.offerer))
        if not self.jobs.has_room(job):
            raise Rejected(Reason.BUSY, self._no_room(job))
        if not self._replays.has_room(offer.offerer):
            raise Rejected(Reason.BUSY, "the replay memory is full: refusing rather than forgetting an unexpired id")
        # Rate limited by offerer: the identity the signature proves, whichever peer forwarded the bytes. Last, so
        # that a refusal above costs the offerer none of its budget.
        if not self._rates.allow(offer.offerer, self._monotonic()):
            raise Rejected(Reason.RATE_LIMITED, "this offerer is over its rate")
        self.jobs.put(job)
        self._pending[(offer.offerer, offer.offer_id)] = job
        self._replays.spend(offer.offerer, offer.offer_id, offer.expires_at_ms + self.policy.clock.max_skew_ms + 1)
        return received

    def _check_audience(self, offer: TaskOffer, delivery: Delivery) -> None:
        """A v2 offer runs only where its signed audience says: what stops one sent to one node, or claimed over
        gossip, from being replayed to others directly. A v1 offer names no audience and is taken on any route."""
        audience = offer.audience
        if audience is None:
            return
        if audience.to is not None:
            if not delivery.direct:
                raise Rejected(
                    Reason.WRONG_AUDIENCE, f"an offer sent directly to one node arrived by {delivery.transport}"
                )
            if audience.to != self.peer_id:
                raise Rejected(Reason.WRONG_AUDIENCE, f"the offer was sent to {audience.to}, not to this node")
            return
        if delivery.direct:
            raise Rejected(
                Reason.WRONG_AUDIENCE,
                "a claimed offer arrived on a direct stream: it runs only where its offerer grants a claim",
            )
        if audience.invited and self.peer_id not in audience.invited:
            raise Rejected(Reason.NOT_INVITED, f"the offer invites {len(audience.invited)} other node(s) to claim it")

    def _no_room(self, job: Job) -> str:
        """Why a busy refusal: the offerer's own budget, its class's share, or the whole queue."""
        queue = self.jobs.classes
        lane = queue.established if job.established else queue.fresh
        if queue.held(job.offerer) >= queue.established.per_lane or lane.held(job.offerer) >= lane.per_lane:
            return (
                f"this offerer has {queue.held(job.offerer)} offers unfinished here, its most; send more as they finish"
            )
        if len(queue) < queue.capacity:
            return "new offerers' share of the queue is full; offerers this node has served keep theirs"
        return "the intake queue is full"

    def _refuse(self, transport: str, rejection: Rejection) -> Rejection:
        self.rejected[(transport, str(rejection.reason))] += 1
        self.metrics.offer_rejected(transport, str(rejection.reason))
        return rejection
