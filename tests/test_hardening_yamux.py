"""yamux under attack, over real loopback connections: each attack shown on a stock host first, then held.

- Data pushed past the receive window: a stock node keeps all of it (its RSS grows with what is pushed); ours
  closes the session at the first excess frame, and its memory stays where it was. The node runs in a process of
  its own, so that its RSS is its own.
- Many streams held open on one connection: a stock node takes them all; ours resets those past its cap.
- A well-behaved sender and a fast reader: a stock stream's window grows to 16 MiB, ours to 1 MiB.
- Honest transfers through the window are untouched.
"""

from __future__ import annotations

import inspect

import pytest
import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.stream_muxer.muxer_multistream import MuxerMultistream
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux, YamuxStream

from tests.hardening_node import NOREAD, SINK
from tests.hardening_support import (
    LOOPBACK,
    RefusalLog,
    dial_from,
    full_addr,
    node_process,
    peer_id,
    push_past_window,
    stock_host,
)
from tests.test_p2p_fakes import run_trio, wait_until
from transports.hardening import BoundedYamux, Defences, Refusal, StreamLimits
from transports.p2p import P2PHost, open_host
from transports.wire.identity import NodeIdentity

MB = 1_000_000
MiB = 1 << 20
HONEST = "127.0.0.1"


async def honest_transfer(client: IHost, maddr: str, mib: int) -> int:
    """Write `mib` MiB through the window (as every honest peer does) to SINK; what the node says it read."""
    stream = await client.new_stream(peer_id(maddr), [TProtocol(SINK)])
    block = b"h" * 65536
    for _ in range(mib * 16):
        await stream.write(block)
    await stream.close()
    return int(await stream.read(32))


async def attack(client: IHost, maddr: str, size: int) -> tuple[int, INetStream]:
    """An honest 20 MiB first (the window is enforced, not the bandwidth), then `size` bytes past the window."""
    await dial_from(client, HONEST, maddr)
    assert await honest_transfer(client, maddr, 20) == 20 * MiB
    stream = await client.new_stream(peer_id(maddr), [TProtocol(NOREAD)])
    return await push_past_window(stream, size), stream


@pytest.mark.slow
def test_a_stock_node_keeps_everything_pushed_past_the_window() -> None:
    """A pin of upstream's unenforced window: if this fails, py-libp2p enforces it and `BoundedYamux` may go."""

    async def main() -> None:
        async with node_process("stock") as node, stock_host(listen=()) as client:
            before = node.rss_mb
            sent, _ = await attack(client, node.addr, 200 * MB)
            assert sent >= 200 * MB  # never stopped
            await wait_until(lambda: node.rss_mb - before > 150, what="the stock node to buffer what it was sent")

    run_trio(main, deadline=120)


@pytest.mark.slow
def test_our_node_closes_the_session_at_the_first_byte_past_the_window_and_its_memory_stays_put() -> None:
    async def main() -> None:
        async with node_process("hardened") as node:
            async with stock_host(listen=()) as client:
                before = node.rss_mb
                sent, stream = await attack(client, node.addr, 600 * MB)
                assert sent < 64 * MB  # the session closed long before 600 MB
                await wait_until(lambda: node.refusals["window_violation"] == 1)
                await wait_until(lambda: stream.muxed_conn.is_closed, what="the attacker's session to close")
                assert node.rss_mb - before < 30
            async with stock_host(listen=()) as other:  # the node keeps serving
                await dial_from(other, HONEST, node.addr)
                assert await honest_transfer(other, node.addr, 4) == 4 * MiB
            assert set(node.refusals) == {"window_violation"}

    run_trio(main, deadline=120)


# -- streams per connection ---------------------------------------------------------------------------------------

HOLD = "/test/hold/1.0.0"


async def open_held_streams(client: IHost, maddr: str, count: int) -> list[INetStream]:
    """Open `count` streams to HOLD on one connection (dialled first if need be) and keep them; the accepted ones."""
    if peer_id(maddr) not in client.get_connected_peers():
        await dial_from(client, HONEST, maddr)
    accepted = []
    for _ in range(count):
        try:
            with trio.fail_after(5):
                stream = await client.new_stream(peer_id(maddr), [TProtocol(HOLD)])
                await stream.write(b"x")
                if await stream.read(1) == b"k":
                    accepted.append(stream)
        except (Exception, trio.TooSlowError):
            pass
    return accepted


class Holder:
    """A HOLD handler: acknowledges, then holds the stream until the peer closes or resets it."""

    def __init__(self) -> None:
        self.holding = 0

    async def __call__(self, stream: INetStream) -> None:
        self.holding += 1
        try:
            await stream.read(1)
            await stream.write(b"k")
            await stream.read(1)
        except Exception:
            pass
        finally:
            self.holding -= 1


def test_a_stock_node_takes_every_stream_a_peer_opens() -> None:
    async def main() -> None:
        holder = Holder()
        async with stock_host() as server, stock_host(listen=()) as client:
            server.set_stream_handler(TProtocol(HOLD), holder)
            assert len(await open_held_streams(client, full_addr(server), 200)) == 200
            assert holder.holding == 200

    run_trio(main, deadline=120)


