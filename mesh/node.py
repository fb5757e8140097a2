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
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
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
from mesh.claims import ClaimDesk, ClaimJob, PostedOffer
from mesh.gate import SandboxGate, SandboxMode
from mesh.intake import Intake, IntakePolicy, Job
from mesh.invitations import INVITEES, Candidate, candidates, choose_invitees, near_sample
from mesh.metrics import NodeMetrics
from mesh.peers import PeerDirectory
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
from transports.presence import Presence
from transports.relay import Relay, ReserveMode
from transports.rendezvous import Rendezvous
from transports.wire.identity import NodeIdentity, public_key_of_peer_id
from transports.wire.offers import (
    MAX_REPLY_ADDRS,
    OFFER_ID_SIZE,
    Audience,
    TaskOffer,
    TaskResult,
    now_ms,
    open_result,
    parse_offer,
    result_digest,
)
from transports.wire.peerid import ed25519_peer_id
from transports.wire.reasons import Reason, Rejected, Rejection

log = structlog.get_logger("edgecoder.node")

# How many run offer ids `MeshNode.ran` keeps.
RAN_HISTORY = 10_000
# Runners one gossip offer may invite over its issues when nobody claims in time: with `invitees` per issue, at most
# this many claim requests reach the offerer for it (a lapsed claim may still invite beyond, so as not to lose it).
MAX_INVITED = 8


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
    # Presence travels between neighbours only (transports.presence): a node pushes its status to each neighbour
    # when it changes materially, and every `heartbeat_interval` seconds anyway, so that a lost push is repaired.
    heartbeat_interval: float = 30.0
    # How many runners an offerer invites to claim each issue of a gossip offer (mesh.invitations), and how long
    # it waits for one of them to claim before it invites others.
    invitees: int = INVITEES
    invite_window_s: float = 1.0
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
    # The isolation tiers the node offers (`executor.isolation`: runc, gvisor or runc,gvisor; executor/backends/):
    # they replace the executor policy's. None: the policy's own.
    isolation: str | None = None
    # An executor and its running gate, opened by the caller and shared by many nodes of one process (simulations
    # of hundreds of nodes on two cores, where each node opening its own Docker executor and canary would measure
    # dockerd instead of the mesh). Real runs, real gate; the caller owns both. None: the node opens its own.
    shared_sandbox: SharedSandbox | None = None
    # py-libp2p's GossipSub v2 features (`transports.gossip.GossipRouter`): adaptive gossip off (it stretches the
    # heartbeat to 30-60 s in a small mesh), eclipse protection at upstream's default. Simulations switch them.
    adaptive_gossip: bool = False
    eclipse_protection: bool = True

    @property
    def mdns_enabled(self) -> bool:
        """mDNS as asked (`--mdns`/`--no-mdns`), else on exactly when the node listens beyond loopback: on
        loopback alone nobody else could hear it."""
        return self.mdns if self.mdns is not None else listens_beyond_loopback(self.listen)


@dataclass(frozen=True, slots=True)
class SharedSandbox:
    executor: Executor
    gate: SandboxGate


