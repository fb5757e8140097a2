"""The node's lifecycle: one nursery owns the executor, the gate, the transports and the workers.

The data path is a straight line: a transport turns bytes into a `Delivery`, the `Intake` admits it as remote work,
a worker claims it (gossip and BLE), the executor runs it in Docker under the operator's policy, and the worker
signs the result and hands it back to the transport that brought the offer.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus

    from executor.runner import Executor
    from transports.ble import BleTransport
    from transports.ble.transport import BleRadio

from executor.contract import ErrorKind, ExecRequest, ExecResult, QueueReason, refusal
from executor.policy import ExecutorPolicy
from mesh.claims import ClaimDesk, PostedOffer
from mesh.gate import SandboxGate, SandboxMode
from mesh.identity import NodeIdentity, public_key_of_peer_id
from mesh.intake import Intake, IntakePolicy, Job
from mesh.metrics import NodeMetrics
from mesh.offers import MAX_REPLY_ADDRS, OFFER_ID_SIZE, TaskOffer, TaskResult, now_ms, open_result, parse_offer
from mesh.peerid import ed25519_peer_id
from mesh.peers import PeerDirectory
from mesh.reasons import Reason, Rejected, Rejection
from mesh.state import StateDir
from mesh.status import JobLog
from transports.addrwatch import AddressWatcher
from transports.base import Service, Transport
from transports.bootstrap import Bootstrapper
from transports.connmgr import ConnectionManager
from transports.direct import ABORT_SEND_TIMEOUT, DirectTransport
from transports.gossip import GossipTransport
from transports.hardening import Defences
from transports.mdns import LanDiscovery
from transports.p2p import P2PHost, listens_beyond_loopback, open_host
from transports.relay import Relay, ReserveMode
from transports.rendezvous import Rendezvous

log = structlog.get_logger("edgecoder.node")

# How many run offer ids `MeshNode.ran` keeps.
RAN_HISTORY = 10_000


@dataclass
class NodeConfig:
    identity: NodeIdentity
    listen: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",)
    # Addresses to tell peers instead of the listen addresses (a NAT's port mapping, a DNS name).
    announce: Sequence[str] = ()
    peers: Sequence[str] = ()
    sandbox_mode: SandboxMode = "docker"
    executor_policy: ExecutorPolicy = field(default_factory=ExecutorPolicy.from_env)
    intake_policy: IntakePolicy = field(default_factory=IntakePolicy)
    # Every heartbeat is flooded to the whole mesh, so the mesh carries N² x degree / interval of them, and py-libp2p
    # spends 3-4 ms of CPU per message received: at 1 s one process saturates near a dozen nodes, at 5 s two cores
    # near two dozen. Heartbeats are for presence and capacity; a change of sandbox mode is announced at once
    # (`beat_now`), and an offerer that has no fresh heartbeat of a claimant asks the claimant directly.
    heartbeat_interval: float = 15.0
    gate_interval: float = 5.0
    claim_redundancy: int = 1
    # How long past the offer's own timeout a claim may go without a result before it lapses.
    claim_lease_margin_s: float = 15.0
    # Labels this node's containers, so a restart sweeps what a crash left behind. The PeerID by default: a node
    # restarted with the same key file finds its own leftovers.
    node_label: str | None = None
    # Extra keyword arguments for the executor (tests point it at another daemon socket, for instance).
    executor_options: dict[str, Any] = field(default_factory=dict)
    # Where the node keeps its state (a directory per PeerID, locked while it runs: one node per key) and its replay
    # journal, so that an offer id spent before a restart stays spent. None: no lock, replay memory in RAM only
    # (tests and simulations, which run many nodes in one process).
    state_root: Path | None = None
    # More ways offers reach this node, beside its direct streams and gossip: a coordinator's /pull, BLE. Each is
    # started with the others (`Transport.run(sink)`) and stopped with them.
    transports: Sequence[Transport] = ()
    # The swarm: mDNS on the LAN (None: on when the node listens on a non-loopback address), serving as a relay
    # for others, reserving on relays among the bootstrap peers ("auto": when identify shows a NAT in between),
    # advertising this node at the seeds' rendezvous (a one-shot offerer does not), and the connection watermarks.
    mdns: bool | None = None
    relay_service: bool = False
    relay_reserve: ReserveMode = "auto"
    advertise: bool = True
    # In the offers mesh, relaying offers for others (every node); False for a one-shot offerer, which only
    # publishes (through a fanout) and is gone once it has its result.
    forward_offers: bool = True
    connections_low: int = 4
    connections_high: int = 32
    # What peers can make the host hold (connections per source, handshakes, streams, windows): see
    # transports/hardening. None is the defaults; simulations with many nodes behind one address raise them.
    defences: Defences | None = None
    # The sandbox runtime (issue 14): runc (hardened) until the gVisor tier lands.
    isolation: str = "runc"


@dataclass(frozen=True, slots=True)
class OfferOutcome:
    """What an offerer learns: a verified result, or a typed refusal."""

    result: TaskResult | None = None
    refusal: Rejection | None = None
    # Gossip only: claim requests the offerer refused for this offer (it was already claimed, or the claimant
    # cannot sandbox), over every attempt.
    claims_refused: int = 0

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.result.ok


class MeshNode:
    def __init__(
        self,
        config: NodeConfig,
        nursery: trio.Nursery,
        p2p: P2PHost,
        executor: Executor | None,
        state: StateDir | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self.config = config
        self.identity = config.identity
        self.metrics = metrics or NodeMetrics()
        self.peers = PeerDirectory(stale_after=3.5 * config.heartbeat_interval)
        self.gate = SandboxGate(config.sandbox_mode, executor, interval=config.gate_interval)
        self.intake = Intake(
            config.intake_policy,
            participating=lambda: self.gate.participating,
            metrics=self.metrics,
            replay_journal=None if state is None else state.replay_journal,
            standing_journal=None if state is None else state.standing_journal,
            workers=config.executor_policy.max_concurrent if executor is not None else 0,
        )
        self.metrics.participating.set_function(lambda: float(self.gate.participating))
        self.metrics.queue_depth.set_function(lambda: float(self.intake.queue_depth))
        self.metrics.peers_connected.set_function(lambda: float(len(p2p.connected_peers())))
        if executor is not None:
            self.metrics.pool_ready.set_function(lambda: float(executor.stats().pool_ready))
            self.metrics.runs_in_flight.set_function(lambda: float(executor.stats().runs_in_flight))
        self.desk = ClaimDesk(
            self.peers,
            redundancy=config.claim_redundancy,
            lease_margin_s=config.claim_lease_margin_s,
            ask_status=lambda peer: self.direct.request_status(peer),
        )
        self.executor = executor
        self.p2p = p2p
        self.direct = DirectTransport(p2p, self.desk, status=self.heartbeat, abort=self._abort_from_peer)
        self.gossip = GossipTransport(
            p2p,
            self.direct,
            validate=self.intake.validate,
            heartbeat=self.heartbeat,
            on_heartbeat=self.peers.observe,
            heartbeat_interval=config.heartbeat_interval,
            forward_offers=config.forward_offers,
        )
        # Raises AddressError for a bad bootstrap address, before anything runs.
        self.bootstrap = Bootstrapper(p2p, config.peers)
        self.addresses = AddressWatcher(p2p)
        self.relay = Relay(p2p, relays=config.peers, serve=config.relay_service, reserve=config.relay_reserve)
        self.connections = ConnectionManager(
            p2p,
            low=config.connections_low,
            high=config.connections_high,
            protected=lambda: {p.peer_id for p in self.bootstrap.peers} | set(self.relay.reserved),
        )
        self.rendezvous = Rendezvous(
            p2p,
            seeds=self.bootstrap.connected,
            on_found=lambda peer, addrs: self.connections.discovered(peer, addrs, "rendezvous"),
            register=config.advertise,
        )
        # Everything that runs beside the workers, in the order it starts: offers are served (direct first, so that
        # a peer's first stream finds its handler) and circuits can be dialled before any peer is dialled.
        self.transports: list[Transport] = [self.direct, self.gossip, *config.transports]
        self.services: list[Service] = [self.addresses, self.relay, self.bootstrap, self.connections, self.rendezvous]
        if config.mdns if config.mdns is not None else listens_beyond_loopback(config.listen):
            self.services.append(
                LanDiscovery(p2p, lambda peer, addrs: self.connections.discovered(peer, addrs, "mdns", eager=True))
            )
        self._nursery = nursery
        self._draining = False
        self._workers_left = 0
        self._workers_done = trio.Event()
        # Offer ids whose code this node ran in a container, newest last, for tests, simulations and `jobs`; bounded.
        self.ran: collections.deque[bytes] = collections.deque(maxlen=RAN_HISTORY)
        # The jobs in the workers' hands and the last ones answered, for `/status` and `edgecoder jobs`.
        self.job_log = JobLog()

    # -- lifecycle ---------------------------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, config: NodeConfig) -> AsyncIterator[MeshNode]:
        async with contextlib.AsyncExitStack() as stack:
            state = None
            if config.state_root is not None:
                state = stack.enter_context(StateDir.locked(config.state_root, config.identity.peer_id))
            executor = None
            if config.sandbox_mode == "docker":
                from executor.runner import Executor

                executor = await stack.enter_async_context(
                    Executor.open(
                        config.executor_policy,
                        node_label=config.node_label or config.identity.peer_id,
                        **config.executor_options,
                    )
                )
            # Built before the host, so that the host's refusals (per-source caps, window violations) are counted
            # from its first connection.
            metrics = NodeMetrics()
            p2p = await stack.enter_async_context(
                open_host(
                    config.identity,
                    config.listen,
                    announce=config.announce,
                    defences=config.defences,
                    on_refusal=metrics.connection_refused,
                )
            )
            nursery = await stack.enter_async_context(trio.open_nursery())
            node = cls(config, nursery, p2p, executor, state, metrics)
            await node._start()
            try:
                yield node
            finally:
                node.intake.close()
                nursery.cancel_scope.cancel()

    async def _start(self) -> None:
        # The gate's first verdict comes before any transport opens, so a node that cannot sandbox never
        # subscribes to offers, not even for a moment.
        await self._nursery.start(self.gate.run)
        self.gate.on_change(self._follow_gate)
        for transport in self.transports:
            await self._nursery.start(transport.run, self.intake)
        for service in self.services:
            await self._nursery.start(service.run)
        workers = self.config.executor_policy.max_concurrent if self.executor is not None else 0
        self._workers_left = workers
        for _ in range(workers):
            self._nursery.start_soon(self._work)
        if not workers:
            self._workers_done.set()

    async def _follow_gate(self, participating: bool) -> None:
        """Peers learn at once when this node starts or stops taking offers. The transports follow the intake's
        `participating` by themselves: gossip still forwards offers but hands none to the intake, BLE stops
        scanning, the coordinator stops pulling, and direct offers are refused."""
        self.gossip.beat_now()

    async def run_ble(
        self,
        radio: BleRadio | None = None,
        *,
        task_status: TaskStatus[BleTransport] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Take offers from nearby BLE peers on `radio` too, started after the node (the demo and simulations add
        a radio to a running node; `NodeConfig.transports` is the way to start one with it)."""
        from transports.ble import BleRadioTransport  # bleak and bumble cost half a second: only for BLE nodes

        await BleRadioTransport(radio, self.identity).run(self.intake, task_status=task_status)

    def heartbeat(self) -> dict[str, Any]:
        stats = self.executor.stats() if self.executor is not None else None
        free = 0 if stats is None or not self.gate.participating else max(0, stats.free_slots)
        return {
            "peerId": self.identity.peer_id,
            "sandboxMode": self.gate.reported_mode,
            "freeSlots": free,
            "languages": sorted(self.config.intake_policy.languages),
            "addrs": list(self.p2p.addrs),
        }

    @property
    def addrs(self) -> list[str]:
        return list(self.p2p.addrs)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    # -- the worker: claim, run, sign, reply -------------------------------------------------------------------

    async def _work(self) -> None:
        try:
            async for job in self.intake.jobs:
                await self._handle_guarded(job)
        finally:
            self._workers_left -= 1
            if self._workers_left == 0:
                self._workers_done.set()

    async def drain(self, grace: float = 5.0) -> None:
        """Shut down gracefully: take no more offers, abort the runs in flight, and give the workers `grace`
        seconds to send each offerer its signed `aborted` result. Leaving `open` afterwards removes every container.
        """
        self._draining = True
        self.intake.close()  # the workers finish the queue (answering `aborted`) and then stop
        if self.executor is not None:
            self.executor.abort_all()
        with trio.move_on_after(grace):
            await self._workers_done.wait()

    async def _handle_guarded(self, job: Job) -> None:
        """The error boundary of one job: whatever goes wrong is this offer's failure, never the node's.

        It is logged with the offer id, counted, and answered with a signed `execution-failed` result (unless an
        answer already went out); the worker then takes the next job. Cancellation is not caught here: the node's
        own shutdown still stops the worker.
        """
        offer = job.received.offer
        answered = False
        record = self.job_log.taken(job)

        async def answer(result: ExecResult) -> None:
            nonlocal answered
            answered = True
            self.job_log.answered(record, result)
            await self._reply(job, result)

        try:
            await self._handle(job, answer)
        except Exception as exc:
            self.metrics.job_failures.inc()
            log.exception("job failed", offer=offer.offer_id.hex(), transport=job.delivery.transport)
            if not answered:
                failure = refusal(
                    f"the node failed while handling this offer ({type(exc).__name__})",
                    error_kind=ErrorKind.EXECUTION_FAILED,
                    queue_reason=QueueReason.NODE_ERROR,
                )
                try:
                    await self._reply(job, failure)
                except Exception:
                    log.exception("could not answer a failed job", offer=offer.offer_id.hex())
        finally:
            self.intake.finished(job)
            self.job_log.done(job, record, abandoned=job.delivery.scope.cancelled_caught)

    async def _handle(self, job: Job, answer: Callable[[ExecResult], Awaitable[None]]) -> None:
        offer = job.received.offer
        if self._draining:
            await answer(refusal("node shutting down", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED))
            return
        if not self.gate.participating:
            # Admitted before the gate closed: the offerer still gets a signed, typed answer.
            await answer(
                refusal(
                    "sandbox_unavailable",
                    error_kind=ErrorKind.SANDBOX_VIOLATION,
                    queue_reason=QueueReason.SANDBOX_UNAVAILABLE,
                )
            )
            return
        # The transport owns this scope and cancels it when the offerer stops waiting: the cancel reaches the
        # claim, or the container, which the executor then kills.
        granted = False
        result: ExecResult | None = None
        with job.delivery.scope:
            granted = await self._claim(job)
            if granted:
                self.job_log.running(job)
                result = await self._run(job)
        if job.delivery.scope.cancelled_caught:
            log.info("offer abandoned by its offerer", offer=offer.offer_id.hex(), claimed=granted)
            self.metrics.abandoned.inc()
            if not granted:
                return
            result = refusal(
                "the offerer stopped waiting", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED
            )
        if result is None:
            return  # the claim went to another node
        log.info(
            "offer answered",
            offer=offer.offer_id.hex(),
            offerer=ed25519_peer_id(offer.offerer),
            transport=job.delivery.transport,
            ok=result.ok,
            error_kind=result.error_kind and str(result.error_kind),
            queue_reason=result.queue_reason,
            duration_ms=result.duration_ms,
            waited_ms=round((time.monotonic() - job.admitted_at) * 1000) - result.duration_ms,
        )
        await answer(result)
        if result.exit_code is not None:
            self.intake.served(job)  # its code ran here and was answered: the offerer is known to this node now

    async def _claim(self, job: Job) -> bool:
        try:
            granted = await job.delivery.claim()
        except Exception as exc:  # a transport failure while claiming is the claim lost, not a crash
            log.warning("claim failed", offer=job.received.offer.offer_id.hex(), error=repr(exc))
            granted = False
        self.metrics.claims.labels("granted" if granted else "refused").inc()
        return granted

    async def _reply(self, job: Job, result: ExecResult) -> None:
        offer = job.received.offer
        signed = TaskResult(offer.offer_id, job.received.digest, self.identity.public_key, result).sign(self.identity)
        try:
            await job.delivery.reply(signed)
        except Exception as exc:  # the offerer went away; the result is lost to it, the node keeps serving
            log.warning("reply failed", offer=offer.offer_id.hex(), error=repr(exc))

    async def _run(self, job: Job) -> ExecResult:
        offer = job.received.offer
        assert self.executor is not None
        request = ExecRequest(language=offer.language, code=offer.code, input=offer.input, limits=offer.limits)
        # The origin is the intake's tag (always remote), never anything the offer says.
        # A fresh offerer's run leaves the last warm container to offerers this node knows (mesh/standing.py).
        result: ExecResult = await self.executor.run_code(
            request, sandbox=offer.sandbox, origin=job.origin, spare_warm=self.intake.spare_warm(job)
        )
        if result.exit_code is not None:  # a process ran; refusals (host, subset, busy) start nothing
            self.ran.append(offer.offer_id)
        self.metrics.results.labels(str(result.error_kind or "none"), str(result.queue_reason or "none")).inc()
        self.metrics.run_seconds.observe(result.duration_ms / 1000)
        if result.queue_for_cloud:
            self.metrics.fallbacks.inc()
        return result

    # -- the offerer's side ------------------------------------------------------------------------------------

    async def wait_for_runner(self, *, timeout: float) -> bool:
        """Wait until some peer takes offers: it is subscribed to the offers topic (known at once on connect), or
        its heartbeat says it can sandbox. Publishing before that would reach nobody."""
        with trio.move_on_after(timeout):
            while not self.gossip.offer_subscribers() and not any(
                h.sandbox_mode == "docker" for h in self.peers.fresh()
            ):
                await trio.sleep(0.05)
            return True
        return False

    def make_offer(self, **fields: Any) -> bytes:
        """A signed offer from this node, replying to its own listen addresses."""
        # What peers can reach: announced, expanded and relayed addresses, direct ones first.
        fields.setdefault("reply_to", tuple(self.p2p.addrs[:MAX_REPLY_ADDRS]))
        return TaskOffer.create(self.identity, **fields).sign(self.identity)

    async def offer_direct(self, peer: str, raw: bytes) -> OfferOutcome:
        """Send any bytes (tests send garbage on purpose) and verify whatever comes back."""
        answer = await self.direct.send_offer(peer, raw)
        if answer.refusal is not None or answer.result is None:
            return OfferOutcome(refusal=answer.refusal or Rejection(Reason.MALFORMED, "empty answer"))
        try:
            result = open_result(answer.result)
        except Rejected as rejected:
            return OfferOutcome(refusal=rejected.rejection)
        if result.offer_digest != hashlib.sha256(raw).digest():
            return OfferOutcome(refusal=Rejection(Reason.MALFORMED, "the result names another offer"))
        # The result must come from the peer we sent the offer to, when the address names it.
        if "/p2p/" in peer and result.executor != public_key_of_peer_id(peer.rsplit("/p2p/", 1)[1]):
            return OfferOutcome(refusal=Rejection(Reason.WRONG_EXECUTOR, "signed by another key than the peer's"))
        return OfferOutcome(result=result)

    async def offer_gossip(self, raw: bytes, *, timeout: float = 30.0) -> OfferOutcome:
        """Publish, let exactly one claimant run it, and wait for its verified result.

        A claim that lapses without a result (the claimant crashed, or lied) is re-offered under a fresh offer id,
        while time remains: the old id stays spent in every replay cache, so it cannot be run twice by accident.
        However this ends (a result, a timeout, the caller giving up), every claimant still holding a claim without
        having delivered is told to abort, and the offers leave the claim desk.
        """
        deadline = trio.current_time() + timeout
        attempts: list[PostedOffer] = []  # a late result for an earlier attempt still counts
        try:
            while True:
                received = parse_offer(raw)
                offer_id = received.offer.offer_id
                attempts.append(self.desk.post(received))
                refusal = await self.gossip.publish_offer(raw)
                if refusal is not None:
                    return OfferOutcome(refusal=refusal)
                while not self.desk.lapsed(offer_id) and trio.current_time() < deadline:
                    if any(a.results for a in attempts):
                        break
                    with trio.move_on_after(0.1):
                        await attempts[-1].done.wait()
                refused = sum(a.refused for a in attempts)
                for attempt in attempts:
                    if attempt.results:
                        return OfferOutcome(result=attempt.results[0], claims_refused=refused)
                lapsed = self.desk.lapsed(offer_id)
                if not lapsed or trio.current_time() >= deadline or received.offer.offerer != self.identity.public_key:
                    why = "claims lapsed without a result" if lapsed else "no result in time"
                    return OfferOutcome(refusal=Rejection(Reason.TIMEOUT, why), claims_refused=refused)
                log.info("re-offering after a lapsed claim", offer=offer_id.hex())
                raw = self._reissue(received.offer)
        finally:
            with trio.CancelScope(shield=True):
                await self._abort_undelivered(attempts)
            for attempt in attempts:
                self.desk.withdraw(attempt.received.offer.offer_id)

    async def _abort_undelivered(self, attempts: list[PostedOffer]) -> None:
        """Tell each claimant that holds a claim and delivered nothing to stop: nobody waits for its result now."""
        targets = [
            (claimant, attempt.received.offer.offer_id)
            for attempt in attempts
            for claimant in self.desk.undelivered_claimants(attempt)
        ]
        if not targets:
            return
        with trio.move_on_after(2 * ABORT_SEND_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for claimant, offer_id in targets:
                    nursery.start_soon(self.direct.send_abort, claimant, offer_id)

    def _abort_from_peer(self, sender: str, offer_id: bytes) -> bool:
        """An abort that arrived over the abort protocol: only the offer's own offerer may send it."""
        try:
            offerer = public_key_of_peer_id(sender)
        except ValueError:
            return False
        return self.intake.abort(offerer, offer_id)

    def _reissue(self, offer: TaskOffer) -> bytes:
        """The same work under a new id and a fresh lifetime."""
        issued = now_ms()
        fresh = dataclasses.replace(
            offer,
            offer_id=os.urandom(OFFER_ID_SIZE),
            issued_at_ms=issued,
            expires_at_ms=issued + (offer.expires_at_ms - offer.issued_at_ms),
        )
        return fresh.sign(self.identity)
