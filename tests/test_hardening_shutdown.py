"""Closing a host: all connections at once, bounded by a grace period, and every peer still sees the disconnect.

A stock host closes its connections one after another, each paying libp2p's two 0.1 s sleeps, and cannot close at
all while a write to a peer that stopped reading holds the session's write lock. The close time itself is a
benchmark's figure (benchmarks/bench_attacks.py prints it); these tests pin the order of events.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import trio
import trio.testing
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.network.connection.swarm_connection import SwarmConn
from libp2p.network.swarm import Swarm
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from tests.hardening_support import LOOPBACK, data_frame, dial_from, fresh_peer, full_addr, stock_host
from tests.test_p2p_fakes import run_trio, wait_until
from transports.hardening.shutdown import close_sockets_now, connections_of, socket_stream_under
from transports.p2p import open_host
from transports.wire.identity import NodeIdentity

HONEST = "127.0.0.1"


class Disconnects(INotifee):
    def __init__(self) -> None:
        self.seen = 0

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self.seen += 1

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None: ...
    async def closed_stream(self, network: INetwork, stream: INetStream) -> None: ...
    async def connected(self, network: INetwork, conn: INetConn) -> None: ...
    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None: ...
    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None: ...


def log_muxer_closes(host: IHost, log: list[tuple[str, int]]) -> None:
    """Record when each connection's muxer starts and finishes closing."""
    for index, conn in enumerate(c for cs in host.get_network().connections.values() for c in cs):
        muxed = conn.muxed_conn
        original: Callable[..., Awaitable[None]] = muxed.close

        async def close(*args: Any, _original: Any = original, _index: int = index) -> None:
            log.append(("start", _index))
            await _original(*args)
            log.append(("end", _index))

        muxed.close = close  # type: ignore[method-assign]


async def connected_peers(stack: AsyncExitStack, count: int) -> tuple[list[IHost], Disconnects]:
    disconnects = Disconnects()
    peers = [await stack.enter_async_context(stock_host()) for _ in range(count)]
    for peer in peers:
        peer.get_network().register_notifee(disconnects)
    return peers, disconnects


def test_a_stock_host_closes_its_connections_one_after_another() -> None:
    """A pin of why `close_fast` exists: if upstream closes them concurrently, it may not be needed."""

    async def main() -> None:
        log: list[tuple[str, int]] = []
        async with AsyncExitStack() as stack:
            peers, _ = await connected_peers(stack, 3)
            async with stock_host(listen=()) as host:
                for peer in peers:
                    await dial_from(host, HONEST, full_addr(peer))
                log_muxer_closes(host, log)
                await host.close()
        assert [kind for kind, _ in log] == ["start", "end"] * 3

    run_trio(main)


def test_our_host_closes_every_connection_at_once_and_every_peer_sees_it() -> None:
    async def main() -> None:
        log: list[tuple[str, int]] = []
        async with AsyncExitStack() as stack:
            peers, disconnects = await connected_peers(stack, 3)
            async with open_host(NodeIdentity.generate(), [LOOPBACK]) as node:
                for peer in peers:
                    await node.connect(full_addr(peer))
                log_muxer_closes(node.host, log)
            # Every muxer started closing before the first finished. (Each finishes when its 0.1 s sleep does,
            # unless the grace period cut it short: both are fine.)
            starts = [i for i, (kind, _) in enumerate(log) if kind == "start"]
            ends = [i for i, (kind, _) in enumerate(log) if kind == "end"]
            assert len(starts) == 3 and (not ends or max(starts) < min(ends))
            await wait_until(lambda: disconnects.seen == 3, what="every peer to see the disconnect")
            await wait_until(lambda: all(p.get_connected_peers() == [] for p in peers), what="the peers to drop us")

    run_trio(main)


class StalledWriter:
    """Writes yamux frames to a peer that never reads, until the socket blocks for good (or is closed)."""

    def __init__(self, conn: Any) -> None:
        self.muxed = conn.muxed_conn
        self.frames = 0

    async def run(self) -> None:
        frame = data_frame(1, 65536 - 12)
        with contextlib.suppress(Exception):
            while not self.muxed.is_closed:
                await self.muxed._write_frame(frame)
                self.frames += 1

    async def stuck(self) -> None:
        """Until the write blocks for good: the peer's receive window is shut, so no frame completes while every
        task waits (a write can also wait briefly for the kernel before the window is shut)."""
        while True:
            before = self.frames
            await trio.testing.wait_all_tasks_blocked(cushion=0.1)
            await trio.testing.wait_all_tasks_blocked(cushion=0.1)
            if self.frames == before and self.muxed._write_lock.locked():
                return


