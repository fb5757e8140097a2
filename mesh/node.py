"""The node's lifecycle: one nursery owns the executor, the gate, the transports and the workers.

The data path is a straight line: a transport turns bytes into a `Delivery`, the `Intake` admits it as remote work,
a worker claims it (gossip and BLE), the executor runs it in Docker under the operator's policy, and the worker
signs the result and hands it back to the transport that brought the offer.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import platform
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog
import trio

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus

    from executor.runner import Executor
    from transports.ble import BleTransport
    from transports.ble.transport import BleRadio

from mesh.claims import ClaimDesk
from mesh.gate import SandboxGate
from mesh.intake import Intake
from mesh.invitations import near_sample
from mesh.jobcancel import RunnerCancels
from mesh.metrics import NodeMetrics
from mesh.node_config import NodeConfig as NodeConfig
from mesh.node_config import SharedSandbox as SharedSandbox
from mesh.offerer import Offerer
from mesh.peers import PeerDirectory
from mesh.state import StateDir
from mesh.status import JobLog
from mesh.worker import Runner
from transports.addrwatch import AddressWatcher
from transports.base import Service, Transport
from transports.bootstrap import Bootstrapper
from transports.connmgr import ConnectionManager
from transports.direct import DirectTransport
from transports.gossip import GossipTransport
from transports.mdns import LanDiscovery
from transports.p2p import P2PHost, open_host
from transports.presence import Presence
from transports.relay import Relay
from transports.rendezvous import Rendezvous
from transports.wire.identity import public_key_of_peer_id
from transports.wire.needs import Capabilities

log = structlog.get_logger("edgecoder.node")

# How many run offer ids `MeshNode.ran` keeps.
RAN_HISTORY = 10_000
# How often the node looks whether a runtime's image was built or removed under it.
RUNTIMES_REFRESH_S = 60.0


class MeshNode(Runner):
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
            capabilities=self.capabilities,
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
        # The runner's side of a signed cancel (mesh/jobcancel.py): a job queued here is answered at once.
        self.cancels = RunnerCancels(self.intake, self._reply, on_cancel=self.metrics.cancelled.inc)
        self.direct = DirectTransport(
            p2p,
            self.desk,
            status=self.heartbeat,
            abort=self._abort_from_peer,
            presence=self.peers.observe,
            cancel=self.cancels.cancel,
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
        # The offerer's side (mesh/offerer.py): this node's own offers, direct or through the mesh.
        self.offerer = Offerer(
            config.identity,
            p2p,
            self.peers,
            self.desk,
            self.direct,
            self.gossip,
            invitees=config.invitees,
            invite_window_s=config.invite_window_s,
            claim_redundancy=config.claim_redundancy,
            seal_gossip=config.seal_gossip,
        )
        # The offerer's calls, as the node's own: `node.offer_gossip(...)` is `node.offerer.offer_gossip(...)`.
        self.wait_for_runner = self.offerer.wait_for_runner
        self.runner_candidates = self.offerer.runner_candidates
        self.make_offer = self.offerer.make_offer
        self.sealed_direct = self.offerer.sealed_direct
        self.offer_direct = self.offerer.offer_direct
        self.cancel = self.offerer.cancel
        self.offer_gossip = self.offerer.offer_gossip
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
        if self.executor is not None:
            # Before any transport: the first heartbeat already names the runtimes built here.
            await self.executor.refresh_runtimes()
            self._nursery.start_soon(self._follow_runtimes)
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
        if self.executor is not None:
            await self.executor.refresh_runtimes()  # an operator who fixed the sandbox may have built images too
        self.presence.changed()

    async def _follow_runtimes(self) -> None:
        """Peers learn when a runtime is built (or its image removed) while the node runs."""
        assert self.executor is not None
        while True:
            await trio.sleep(RUNTIMES_REFRESH_S)
            before = self.executor.built_runtimes
            if await self.executor.refresh_runtimes() != before:
                self.presence.changed()

    def capabilities(self) -> Capabilities | None:
        """The runtimes built here and what one run may have (executor/runtimes.py, transports/wire/needs.py);
        None without an executor."""
        if self.executor is None:
            return None
        policy = self.executor.policy
        return Capabilities(
            {name: info.digest for name, info in self.executor.built_runtimes.items()},
            # What one run can have: the operator's ceilings, and never more cores than the machine has.
            cores=max(1, min(os.cpu_count() or 1, math.floor(policy.max_cpus))),
            memory_mb=policy.max_memory_mb,
            arch=platform.machine(),
            gpu="none",  # no sandbox tier passes a GPU through (no device ever enters a container)
        )

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
            **({"capabilities": caps.to_json()} if (caps := self.capabilities()) is not None else {}),
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

    def _abort_from_peer(self, sender: str, offer_id: bytes) -> bool:
        """An abort that arrived over the abort protocol: only the offer's own offerer may send it."""
        try:
            offerer = public_key_of_peer_id(sender)
        except ValueError:
            return False
        return self.intake.abort(offerer, offer_id)
