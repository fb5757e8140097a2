"""Presence between neighbours: each node's status reaches the peers it is connected to, and no further.

This replaces a heartbeat flooded to the whole mesh, whose cost grew as N² (every node received every node's beat,
about 3 ms of CPU each in py-libp2p). Here a node talks only to its neighbours, at most `ConnectionManager.high`
of them whatever the mesh's size:

- **on connect**, each side asks the other for its status (the status protocol, over the new connection);
- **on change**, a node pushes its status to every neighbour: when its sandbox mode, its tiers, its languages, its
  addresses, whether it has a free slot, or the runners it reports (`near`) change. Checked every `check_every`
  seconds (a local comparison) and at once when the node says so (`changed()`, on a sandbox gate change), then
  pushed at most once per `min_push_gap` seconds;
- **every `refresh_every` seconds**, it pushes its status anyway, so that a lost push is repaired and a neighbour's
  status never goes stale while the link holds;
- **on disconnect**, the neighbour is forgotten, with the runners it reported.

A change of sandbox mode therefore reaches neighbours within about `check_every` + one round trip, and the nodes
one hop further (through the neighbours' `near` samples) within about twice that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import trio

from transports.p2p import P2PHost
from transports.wire.reasons import Rejection

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
# At most this many status exchanges at once: a node that just got 32 connections must not open 32 streams at once.
PARALLEL_EXCHANGES = 8
PULL_RETRIES = (0.5, 2.0, 0.0)


class NeighbourRecord(Protocol):
    """Where presence keeps what each neighbour said (`mesh.peers.PeerDirectory`): presence only feeds it."""

    def observe(self, peer_id: str, data: Any) -> object | None: ...

    def forget(self, peer_id: str) -> None: ...

    def known(self) -> set[str]: ...

    def get(self, peer_id: str) -> object | None: ...


class StatusWire(Protocol):
    """The two status exchanges of the direct protocol (`transports.direct.DirectTransport`)."""

    async def request_status(self, peer: str) -> dict[str, Any] | Rejection: ...

    async def push_status(self, peer: str, status: dict[str, Any]) -> Rejection | None: ...


def material(status: dict[str, Any]) -> tuple[Any, ...]:
    """What a neighbour must hear about at once; the exact number of free slots is not (it changes with every job
    and would make every run a push to every neighbour), only whether there is one."""
    return (
        status.get("sandboxMode"),
        status.get("freeSlots", 0) > 0,
        tuple(status.get("languages", ())),
        tuple(status.get("isolation", ())),
        tuple(status.get("addrs", ())),
        tuple(n.get("peerId") for n in status.get("near", ())),
    )


@dataclass(eq=False)
class Presence:
    name = "presence"

    host: P2PHost
    wire: StatusWire
    directory: NeighbourRecord
    status: StatusFn
    _: KW_ONLY
    refresh_every: float = 30.0
    check_every: float = 0.5
    min_push_gap: float = 1.0
    pushes: int = field(default=0, init=False)
    pulls: int = field(default=0, init=False)
    _wake: trio.Event = field(default_factory=trio.Event, init=False, repr=False)
    _connections: trio.Event = field(default_factory=trio.Event, init=False, repr=False)
    _limit: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(PARALLEL_EXCHANGES), init=False, repr=False)
    # Neighbours asked (or being asked) since they connected.
    _asked: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.host.on_connection(self._on_connection)

    def changed(self) -> None:
        """Our status changed in a way neighbours should hear of now (the node calls this on a gate change)."""
        self._wake.set()

    def _on_connection(self, peer_id: str, connected: bool) -> None:
        self._connections.set()

    def observe(self, peer_id: str, status: dict[str, Any]) -> None:
        """A status a neighbour pushed to us (the direct transport's handler calls this)."""
        self.directory.observe(peer_id, status)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_connections, nursery)
            nursery.start_soon(self._push_changes)
            task_status.started()

    # -- neighbours coming and going ------------------------------------------------------------------------------

    async def _follow_connections(self, nursery: trio.Nursery) -> None:
        while True:
            connected = set(self.host.connected_peers())
            for peer_id in connected - self._asked:
                self._asked.add(peer_id)
                nursery.start_soon(self._pull, peer_id)
            for peer_id in self._asked - connected:
                self._asked.discard(peer_id)
                self.directory.forget(peer_id)
            for peer_id in self.directory.known() - connected:
                # Statuses learned otherwise (a claim's, an answer to the desk) are kept only while they are fresh.
                if self.directory.get(peer_id) is None:
                    self.directory.forget(peer_id)
            self._connections = trio.Event()
            with trio.move_on_after(self.refresh_every):
                await self._connections.wait()

    async def _pull(self, peer_id: str) -> None:
        # A peer that has just started may not serve the protocol yet: a couple of retries, then its own pushes.
        for delay in PULL_RETRIES:
            async with self._limit:
                answer = await self.wire.request_status(peer_id)
            self.pulls += 1
            if not isinstance(answer, Rejection):
                self.directory.observe(peer_id, answer)
                return
            # Not every peer speaks our protocol (a relay, a js peer): it simply has no status here.
            log.debug("no status from %s: %s", peer_id, answer.reason)
            if peer_id not in self.host.connected_peers():
                return
            await trio.sleep(delay)

    # -- our own status -------------------------------------------------------------------------------------------

    async def _push_changes(self) -> None:
        last: tuple[Any, ...] | None = None
        next_refresh = trio.current_time() + self.refresh_every
        while True:
            with trio.move_on_after(self.check_every):
                await self._wake.wait()
            self._wake = trio.Event()
            status = self.status()
            fingerprint = material(status)
            if fingerprint == last and trio.current_time() < next_refresh:
                continue  # a neighbour that connected meanwhile asked us for our status itself
            last, next_refresh = fingerprint, trio.current_time() + self.refresh_every
            async with trio.open_nursery() as pushes:
                for peer_id in self.host.connected_peers():
                    pushes.start_soon(self._push, peer_id, status)
            await trio.sleep(self.min_push_gap)

    async def _push(self, peer_id: str, status: dict[str, Any]) -> None:
        async with self._limit:
            refusal = await self.wire.push_status(peer_id, status)
        self.pushes += 1
        if refusal is not None:
            log.debug("status push to %s: %s", peer_id, refusal.reason)
