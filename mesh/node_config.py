"""What a node is started with: `NodeConfig` (mesh.commands fills it from the settings table of mesh/config.py:
flags, the environment, a config file) and the executor a process may share among many nodes (`SharedSandbox`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from executor.policy import ExecutorPolicy
from mesh.gate import SandboxGate
from mesh.intake import IntakePolicy
from mesh.invitations import INVITEES
from mesh.peers import SandboxMode
from transports.base import Transport
from transports.hardening import Defences
from transports.operator_addrs import listens_beyond_loopback
from transports.relay import ReserveMode
from transports.wire.identity import NodeIdentity

if TYPE_CHECKING:
    from executor.runner import Executor


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
    # Seal this node's own gossip offers (transports/wire/sealed.py): gossip carries the offer without its code and
    # input, and only the runner granted gets them, sealed to it. Off only to measure or to talk to older nodes.
    seal_gossip: bool = True
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