def test_a_peer_that_stopped_reading_blocks_a_stock_close_and_ours_cuts_it_after_the_grace() -> None:
    async def main() -> None:
        # Stock: the write lock is held by a write that cannot finish, and GO_AWAY waits behind it.
        async with stock_host() as server:
            stuck = await fresh_peer(HONEST, full_addr(server))  # its yamux is never started: nobody reads
            assert stuck is not None
            await wait_until(lambda: len(server.get_connected_peers()) == 1)
            [conn] = next(iter(server.get_network().connections.values()))
            async with trio.open_nursery() as nursery:
                writer = StalledWriter(conn)
                nursery.start_soon(writer.run)
                await writer.stuck()
                with trio.move_on_after(5) as waited:
                    await server.close()
                assert waited.cancelled_caught
                nursery.cancel_scope.cancel()
            await stuck.secured_conn.close()  # type: ignore[attr-defined]
            # The stock close never got to the server's end of the socket (that is the finding): close it here.
            await socket_stream_of(conn.muxed_conn).aclose()

        async with trio.open_nursery() as nursery:
            async with open_host(NodeIdentity.generate(), [LOOPBACK]) as node:
                stuck = await fresh_peer(HONEST, node.addrs[0])
                assert stuck is not None
                await wait_until(lambda: len(node.connected_peers()) == 1)
                [conn] = next(iter(node.host.get_network().connections.values()))
                writer = StalledWriter(conn)
                nursery.start_soon(writer.run)
                await writer.stuck()
            # Leaving open_host returned while the write was still stuck (the test's deadline catches a hang),
            # and the peer was cut off: after the frames that did get through, its socket ends.
            raw = socket_stream_of(stuck)
            with trio.fail_after(10):
                while await raw.receive_some(1 << 20):
                    pass
            await raw.aclose()  # the node cut it; our end is ours to close
            nursery.cancel_scope.cancel()

    run_trio(main)


def socket_stream_of(conn: Any) -> trio.SocketStream:
    stream = socket_stream_under(conn)
    assert stream is not None, f"no socket under {conn!r}"
    return stream


def test_the_sockets_under_connections_are_closed_at_once_whatever_their_state() -> None:
    """`close_sockets_now`, the last step of every close (`close_fast`, and the test hosts' bounded close): each
    peer sees its connection end, and a socket already closed is left alone."""

    async def main() -> None:
        async with stock_host() as server, AsyncExitStack() as stack:
            peers, _ = await connected_peers(stack, 2)
            for peer in peers:
                await dial_from(peer, HONEST, full_addr(server))
            await wait_until(lambda: len(server.get_connected_peers()) == 2)
            conns = connections_of(server)
            assert close_sockets_now(conns) == 2
            assert close_sockets_now(conns) == 0
            assert all(socket_stream_of(conn).socket.fileno() == -1 for conn in conns)
            # each peer's reader sees the end of its connection, and drops it
            await wait_until(lambda: not any(p.get_connected_peers() for p in peers), what="the peers to see the end")

    run_trio(main)


def test_pin_the_upstream_sleeps_and_marks_close_fast_relies_on() -> None:
    """`close_fast` waits for `Yamux.event_closed` (set before Yamux.close's trailing sleep), cancels the rest, and
    relies on `SwarmConn.close` marking itself closed first so that `host.close()` skips it. When any of this
    changes upstream, read the new code before keeping the override."""
    yamux_close = inspect.getsource(Yamux.close)
    assert yamux_close.index("self.event_closed.set()") < yamux_close.index("await trio.sleep(0.1)")
    assert "await trio.sleep(0.1)" in inspect.getsource(SwarmConn._cleanup)
    swarm_conn_close = inspect.getsource(SwarmConn.close)
    assert swarm_conn_close.index("self.event_closed.set()") < swarm_conn_close.index("await")
    swarm_close = inspect.getsource(Swarm.close)
    assert "for conn in list(conns):" in swarm_close and "await conn.close()" in swarm_close
