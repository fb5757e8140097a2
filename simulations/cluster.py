"""A cluster of real `MeshNode`s on loopback in one Trio process, each node killable and restartable on its own.

Roles (what a node is in a scenario, not a mode of the node itself):

- `runner`: `sandbox_mode="docker"`, a real node with the Docker executor; the only role that can run offers.
- `listener`: `sandbox_mode="none"`: like every node it relays and hears offers, without Docker, and takes none (its
  heartbeat says `none`, so it is never granted a claim either). Listeners let one machine measure gossip delivery
  over many more nodes than it could run containers for.
- `refuser`: a plain `SANDBOX_MODE=none` node, exactly as an operator would start it: the same as a listener, the
  name says which question a scenario asks of it.
- `offerer`: a plain `none` node that publishes offers and grants claims.

Each node lives in its own task under its own cancel scope: `kill` cancels that scope (the node's nursery, libp2p
host and executor all close as on a crash of that process, minus the OS reclaiming sockets), `restart` opens it again
with the same identity on the same port and dials its original peers.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import trio

from executor.backends import parse_tiers
from executor.policy import ExecutorPolicy
from mesh.node import MeshNode, NodeConfig
from transports.wire.identity import NodeIdentity

if TYPE_CHECKING:
    from trio_typing import TaskStatus

Role = Literal["runner", "listener", "refuser", "offerer", "hostile"]
OnOpen = Callable[["SimNode", MeshNode], None]


def lineup(*groups: tuple[Role, int]) -> list[Role]:
    """`lineup(("runner", 2), ("offerer", 1))`: the roles a scenario starts, in order.

    mypy types `["runner"] * n + [...]` as `list[str]`, not as a list of roles; this keeps the literals."""
    return [role for role, count in groups for _ in range(max(0, count))]


# Each new node dials this many earlier nodes: a connected graph with ~2x this many connections per node, enough for
# GossipSub's degree (D=6, D_low=4) to be met from the node's own connections.
DIALS_PER_NODE = 3


def runner_policy(isolation: str = "runc") -> ExecutorPolicy:
    """Two cores run the whole cluster: one warm container and one worker per runner node; runners offer the
    `isolation` tiers (runc, gvisor or runc,gvisor)."""
    return ExecutorPolicy(pool_size=1, max_concurrent=1, max_waiting=8, isolation=parse_tiers(isolation))


@dataclass
class SimNode:
    index: int
    role: Role
    identity: NodeIdentity
    peers: list[str]
    executor_options: dict[str, Any] = field(default_factory=dict)
    port: int = 0
    node: MeshNode | None = None
    incarnations: int = 0
    _scope: trio.CancelScope | None = None
    _stopped: trio.Event = field(default_factory=trio.Event)

    @property
    def alive(self) -> bool:
        return self.node is not None

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.peer_id}"


class Cluster:
    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        seed: int = 1,
        heartbeat_interval: float | None = None,
        gate_interval: float = 5.0,
        policy: ExecutorPolicy | None = None,
        node_options: dict[str, Any] | None = None,
        role_options: dict[Role, dict[str, Any]] | None = None,
    ) -> None:
        self._nursery = nursery
        self.random = random.Random(seed)
        # None: the node's own default (5 s). At 1 s the N² heartbeat flood saturates one process near a dozen nodes.
        default = NodeConfig.heartbeat_interval
        self.heartbeat_interval = default if heartbeat_interval is None else heartbeat_interval
        self.gate_interval = gate_interval
        self.policy = policy or runner_policy()
        # More `NodeConfig` fields for every node (defences, gossip features), and for the nodes of one role (the
        # runners' shared sandbox, the offerers' claim lease).
        self.node_options = dict(node_options or {})
        self.role_options = dict(role_options or {})
        self.nodes: list[SimNode] = []
        self.on_open: list[OnOpen] = []

    # -- membership --------------------------------------------------------------------------------------------

    async def add(
        self, role: Role, *, executor_options: dict[str, Any] | None = None, peers: list[str] | None = None
    ) -> SimNode:
        """Start a node that dials `peers`, or by default `DIALS_PER_NODE` random live nodes of this cluster (a
        worker process is told whom to dial: the other nodes live in other processes)."""
        if peers is None:
            live = [s.addr for s in self.nodes if s.alive]
            peers = self.random.sample(live, min(DIALS_PER_NODE, len(live)))
        sim = SimNode(len(self.nodes), role, NodeIdentity.generate(), peers, dict(executor_options or {}))
        self.nodes.append(sim)
        await self._nursery.start(self._serve, sim)
        return sim

    async def kill(self, sim: SimNode) -> None:
        if sim._scope is not None:
            sim._scope.cancel()
        await sim._stopped.wait()

    async def restart(self, sim: SimNode) -> None:
        assert not sim.alive, "kill it first"
        sim._stopped = trio.Event()
        await self._nursery.start(self._serve, sim)

    async def _serve(self, sim: SimNode, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = NodeConfig(
            **{**self.node_options, **self.role_options.get(sim.role, {})},
            identity=sim.identity,
            listen=[f"/ip4/127.0.0.1/tcp/{sim.port}"],
            peers=sim.peers if sim.incarnations == 0 else self._redial_peers(sim),
            sandbox_mode="docker" if sim.role == "runner" else "none",
            executor_policy=self.policy,
            heartbeat_interval=self.heartbeat_interval,
            gate_interval=self.gate_interval,
            executor_options=sim.executor_options,
        )
        try:
            with trio.CancelScope() as scope:
                sim._scope = scope
                async with MeshNode.open(config) as node:
                    sim.port = int(node.addrs[0].split("/tcp/")[1].split("/")[0])
                    for hook in self.on_open:
                        hook(sim, node)
                    sim.node = node
                    sim.incarnations += 1
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            sim.node = None
            sim._scope = None
            sim._stopped.set()

    def _redial_peers(self, sim: SimNode) -> list[str]:
        """A restarted node dials live nodes: those it first dialled may be down now."""
        live = [s.addr for s in self.nodes if s.alive and s is not sim]
        return self.random.sample(live, min(DIALS_PER_NODE, len(live)))

    # -- views -------------------------------------------------------------------------------------------------

    def live(self, *roles: Role) -> list[MeshNode]:
        return [s.node for s in self.nodes if s.node is not None and (not roles or s.role in roles)]

    def of_role(self, *roles: Role) -> list[SimNode]:
        return [s for s in self.nodes if s.role in roles]

    async def wait_formed(self, *, timeout: float) -> bool:
        """Until every offerer holds the status of each of its neighbours and knows of a runner (first or second
        hand) when there are any, and every subscribed node has GossipSub mesh peers for offers. False when
        `timeout` passes first (the caller reports it)."""
        with trio.move_on_after(timeout):
            while not self.formed():
                await trio.sleep(0.1)
            return True
        return False

    def formed(self) -> bool:
        live = [s for s in self.nodes if s.node is not None]
        for sim in live:
            node = sim.node
            assert node is not None
            if sim.role == "offerer":
                neighbours = set(node.p2p.connected_peers())
                if not neighbours or not neighbours <= {h.peer_id for h in node.peers.fresh()}:
                    return False
                runners = any(s.role == "runner" for s in live)
                if runners and not node.runner_candidates(language=None, min_isolation=None):
                    return False
            if node.gossip.subscribed and not node.gossip.mesh_peers():
                return False
        return True


@contextlib.asynccontextmanager
async def open_cluster(**options: Any) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(nursery, **options)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()