def test_streams_past_the_cap_are_reset_and_other_peers_are_served() -> None:
    async def main() -> None:
        holder, refusals = Holder(), RefusalLog()
        cap = Defences().streams.max_inbound_streams
        async with open_host(NodeIdentity.generate(), [LOOPBACK], on_refusal=refusals) as node:
            node.set_handler(HOLD, holder)
            async with stock_host(listen=()) as client:
                held = await open_held_streams(client, node.addrs[0], 200)
                assert len(held) == cap
                assert holder.holding == cap
                await wait_until(lambda: refusals == {Refusal.STREAM_CAP: 200 - cap})
                async with stock_host(listen=()) as honest:
                    assert len(await open_held_streams(honest, node.addrs[0], 3)) == 3
                # A stream the attacker ends gives its place back.
                await held[0].reset()
                await wait_until(lambda: holder.holding == cap - 1, what="the server to see the reset")
                assert len(await open_held_streams(client, node.addrs[0], 2)) == 1
            await wait_until(lambda: holder.holding == 0, what="every held stream to end")

    run_trio(main, deadline=120)


# -- the window a well-behaved sender can fill --------------------------------------------------------------------


async def grown_window(server: IHost | P2PHost, maddr: str) -> int:
    """The largest receive window a stream of `server` grew to while a fast reader took 64 MB."""
    windows: list[int] = []
    done = trio.Event()

    async def fast_reader(stream: INetStream) -> None:
        try:
            while await stream.read(65536):
                windows.append(stream.muxed_stream.target_recv_window)  # type: ignore[attr-defined]
        except StreamEOF:
            pass
        done.set()

    if isinstance(server, P2PHost):
        server.set_handler(SINK, fast_reader)
    else:
        server.set_stream_handler(TProtocol(SINK), fast_reader)
    async with stock_host(listen=()) as client:
        await dial_from(client, HONEST, maddr)
        stream = await client.new_stream(peer_id(maddr), [TProtocol(SINK)])
        for _ in range(64 * 16):
            await stream.write(b"x" * 65536)
        await stream.close()
        with trio.fail_after(30):
            await done.wait()
    return max(windows)


def test_a_stock_stream_window_grows_to_16_mib_and_ours_to_1_mib() -> None:
    async def main() -> None:
        async with stock_host() as server:
            assert await grown_window(server, full_addr(server)) == 16 * 1024 * 1024
        async with open_host(NodeIdentity.generate(), [LOOPBACK]) as node:
            assert await grown_window(node, node.addrs[0]) == Defences().streams.max_stream_window == 1 << 20

    run_trio(main, deadline=120)


# -- what the override relies on ----------------------------------------------------------------------------------


def test_pin_muxer_opt_is_ignored_for_yamux_so_the_selector_must_be_replaced() -> None:
    """`muxer_opt={yamux: AnyClass}` still gets the stock Yamux: `MuxerMultistream.new_conn` builds `Yamux(...)`
    itself. When this fails, upstream honours the class, and `install_bounded_yamux` can pass it there."""
    assert "yamux_conn = Yamux(" in inspect.getsource(MuxerMultistream.new_conn)

    class Marker(Yamux):
        pass

    async def main() -> None:
        options = {TProtocol(YAMUX_PROTOCOL_ID): Marker}
        async with stock_host(muxer_opt=options) as server, stock_host(listen=()) as client:
            conn = await dial_from(client, HONEST, full_addr(server))
            assert type(conn.muxed_conn) is Yamux
        async with open_host(NodeIdentity.generate(), [LOOPBACK]) as node, stock_host(listen=()) as client:
            await dial_from(client, HONEST, node.addrs[0])
            [server_side] = node.host.get_network().connections[client.get_id()]
            assert type(server_side.muxed_conn) is BoundedYamux

    run_trio(main)


def test_pin_yamux_creates_each_buffer_by_assignment_and_grows_it_before_charging_the_window() -> None:
    """`BoundedYamux` sees every new stream, and every DATA frame before it is stored, through `stream_buffers`.
    When upstream changes where buffers are made or filled, read the new code before keeping the override."""
    incoming = inspect.getsource(Yamux.handle_incoming)
    assert incoming.count("self.stream_buffers[stream_id] = bytearray()") == 1
    assert incoming.count("self.stream_buffers[stream_id].extend(") == 3  # SYN, ACK and DATA frames
    for extend in ("extend(syn_payload)", "extend(ack_payload)", "extend(data)"):
        after = incoming.split(extend, 1)[1]
        assert "recv_window -=" in after[:200]  # the window is charged right after the buffer grew
    assert "self.stream_buffers[stream_id] = bytearray()" in inspect.getsource(Yamux.open_stream)
    assert "def _apply_autotune_epoch(self, buffered: int) -> int:" in inspect.getsource(YamuxStream)


def test_stream_limits_refuse_windows_auto_tuning_cannot_land_on() -> None:
    for window in (0, 100_000, 3 * 256 * 1024, 32 * 1024 * 1024):
        with pytest.raises(ValueError):
            StreamLimits(max_stream_window=window)
    with pytest.raises(ValueError):
        StreamLimits(max_inbound_streams=0)
    assert StreamLimits().buffered_per_connection == 64 << 20
