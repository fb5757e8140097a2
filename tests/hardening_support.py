"""Attackers and stock hosts for the connection-level defence tests (transports/hardening), and for the benchmark.

- `stock_host` builds a libp2p host exactly as `open_host` built it before the defences (Noise only, yamux only, one
  connection per peer, no mDNS, UPnP or auto-connector), so that each attack is first shown to work on it.
- `dial_from` makes a full libp2p connection (TCP, Noise, yamux) from a chosen loopback source address: as root
  the test owns all of 127.0.0.0/8, so attackers bind to 127.0.1.x and honest peers dial from 127.0.0.1.
- `idle_sockets` opens raw TCP sockets that never speak, and `dropped` tells which of them the node closed.
- `push_past_window` writes yamux DATA frames straight onto a session, skipping the send-window wait of
  `YamuxStream.write`, which is what any hostile implementation does.
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, IMuxedConn, INetStream
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE, TYPE_DATA, YAMUX_HEADER_FORMAT
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader

from transports.direct import OFFER_PROTOCOL
from transports.framing import read_frame, write_frame
from transports.hardening import Refusal
from transports.hardening.shutdown import close_sockets_now, connections_of
from transports.p2p import noise_only, yamux_only
from transports.wire.codec import unpack_strict
from transports.wire.identity import NodeIdentity

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def attacker_ip(i: int) -> str:
    """The i-th attacker source address, 127.0.1.1 onwards (never 127.0.0.1, the honest peers' address)."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


class RefusalLog(Counter[Refusal]):
    """A `RefusalSink` for tests: `open_host(..., on_refusal=log)` counts each refusal by reason."""

    def __call__(self, reason: Refusal) -> None:
        self[reason] += 1


def build_stock_host(identity: NodeIdentity | None = None, **options: Any) -> IHost:
    identity = identity or NodeIdentity.generate()
    kwargs: dict[str, Any] = {
        "key_pair": identity.libp2p_keypair(),
        "sec_opt": noise_only(identity),
        "muxer_opt": yamux_only(),
        "connection_config": ConnectionConfig(max_connections_per_peer=1),
        "enable_mDNS": False,
        "enable_upnp": False,
    }
    kwargs.update(options)
    return new_host(**kwargs)


@asynccontextmanager
async def running(host: IHost, listen: Sequence[str] = ()) -> AsyncIterator[IHost]:
    """Run a libp2p host built here (stock, or an attacker's) with its auto-connector stopped."""
    async with host.run(listen_addrs=[multiaddr.Multiaddr(a) for a in listen]):
        auto_connector = getattr(host.get_network(), "auto_connector", None)
        if auto_connector is not None:
            await auto_connector.stop()
        try:
            yield host
        finally:
            conns = connections_of(host)
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(3):
                    await host.close()
            finally:  # a close cut short by the bound (48 hosts closing at once) leaves no socket to the collector
                close_sockets_now(conns + connections_of(host))


@asynccontextmanager
async def stock_host(listen: Sequence[str] = (LOOPBACK,), **options: Any) -> AsyncIterator[IHost]:
    async with running(build_stock_host(**options), listen) as host:
        yield host


def full_addr(host: IHost) -> str:
    return str(host.get_addrs()[0])


def tcp_port(maddr: str) -> int:
    return int(multiaddr.Multiaddr(maddr).value_for_protocol("tcp"))


async def dial_from(host: IHost, source_ip: str, maddr: str) -> Any:
    """A full libp2p connection from `source_ip` to `maddr` (`/ip4/…/tcp/N/p2p/<id>`); the SwarmConn. A refused or
    cancelled upgrade closes the socket (upstream's upgrade leaves that to its own dialer)."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
    raw = await TCP().dial_with_source(tcp_part(maddr), (source_ip, 0))
    try:
        return await host.get_network().upgrade_outbound_raw_conn(raw, info.peer_id)
    except BaseException:
        close_sockets_now([raw])
        raise


@asynccontextmanager
async def connection_from(host: IHost, source_ip: str, maddr: str) -> AsyncIterator[Any]:
    """`dial_from` for as long as the block runs; on leaving it our end of the TCP socket is closed. The host's
    own close (bounded to 3 s by `running`) left it to the garbage collector after the Sybil flood of
    tests/test_fairness_node.py, 48 streams busy on the connection."""
    conn = await dial_from(host, source_ip, maddr)
    try:
        yield conn
    finally:
        close_sockets_now([conn])


async def try_dial_from(host: IHost, source_ip: str, maddr: str, *, timeout: float = 5.0) -> bool:
    """True when the connection came up, and is still up once identify ran over it; False when it was refused."""
    try:
        with trio.fail_after(timeout):
            conn = await dial_from(host, source_ip, maddr)
    except (Exception, trio.TooSlowError):
        return False
    return not conn.is_closed


async def disconnect_all(host: IHost) -> None:
    for peer in list(host.get_connected_peers()):
        await host.disconnect(peer)


def accept_backlog(host: IHost) -> int:
    """Connections the kernel completed that `host` has not accepted yet (TCP_INFO's `tcpi_unacked` of a listening
    socket is its accept queue)."""
    queued = 0
    for listener in host.get_network().listeners.values():
        for trio_listener in getattr(listener, "listeners", []):  # TCPListener's trio SocketListeners
            info = trio_listener.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
            queued += struct.unpack_from("I", info, 24)[0]
    return queued


# libp2p listens with a backlog of 128: a burst of connects past it waits in the kernel, unaccepted, for SYN-ACK
# retransmits. The attack opens its sockets in batches the node has accepted, so that every socket is in play.
_ACCEPT_BATCH = 100


@asynccontextmanager
async def idle_sockets(
    node: IHost, sources: Sequence[str], *, port: int | None = None
) -> AsyncIterator[list[trio.socket.SocketType]]:
    """One connected, silent TCP socket per entry of `sources` (repeat an address for several) to `node`, each
    accepted by it before this yields."""
    port = port or tcp_port(full_addr(node))
    socks: list[trio.socket.SocketType] = []
    try:
        for start in range(0, len(sources), _ACCEPT_BATCH):
            for source in sources[start : start + _ACCEPT_BATCH]:
                sock = trio.socket.socket()
                await sock.bind((source, 0))
                await sock.connect(("127.0.0.1", port))
                socks.append(sock)
            with trio.fail_after(30):
                while accept_backlog(node):
                    await trio.sleep(0.005)
        yield socks
    finally:
        for sock in socks:
            sock.close()


async def wait_closed_by_peer(sock: trio.socket.SocketType) -> None:
    """Until the other end closes `sock` (the node speaks first, a multistream header: read past it to EOF)."""
    try:
        while await sock.recv(4096):
            pass
    except OSError:
        pass  # reset by the node: closed too


async def fresh_peer(source_ip: str, maddr: str) -> IMuxedConn | None:
    """A connection from a brand-new key: TCP, Noise and yamux negotiated, then left open and silent (our side
    of the session is not even started). None when the node refused it."""
    identity = NodeIdentity.generate()
    upgrader = TransportUpgrader(noise_only(identity), yamux_only())
    target = peer_id(maddr)
    raw = None
    try:
        with trio.fail_after(10):
            raw = await TCP().dial_with_source(tcp_part(maddr), (source_ip, 0))
            secured = await upgrader.upgrade_security(raw, True, target)
            return await upgrader.upgrade_connection(secured, target)
    except (Exception, trio.TooSlowError):
        if raw is not None:  # refused mid-upgrade: our end of the socket is still open
            with trio.move_on_after(1):
                await raw.close()
        return None


def tcp_part(maddr: str) -> multiaddr.Multiaddr:
    """`/ip4/…/tcp/N` of a full `/ip4/…/tcp/N/p2p/<id>`."""
    return multiaddr.Multiaddr(maddr).decapsulate_code(multiaddr.protocols.P_P2P)


async def close_all(conns: list[IMuxedConn]) -> None:
    for conn in conns:
        with trio.move_on_after(1):
            await conn.secured_conn.close()  # type: ignore[attr-defined]


def data_frame(stream_id: int, size: int) -> bytes:
    return struct.pack(YAMUX_HEADER_FORMAT, 0, TYPE_DATA, 0, stream_id, size) + b"a" * size


async def push_past_window(stream: INetStream, total: int, *, frame: int = 65536 - HEADER_SIZE) -> int:
    """Write `total` bytes of DATA frames on `stream` without waiting for window; the bytes written before the
    node closed the session (all of them when it never did)."""
    muxed: Any = stream.muxed_stream  # type: ignore[attr-defined]
    conn, stream_id = muxed.conn, muxed.stream_id
    block = data_frame(stream_id, frame)
    sent = 0
    try:
        # A write after our own side closed (on the node's GO_AWAY) returns silently in py-libp2p's TCP stream
        # (ClosedResourceError is swallowed): the session's state, not a write error, says when to stop.
        while sent < total and not conn.is_closed:
            await conn._write_frame(block)
            sent += frame
    except Exception:
        return sent
    return sent


def peer_id(maddr: str) -> ID:
    return info_from_p2p_addr(multiaddr.Multiaddr(maddr)).peer_id


async def offer_answer(host: IHost, addr: str, raw: bytes) -> dict[str, Any]:
    """One offer on a stream of its own, as `edgecoder offer --to` sends it; the answer map."""
    stream = await host.new_stream(peer_id(addr), [TProtocol(OFFER_PROTOCOL)])
    try:
        await write_frame(stream, raw)
        answer = unpack_strict(await read_frame(stream, max_len=1 << 20, timeout=60), max_size=1 << 20)
        assert isinstance(answer, dict), answer
        return answer
    finally:
        with trio.move_on_after(1):
            await stream.close()


async def offer_once(host: IHost, addr: str, raw: bytes) -> str:
    """`offer_answer`'s type or refusal reason."""
    answer = await offer_answer(host, addr, raw)
    return str(answer.get("reason") or answer.get("type"))


async def polite_swarm(
    addr: str,
    answers: Counter[str],
    *,
    code: str,
    keys: int = 300,
    peers: int = 48,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """`peers` attacker peers, each its own connection from one of four attacker addresses, each sending offers of
    `code` from its share of `keys` fresh offerer keys one at a time, and each waiting as told (`retryAfterMs`)
    after a refusal for want of room: a swarm that no per-peer hold-off or strike catches, which only the queue's
    classes hold back (tests/test_fairness_node.py, benchmarks/bench_attacks.py). Counts the answers by type or
    reason into `answers`; runs until cancelled."""
    from transports.wire.offers import Audience, TaskOffer

    identities = [NodeIdentity.generate() for _ in range(keys)]
    to_node = Audience.direct(peer_id(addr).to_base58())  # sent on a direct stream: addressed to the node

    async def offers(host: IHost, conn: Any, keys: list[NodeIdentity]) -> None:
        """Until the node closes `conn` (new streams would then go over a connection the host dials itself)."""
        for key in itertools.cycle(keys):
            if conn.is_closed:
                return
            raw = TaskOffer.create(key, language="python", code=code, audience=to_node).sign(key)
            try:
                with trio.fail_after(60):
                    answer = await offer_answer(host, addr, raw)
            except (Exception, trio.TooSlowError):
                answers["stream failed"] += 1
                await trio.sleep(0.05)
                continue
            answers[str(answer.get("reason") or answer.get("type"))] += 1
            await trio.sleep(answer.get("retryAfterMs", 0) / 1000)

    async def attacker_peer(n: int) -> None:
        async with stock_host(listen=()) as host:
            while True:
                # The node may refuse a connection (a source's handshakes in flight are bounded): a polite peer
                # dials again a little later, as a real one would, and the swarm carries on.
                try:
                    async with connection_from(host, attacker_ip(n % 4), addr) as conn:
                        await offers(host, conn, identities[n::peers])
                except Exception:
                    answers["connection refused"] += 1
                await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        for n in range(peers):
            nursery.start_soon(attacker_peer, n)
        task_status.started()


class NodeProcess:
    """A `tests.hardening_node` process: its address, its pid, and the refusals it reported so far."""

    def __init__(self, process: trio.Process, addr: str) -> None:
        self.process = process
        self.addr = addr
        self.refusals: Counter[str] = Counter()

    @property
    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS line")  # a kernel without it: nothing here would work

    async def _read_reports(self, lines: Any) -> None:
        async for line in lines:
            if line.startswith("refusal "):
                self.refusals[line.split(" ", 1)[1]] += 1


class _Lines:
    """Lines of a process's stdout, as they come."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> str | None:
        while b"\n" not in self.buffer:
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self.next()
        if line is None:
            raise StopAsyncIteration
        return line


@asynccontextmanager
async def node_process(kind: str) -> AsyncIterator[NodeProcess]:
    """Run `python -m tests.hardening_node KIND` (stock or hardened) until the block ends."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.hardening_node", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        lines = _Lines(process.stdout)
        with trio.fail_after(30):
            addr = await lines.next()
        if addr is None:
            raise RuntimeError(f"the {kind} node exited before it listened")
        node = NodeProcess(process, addr)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node._read_reports, lines)
            yield node
            await process.stdin.aclose()
            with trio.move_on_after(10):
                await process.wait()
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