@dataclass(frozen=True, slots=True)
class OfferOutcome:
    """What an offerer learns: a verified result, or a typed refusal."""

    result: TaskResult | None = None
    refusal: Rejection | None = None
    # Gossip only: claim requests the offerer received for this work over all its issues, those it refused (it was
    # already claimed, the claimant was not invited or cannot sandbox), and how many issues it took.
    claims_refused: int = 0
    claim_requests: int = 0
    issues: int = 0
    # Gossip with replicas: every runner's verified result (the first is `result`), all agreeing when `result` is set.
    replicas: tuple[TaskResult, ...] = ()

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
        shared = config.shared_sandbox if config.sandbox_mode == "docker" else None
        self.gate = shared.gate if shared else SandboxGate(config.sandbox_mode, executor, interval=config.gate_interval)
        self.intake = Intake(
            config.intake_policy,
            participating=lambda: self.gate.participating,
            metrics=self.metrics,
            replay_journal=None if state is None else state.replay_journal,
            peer_id=config.identity.peer_id,
            tiers=self.isolation_tiers,
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
        self.direct = DirectTransport(
            p2p, self.desk, status=self.heartbeat, abort=self._abort_from_peer, presence=self.peers.observe
        )
        self.gossip = GossipTransport(
            p2p,
            self.direct,
            validate=self.intake.validate,
            forward_offers=config.forward_offers,
            adaptive_gossip=config.adaptive_gossip,
            eclipse_protection=config.eclipse_protection,
        )
        self.presence = Presence(p2p, self.direct, self.peers, self.heartbeat, refresh_every=config.heartbeat_interval)
        # Raises AddressError for a bad bootstrap address, before anything runs.
        self.bootstrap = Bootstrapper(p2p, config.peers)
        self.addresses = AddressWatcher(p2p)
        self.relay = Relay(p2p, relays=config.peers, serve=config.relay_service, reserve=config.relay_reserve)
        self.connections = ConnectionManager(
            p2p,
            low=config.connections_low,
            high=config.connections_high,
            protected=self._protected_peers,
            valued=self._established_peer,
        )
        p2p.value_peers(self._established_peer, self._protected_peers)
        self.rendezvous = Rendezvous(
            p2p,
            seeds=self.bootstrap.connected,
            on_found=lambda peer, addrs: self.connections.discovered(peer, addrs, "rendezvous"),
            register=config.advertise,
        )
        # Everything that runs beside the workers, in the order it starts: offers are served (direct first, so that
        # a peer's first stream finds its handler) and circuits can be dialled before any peer is dialled.
        self.transports: list[Transport] = [self.direct, self.gossip, *config.transports]
        self.services: list[Service] = [
            self.presence,
            self.addresses,
            self.relay,
            self.bootstrap,
            self.connections,
            self.rendezvous,
        ]
        if config.mdns_enabled:
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
            if config.sandbox_mode == "docker" and config.shared_sandbox is not None:
                executor = config.shared_sandbox.executor
            elif config.sandbox_mode == "docker":
                from executor.backends import parse_tiers
                from executor.runner import Executor

                policy = config.executor_policy
                if config.isolation is not None:
                    policy = dataclasses.replace(policy, isolation=parse_tiers(config.isolation))
                executor = await stack.enter_async_context(
                    Executor.open(
                        policy,
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
        if self.config.shared_sandbox is None or self.config.sandbox_mode != "docker":
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
        self.presence.changed()

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

    def isolation_tiers(self) -> frozenset[str]:
        """The sandbox tiers this node runs offers under right now: those whose checks and canary passed at the
        gate's last look (executor/canary.py), none while its gate is closed."""
        return self.gate.tiers if self.gate.participating else frozenset()

    def heartbeat(self) -> dict[str, Any]:
        """This node's status as its neighbours hear it (pushed on change, asked on connect, sent with a claim)."""
        stats = self.executor.stats() if self.executor is not None else None
        free = 0 if stats is None or not self.gate.participating else max(0, stats.free_slots)
        return {
            "peerId": self.identity.peer_id,
            "sandboxMode": self.gate.reported_mode,
            "freeSlots": free,
            "languages": sorted(self.config.intake_policy.languages),
            "isolation": sorted(self.isolation_tiers()),
            "addrs": list(self.p2p.addrs[:8]),
            "near": [n.to_wire() for n in near_sample(self.peers, self.identity.peer_id)],
        }

    @property
    def addrs(self) -> list[str]:
        return list(self.p2p.addrs)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def _protected_peers(self) -> set[str]:
        """Peers whose connection is never closed to trim or to make room: bootstrap peers, relays we hold a
        reservation on, and peers with an exchange in progress."""
        return {p.peer_id for p in self.bootstrap.peers} | set(self.relay.reserved) | self.direct.peers_in_flight()

    def _established_peer(self, peer_id: str) -> bool:
        """A peer whose key is an offerer this node has served (or trusts): trimmed only after every stranger."""
        try:
            return self.intake.standing.established(public_key_of_peer_id(peer_id))
        except ValueError:  # a PeerID of another key type: never an offerer this node served
            return False

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
        answer = TaskResult.answering(offer, job.received.digest, self.identity.public_key, result)
        signed = answer.sign(self.identity)
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
            request,
            sandbox=offer.sandbox,
            origin=job.origin,
            min_isolation=offer.min_isolation,
            spare_warm=self.intake.spare_warm(job),
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
        """Wait until a runner is known (a neighbour's status, or one a neighbour reports) and some peer takes
        offers on the topic (known at once on connect). Publishing before that would reach nobody."""
        with trio.move_on_after(timeout):
            while not (self.gossip.offer_subscribers() and self.runner_candidates(language=None, min_isolation=None)):
                await trio.sleep(0.05)
            return True
        return False

    def runner_candidates(self, *, language: str | None, min_isolation: str | None) -> list[Candidate]:
        return candidates(self.peers, language=language, min_isolation=min_isolation, me=self.identity.peer_id)

    def make_offer(self, *, to: str | None = None, invite: Sequence[str] = (), **fields: Any) -> bytes:
        """A signed offer from this node, replying to its own addresses.

        `to` (a PeerID, or a multiaddr ending in /p2p/<PeerID>) makes it a direct offer that only that node runs;
        otherwise it is claimed, by `invite`d PeerIDs only when given.
        """
        # What peers can reach: announced, expanded and relayed addresses, direct ones first.
        fields.setdefault("reply_to", tuple(self.p2p.addrs[:MAX_REPLY_ADDRS]))
        if to is not None:
            fields["audience"] = Audience.direct(to.rsplit("/p2p/", 1)[-1])
        elif invite:
            fields["audience"] = Audience.claimed(list(invite))
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

    async def offer_gossip(self, raw: bytes, *, timeout: float = 30.0, replicas: int | None = None) -> OfferOutcome:
        """Publish, let exactly one invited runner run it (or `replicas` distinct ones), and wait for the verified
        result.

        With `replicas` k > 1 (default `claim_redundancy`), k distinct runners each run it and the result counts only
        when all k agree on what the program did (`result_digest`); otherwise the refusal is `results_disagree`.
        A single claimant can sign any result it likes; k agreeing ones cost a liar k keys among our invitees.

        Our own offer with an open audience gets invitees: each issue names up to `invitees` runners from the
        presence this node knows (`mesh.invitations`), and every other node refuses it at once. When none of them
        claims within `invite_window_s`, the work is re-issued under a fresh id to runners not yet invited (up to
        `MAX_INVITED` in all); when a granted claim lapses without a result, its claimant gets a strike and the work
        is re-issued to others (or, when nobody else is known, to those known again). The issues share one claim
        job, so it still runs once, and a late result for an earlier issue still counts. An offer that already names
        its invitees, or is not ours, is published as it is (and re-issued only after a lapse, if ours). However
        this ends, every claimant still holding a claim without having delivered is told to abort, and the issues
        leave the claim desk.
        """
        deadline = trio.current_time() + timeout
        job = ClaimJob(redundancy=max(1, replicas or self.config.claim_redundancy))
        issues: list[PostedOffer] = []
        invited: list[str] = []
        received = parse_offer(raw)
        offer = received.offer
        ours = offer.offerer == self.identity.public_key
        inviting = ours and offer.audience is not None and offer.audience.to is None and not offer.audience.invited
        replicas = job.redundancy
        invitees = self._fresh_invitees(offer, invited, replicas=replicas) if inviting else []
        try:
            while True:
                if invitees or (issues and ours):
                    # No runner known on the first issue: it goes out open (anyone may claim), as published.
                    keep = not inviting
                    raw = self._reissue(offer, invitees, fresh_id=bool(issues), keep_audience=keep)
                    received = parse_offer(raw)
                    invited += [p for p in invitees if p not in invited]
                issues.append(self.desk.post(received, job))
                refusal = await self.gossip.publish_offer(raw)
                if refusal is not None:
                    return OfferOutcome(refusal=refusal)
                invitees, lapsed = await self._await_claim(job, offer, invited, deadline, inviting=inviting)
                if job.complete:
                    return self._agreed(job, issues)
                if trio.current_time() >= deadline or not ours:
                    why = "claims lapsed without a result" if lapsed else "no result in time"
                    return self._outcome(job, issues, refusal=Rejection(Reason.TIMEOUT, why))
                if lapsed:
                    log.info("re-offering after a lapsed claim", offer=received.offer.offer_id.hex())
                    if inviting:
                        invitees = self._fresh_invitees(offer, invited, replicas=replicas) or self._fresh_invitees(
                            offer, job.struck, replicas=replicas
                        )
        finally:
            with trio.CancelScope(shield=True):
                await self._abort_undelivered(job)
            for issue in issues:
                self.desk.withdraw(issue.received.offer.offer_id)

    async def _await_claim(
        self, job: ClaimJob, offer: TaskOffer, invited: list[str], deadline: float, *, inviting: bool
    ) -> tuple[list[str], bool]:
        """Wait for this issue: until a result, the deadline, a claim lapsing (True), or, while inviting, the invite
        window passing with nobody claiming and someone new to invite (their PeerIDs).

        A lapse counts once: `desk.lapsed` sets the lapsed grants aside as it reports them, so the new issue waits
        for its own claim instead of being re-published at every poll."""
        window = trio.current_time() + self.config.invite_window_s
        while trio.current_time() < deadline and not job.complete:
            if self.desk.lapsed(job):
                return [], True
            if inviting and trio.current_time() >= window and not self.desk.claimed(job):
                window = trio.current_time() + self.config.invite_window_s
                more = (
                    self._fresh_invitees(offer, invited, replicas=job.redundancy) if len(invited) < MAX_INVITED else []
                )
                if more:
                    return more, False
            with trio.move_on_after(0.05):
                await job.done.wait()
        return [], False

    def _fresh_invitees(self, offer: TaskOffer, exclude: Collection[str], *, replicas: int = 1) -> list[str]:
        """Runners for this offer, best first (`choose_invitees`), none of `exclude`: `invitees` of them, and, for
        k > 1 replicas, at least one more than k (a spare, so that one slow invitee does not cost an invite window)."""
        found = self.runner_candidates(language=offer.language, min_isolation=offer.min_isolation)
        k = self.config.invitees if replicas <= 1 else max(self.config.invitees, replicas + 1)
        return choose_invitees(found, strikes=self.desk.strikes.__getitem__, exclude=exclude, k=k)

    def _agreed(self, job: ClaimJob, issues: list[PostedOffer]) -> OfferOutcome:
        """The first result, when every replica's says the same; `results_disagree` otherwise."""
        digests = {result_digest(r.result) for r in job.results}
        if len(digests) == 1:
            return self._outcome(job, issues, result=job.results[0])
        why = f"{len(job.results)} runners ran it and reported {len(digests)} different results"
        return self._outcome(job, issues, refusal=Rejection(Reason.RESULTS_DISAGREE, why))

    @staticmethod
    def _outcome(
        job: ClaimJob, issues: list[PostedOffer], *, result: TaskResult | None = None, refusal: Rejection | None = None
    ) -> OfferOutcome:
        return OfferOutcome(
            result=result,
            refusal=refusal,
            claims_refused=job.refused,
            claim_requests=job.requests,
            issues=len(issues),
            replicas=tuple(job.results),
        )

    async def _abort_undelivered(self, job: ClaimJob) -> None:
        """Tell each claimant that holds a claim and delivered nothing to stop: nobody waits for its result now."""
        targets = self.desk.undelivered(job)
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

    def _reissue(
        self, offer: TaskOffer, invitees: Sequence[str], *, fresh_id: bool, keep_audience: bool = False
    ) -> bytes:
        """The same work for other invitees (open when none): under a new id and a fresh lifetime once an issue has
        been published, since every node that admitted the old id keeps it spent."""
        changes: dict[str, Any] = {}
        if not keep_audience:
            changes["audience"] = Audience.claimed(list(invitees))
        if fresh_id:
            issued = now_ms()
            changes.update(
                offer_id=os.urandom(OFFER_ID_SIZE),
                issued_at_ms=issued,
                expires_at_ms=issued + (offer.expires_at_ms - offer.issued_at_ms),
            )
        return dataclasses.replace(offer, **changes).sign(self.identity)
