"""The connection manager keeps the peer count between its watermarks, with real libp2p hosts on loopback.

Above the high watermark it closes the newest unprotected connections ; below the low one
it dials the peers it was told about, and redials a peer it lost; between the two it neither dials (a peer that is not
`eager`) nor trims.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import trio

from tests.test_p2p_fakes import LOOPBACK, wait_until
from transports.connmgr import ConnectionManager
from transports.p2p import P2PHost, open_host
from transports.wire.identity import NodeIdentity

INTERVAL_S = 0.05  # the manager's rebalancing period: short, so that the readiness waits below return soon


@contextlib.asynccontextmanager
async def hosts(count: int) -> AsyncIterator[list[P2PHost]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_host(NodeIdentity.generate(), [LOOPBACK])) for _ in range(count)]


def sees(host: P2PHost, peer_id: str) -> Callable[[], bool]:
    return lambda: peer_id in host.connected_peers()


async def test_above_the_high_watermark_the_newest_unprotected_connections_are_closed() -> None:
    # Eight peers, three kept: a manager that picked at random would keep the two oldest 1 time in 21.
    async with hosts(1) as [hub], hosts(8) as peers:
        oldest, *newer = peers
        for peer in peers:  # one at a time, so that the hub's connections have a known age
            await peer.connect(hub.addrs[0])
            await wait_until(sees(hub, peer.peer_id), what="the hub sees the connection", timeout=20.0)
        protected = newer[-1].peer_id  # the newest of all, protected (as a bootstrap peer or relay would be)
        manager = ConnectionManager(hub, low=1, high=3, protected=lambda: {protected}, interval_s=INTERVAL_S)
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(lambda: manager.trimmed == 5, what="five connections are trimmed", timeout=20.0)
            # Kept: the protected peer and the two oldest. Closed: the five newest unprotected ones.
            assert set(hub.connected_peers()) == {protected, oldest.peer_id, newer[0].peer_id}
            assert manager.dialled == 0
            nursery.cancel_scope.cancel()
        # Within the watermarks, further rounds change nothing: no trim, and no redial of the trimmed peers.
        for _ in range(5):
            await manager._balance()
        assert manager.trimmed == 5 and manager.dialled == 0
        assert len(hub.connected_peers()) == 3


async def test_valued_peers_are_trimmed_only_after_every_stranger() -> None:
    # For a node, valued peers are the offerers it has served: a crowd of strangers must not push them out.
    async with hosts(1) as [hub], hosts(4) as peers:
        for peer in peers:
            await peer.connect(hub.addrs[0])
            await wait_until(sees(hub, peer.peer_id), what="the hub sees the connection", timeout=20.0)
        valued = peers[-1].peer_id  # the newest, which plain newest-first trimming would close first
        manager = ConnectionManager(hub, low=1, high=2, interval_s=INTERVAL_S, valued=lambda peer_id: peer_id == valued)
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(lambda: manager.trimmed == 2, what="two connections are trimmed", timeout=20.0)
            assert set(hub.connected_peers()) == {peers[0].peer_id, valued}  # the two newest strangers went
            nursery.cancel_scope.cancel()


async def test_below_the_low_watermark_discovered_peers_are_dialled_and_a_lost_one_redialled() -> None:
    async with hosts(1) as [hub], hosts(5) as peers:
        manager = ConnectionManager(hub, low=3, high=8, interval_s=INTERVAL_S)
        for peer in peers:
            manager.discovered(peer.peer_id, peer.addrs, "rendezvous")
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            # `dialled` counts a dial once `connect` has returned, a little after the swarm lists the connection.
            await wait_until(lambda: manager.dialled >= 3, what="the hub dials up to its low watermark", timeout=20.0)
            nursery.cancel_scope.cancel()
        # Short of `low`, it dials up to `low`, not beyond: the other discovered peers stay known, undialled.
        for _ in range(5):
            await manager._balance()
        assert len(hub.connected_peers()) == 3 and manager.dialled == 3

        await hub.disconnect(hub.connected_peers()[0])
        assert len(hub.connected_peers()) == 2
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(lambda: manager.dialled == 4, what="the hub redials", timeout=20.0)
            nursery.cancel_scope.cancel()
        assert len(hub.connected_peers()) == 3


async def test_between_the_watermarks_only_eager_peers_are_dialled() -> None:
    """A peer on our own LAN (mDNS: `eager`) is dialled whenever there is room under `high`; others only when short."""
    async with hosts(1) as [hub], hosts(3) as peers:
        first, lan, remote = peers
        await first.connect(hub.addrs[0])
        await wait_until(
            lambda: first.peer_id in hub.connected_peers(), what="the hub sees its first peer", timeout=20.0
        )
        manager = ConnectionManager(hub, low=1, high=4, interval_s=INTERVAL_S)
        manager.discovered(remote.peer_id, remote.addrs, "rendezvous")
        manager.discovered(lan.peer_id, lan.addrs, "mdns", eager=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(lambda: manager.dialled == 1, what="the LAN peer is dialled", timeout=20.0)
            nursery.cancel_scope.cancel()
        for _ in range(5):
            await manager._balance()
        assert lan.peer_id in hub.connected_peers() and remote.peer_id not in hub.connected_peers()
        assert manager.dialled == 1
