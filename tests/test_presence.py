"""Presence between neighbours, on real hosts: statuses on connect, pushes on change, runners one hop away through
a neighbour's `near` sample, forgetting on disconnect, spoofed statuses ignored, and nothing sent while idle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from mesh.invitations import near_sample
from mesh.peers import PeerDirectory
from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.direct import DirectTransport
from transports.p2p import P2PHost, open_host
from transports.presence import Presence
from transports.wire.identity import NodeIdentity


@dataclass
class Peer:
    host: P2PHost
    directory: PeerDirectory
    direct: DirectTransport
    presence: Presence
    mode: str = "docker"
    free_slots: int = 2

    @property
    def peer_id(self) -> str:
        return self.host.peer_id

    def status(self) -> dict[str, Any]:
        """What MeshNode.heartbeat says, from this test's own knobs."""
        return {
            "peerId": self.peer_id,
            "sandboxMode": self.mode,
            "freeSlots": self.free_slots,
            "languages": ["python"],
            "isolation": ["runc"] if self.mode == "docker" else [],
            "addrs": self.host.addrs[:1],
            "near": [n.to_wire() for n in near_sample(self.directory, self.peer_id)],
        }

    def sees(self, other: Peer) -> str | None:
        return self.directory.sandbox_mode(other.peer_id)

    def near(self) -> set[str]:
        return {n.peer_id for n in self.directory.near(exclude=(self.peer_id,))}


@asynccontextmanager
async def peers(count: int, **presence: Any) -> AsyncIterator[list[Peer]]:
    async with AsyncExitStack() as stack:
        hosts = [await stack.enter_async_context(open_host(NodeIdentity.generate(), [LOOPBACK])) for _ in range(count)]
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.callback(nursery.cancel_scope.cancel)
        made = []
        for host in hosts:
            directory = PeerDirectory(stale_after=600)
            peer: Peer = Peer(host, directory, None, None)  # type: ignore[arg-type]
            peer.direct = DirectTransport(host, FakeDesk(), status=peer.status, presence=directory.observe)
            await nursery.start(peer.direct.run, RecordingSink())
            peer.presence = Presence(host, peer.direct, directory, peer.status, **presence)
            await nursery.start(peer.presence.run)
            made.append(peer)
        yield made


def test_neighbours_learn_each_other_on_connect_and_hear_a_change_at_once() -> None:
    async def main() -> None:
        async with peers(2, check_every=0.1, refresh_every=600) as (a, b):
            b.mode = "none"
            await a.host.connect(b.host.addrs[0])
            await wait_until(lambda: a.sees(b) == "none" and b.sees(a) == "docker", what="statuses on connect")
            b.mode = "docker"  # its sandbox came back: the change is pushed, not waited for
            began = trio.current_time()
            await wait_until(lambda: a.sees(b) == "docker", what="the change at A")
            print(f"\nsandbox mode change reached the neighbour in {(trio.current_time() - began) * 1000:.0f} ms")

    run_trio(main)


def test_a_runner_one_hop_away_is_known_through_the_neighbours_sample_and_forgotten_when_it_leaves() -> None:
    async def main() -> None:
        async with peers(3, check_every=0.1, refresh_every=600) as (a, b, c):
            b.mode = "none"  # a seed that cannot sandbox, between an offerer A and a runner C
            await a.host.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            await wait_until(lambda: c.peer_id in a.near(), what="C in the sample A gets from B")
            assert a.sees(c) is None  # second hand only: A has no status of C's own
            assert b.peer_id not in a.near()  # B does not run offers, so it reports itself as nothing
            await c.host.disconnect(b.peer_id)
            await wait_until(lambda: b.sees(c) is None, what="B forgets C")
            await wait_until(lambda: c.peer_id not in a.near(), what="A hears that C is gone")

    run_trio(main)


def test_free_slots_coming_and_going_are_not_pushed_but_running_out_is() -> None:
    async def main() -> None:
        async with peers(2, check_every=0.05, refresh_every=600, min_push_gap=0.0) as (a, b):
            await a.host.connect(b.host.addrs[0])
            await wait_until(lambda: a.sees(b) == "docker", what="status on connect")
            await trio.sleep(0.3)
            pushes = b.presence.pushes
            b.free_slots = 1  # one job started: not worth a push to every neighbour
            await trio.sleep(0.3)
            assert b.presence.pushes == pushes
            b.free_slots = 0  # full: neighbours should stop counting on it
            await wait_until(lambda: (h := a.directory.get(b.peer_id)) is not None and h.free_slots == 0, what="full")

    run_trio(main)


def test_an_idle_neighbourhood_sends_nothing_until_its_refresh() -> None:
    async def main() -> None:
        async with peers(3, check_every=0.05, refresh_every=600) as (a, b, c):
            await a.host.connect(b.host.addrs[0])
            await c.host.connect(b.host.addrs[0])
            await wait_until(lambda: c.peer_id in a.near() and a.peer_id in c.near(), what="presence settled")
            await trio.sleep(1.5)  # the last changes (samples) settle
            before = [(p.presence.pushes, p.presence.pulls) for p in (a, b, c)]
            await trio.sleep(1.5)
            assert [(p.presence.pushes, p.presence.pulls) for p in (a, b, c)] == before

    run_trio(main)


def test_a_pushed_status_that_names_another_peer_is_ignored() -> None:
    async def main() -> None:
        async with peers(3, check_every=0.1, refresh_every=600) as (a, b, c):
            await a.host.connect(b.host.addrs[0])
            await wait_until(lambda: a.sees(b) == "docker", what="B's status at A")
            await c.host.connect(a.host.addrs[0])
            ignored = a.directory.ignored
            # C pushes a status in B's name over its own (Noise-authenticated) connection.
            assert await c.direct.push_status(a.peer_id, {**b.status(), "sandboxMode": "none"}) is None
            assert a.sees(b) == "docker" and a.directory.ignored == ignored + 1

    run_trio(main)
