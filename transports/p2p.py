"""The libp2p host every p2p transport shares: Noise only, yamux only, one connection per peer.

`open_host` is the only place a libp2p host is built, so every default that matters for safety or latency is
overridden here, each with its reason:

- security: Noise only. libp2p's defaults also offer TLS, SECIO and `/plaintext/2.0.0`; a plaintext dialer was
  measured to connect to a default host. With one option there is nothing to downgrade to.
- muxer: yamux only. The default list falls back to mplex, which has no flow control.
- `ConnectionConfig(max_connections_per_peer=1)`: with the default (3) every dial waits on a 250 ms fallback timer in
  `network/swarm.py`; with 1 a loopback connect takes under 10 ms.
- no mDNS, UPnP, bootstrap or auto-connector: peers are only those the node dials or that dial it.
- the connection-level defences of `transports.hardening` (issue 11), configured by `Defences`: the inbound-slot
  fix, per-source admission and a 3 s handshake timeout, rcmgr's working limits, bounded yamux, and a close that
  takes one grace period instead of 0.2 s per connection. Each refusal goes to `on_refusal` (the node's metrics).
- the pubsub path of `transports.pubsub`, switched by one `PubsubTuning` (`tuning`, by default `LEAN`): here, Noise
  reading the socket through one buffer; the host's transports read the rest from `P2PHost.tuning`.
- one `PenaltyBox` per host (`P2PHost.penalties`): peers banned for invalid messages, by gossip scoring or by the
  direct streams, are refused at the swarm, and cut off by `P2PHost.cut_off`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import RetryConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from transports.addresses import WILDCARDS, AddressBook, install_circuit_aware_addrs, ip_of, is_circuit, with_peer
from transports.hardening import (
    Defences,
    GuardedSwarm,
    PenaltyBox,
    Refusal,
    Refusals,
    RefusalSink,
    close_fast,
    install_defences,
)
from transports.multiselect import install_settled_multiselect
from transports.operator_addrs import ListenError, parse_announce_addr, parse_listen_addr, probe_port_free
from transports.pubsub.reads import BufferedNoiseTransport
from transports.pubsub.service import CachedAddrsHost, LeanPubsub
from transports.pubsub.tuning import LEAN, PubsubTuning
from transports.wire.identity import NodeIdentity

log = structlog.get_logger("edgecoder.p2p")

StreamHandler = Callable[[INetStream], Awaitable[None]]

# A loopback or LAN dial completes in milliseconds; past this the peer is not coming.
DEFAULT_DIAL_TIMEOUT = 5.0
# Opening a stream is a multistream-select round trip on an existing connection.
DEFAULT_STREAM_TIMEOUT = 5.0
# Cutting a banned peer off: its GO_AWAY and the close of its connection, no longer.
CUT_OFF_TIMEOUT = 2.0


class DialError(Exception):
    """A peer could not be reached or would not speak with us. The message says which and why."""


def noise_only(identity: NodeIdentity, *, buffered: bool = False) -> dict[TProtocol, Any]:
    """The one security option we offer and accept. The Noise static key is ephemeral per process, as upstream.
    `buffered`: `transports.pubsub.reads.BufferedNoiseTransport`, the same protocol with one socket read per buffer."""
    keypair = identity.libp2p_keypair()
    transport = BufferedNoiseTransport if buffered else NoiseTransport
    return {NOISE_PROTOCOL_ID: transport(keypair, noise_privkey=new_x25519_key_pair().private_key)}


def yamux_only() -> dict[TProtocol, Any]:
    return {TProtocol(YAMUX_PROTOCOL_ID): Yamux}


def _peer_id_of(maddr: str) -> str | None:
    """The PeerID at the end of a `/…/p2p/<id>` multiaddr, or None when `maddr` is not a multiaddr at all."""
    if not maddr.startswith("/"):
        return None
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(maddr)).peer_id.to_base58()
    except Exception as exc:  # multiaddr and libp2p raise several unrelated types for a bad address
        raise DialError(f"{maddr!r} is not a dialable /ip4/…/tcp/…/p2p/<peer id> multiaddr: {exc}") from None


def _root_cause(exc: BaseException) -> str:
    """The innermost error under a swarm dial failure (say, `protocols not supported: tried ['/yamux/1.0.0']` for a
    peer with no muxer in common), as `; because: ...`. The swarm's own message only says that no address worked."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        inner = getattr(current, "errors", None)  # libp2p's MultiError holds one error per address tried
        current = current.__cause__ or (inner[0] if isinstance(inner, list | tuple) and inner else None)
    return "" if len(seen) == 1 else f"; because: {type(seen[-1]).__name__}: {seen[-1]}"


class P2PHost:
    """A running libp2p host as the transports see it: dial, open streams, serve protocols."""

    def __init__(
        self,
        host: IHost,
        *,
        addresses: AddressBook | None = None,
        dial_timeout: float = DEFAULT_DIAL_TIMEOUT,
        stream_timeout: float = DEFAULT_STREAM_TIMEOUT,
        tuning: PubsubTuning = LEAN,
        penalties: PenaltyBox | None = None,
        refusals: Refusals | None = None,
    ) -> None:
        self.host = host
        self.addresses = addresses or AddressBook()
        self.tuning = tuning
        # The swarm's own when it is guarded (open_host), so that a ban here refuses the peer's connections there.
        swarm = host.get_network()
        self.penalties: PenaltyBox = penalties if penalties is not None else getattr(swarm, "penalties", PenaltyBox())
        self.refusals: Refusals = refusals if refusals is not None else getattr(swarm, "refusals", Refusals())
        # Set by the relay client (transports.relay): how to dial a `/p2p/RELAY/p2p-circuit/p2p/PEER` address, which
        # the swarm itself cannot (it drops relay addresses).
        self.circuit_dialer: Callable[[multiaddr.Multiaddr], Awaitable[Any]] | None = None
        self.peer_id: str = host.get_id().to_base58()
        self.dial_timeout = dial_timeout
        self.stream_timeout = stream_timeout
        self._connection_listeners = ConnectionListeners()
        host.get_network().register_notifee(self._connection_listeners)

    def on_connection(self, listener: Callable[[str, bool], None]) -> None:
        """`listener(peer_id, connected)` on every connect and disconnect; it must not block (see the notifee)."""
        self._connection_listeners.listeners.append(listener)

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs, each ending `/p2p/<our peer id>`, with the real port when we listened on port 0."""
        return [str(a) for a in self.host.get_addrs()]

    async def connect(self, maddr: str) -> str:
        """Dial a `/ip4/…/tcp/N/p2p/<id>` multiaddr; return the PeerID. Raises `DialError` on any failure."""
        if _peer_id_of(maddr) is None:
            raise DialError(f"{maddr!r} is not a multiaddr")
        info = info_from_p2p_addr(multiaddr.Multiaddr(maddr))
        peer_id = info.peer_id.to_base58()
        if peer_id == self.peer_id:
            raise DialError(f"{maddr} is this node's own address")
        if peer_id in self.connected_peers():
            return peer_id
        # Each of our dials is a real attempt: the swarm would otherwise refuse, for 60 s and without trying, a
        # peer whose addresses all failed once (its negative cache), and our own backoff would mean nothing.
        self.host.get_network().unblock_peer(info.peer_id)  # type: ignore[attr-defined]
        try:
            with trio.fail_after(self.dial_timeout):
                if is_circuit(maddr):
                    if self.circuit_dialer is None:
                        raise DialError(f"{maddr} is a relay circuit, and this node runs no relay client")
                    await self.circuit_dialer(multiaddr.Multiaddr(maddr))
                else:
                    await self.host.connect(info)
        except trio.TooSlowError:
            raise DialError(f"dialing {maddr} timed out after {self.dial_timeout:g} s") from None
        except DialError:
            raise
        except Exception as exc:  # swarm, upgrader and multiselect each raise their own types
            raise DialError(f"dialing {maddr} failed: {type(exc).__name__}: {exc}{_root_cause(exc)}") from None
        return peer_id

    async def ensure_connected(self, maddr_or_peer: str) -> str:
        """A full multiaddr is dialled (a no-op when already connected); a bare PeerID must already be connected."""
        if maddr_or_peer.startswith("/"):
            return await self.connect(maddr_or_peer)
        if maddr_or_peer not in self.connected_peers():
            raise DialError(f"not connected to {maddr_or_peer} and no address to dial it")
        return maddr_or_peer

    async def open_stream(self, peer_id: str, protocol: str) -> INetStream:
        """A new stream to a connected peer, negotiated to `protocol`. Raises `DialError` on failure."""
        try:
            with trio.fail_after(self.stream_timeout):
                return await self.host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol)])
        except trio.TooSlowError:
            raise DialError(f"opening {protocol} to {peer_id} timed out") from None
        except Exception as exc:
            raise DialError(f"opening {protocol} to {peer_id} failed: {type(exc).__name__}: {exc}") from None

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        self.host.set_stream_handler(TProtocol(protocol), handler)

    def remove_handler(self, protocol: str) -> None:
        self.host.remove_stream_handler(TProtocol(protocol))

    def new_pubsub(self, router: Any, **options: Any) -> Pubsub:
        """Pubsub over this host: services are built on the facade, never on the libp2p host beneath it.

        `LeanPubsub` as `tuning` says (coalesced writes, the scorer's view of the message being validated) and
        always aware of this host's bans; py-libp2p's own `Pubsub` for a tuning that needs neither (`STOCK`)."""
        tuning = self.tuning
        host: Any = CachedAddrsHost(self.host) if tuning.cached_addrs else self.host
        if not (tuning.coalesce_writes or tuning.scoring or tuning.early_duplicates or tuning.skip_holders):
            return Pubsub(host, router, **options)
        return LeanPubsub(
            host,
            router,
            coalesce_writes=tuning.coalesce_writes,
            early_duplicates=tuning.early_duplicates,
            skip_holders=tuning.skip_holders,
            banned=self._banned_id,
            **options,
        )

    def _banned_id(self, peer: ID) -> bool:
        # Asked for every pubsub message received: free while nobody is banned.
        return bool(self.penalties.active_bans) and self.penalties.banned(peer.to_base58())

    def banned(self, peer_id: str) -> bool:
        """Whether `peer_id` is banned for invalid messages (its connections and streams are refused)."""
        return self.penalties.banned(peer_id)

    def value_peers(self, valued: Callable[[str], bool], busy: Callable[[], set[str]]) -> None:
        """`valued` peers get an inbound place even when strangers hold them all: the connection of the newest
        stranger not in `busy` (the peers whose connections must be kept) is closed for them
        (`GuardedSwarm._make_room_for`)."""
        swarm = self.host.get_network()
        if isinstance(swarm, GuardedSwarm):
            swarm.valued = valued
            swarm.busy = busy

    async def cut_off(self, peer_id: str, reason: Refusal) -> None:
        """Count `reason` and disconnect `peer_id`, whatever task asks (a handler on that very connection included):
        the close is shielded and bounded. Its ban (on `penalties`) is the caller's, made first."""
        self.refusals(reason)
        with trio.CancelScope(shield=True), trio.move_on_after(CUT_OFF_TIMEOUT):
            await self.disconnect(peer_id)

    def connected_peers(self) -> list[str]:
        return [p.to_base58() for p in self.host.get_connected_peers()]

    async def disconnect(self, peer_id: str) -> None:
        try:
            await self.host.disconnect(ID.from_base58(peer_id))
        except Exception:  # gone already
            pass

    def peer_addrs(self, peer_id: str) -> list[str]:
        """What identify (or discovery) told us a peer can be reached at, as full multiaddrs."""
        try:
            addrs = self.host.get_peerstore().addrs(ID.from_base58(peer_id))
        except Exception:  # a peer the peerstore does not know
            return []
        return [with_peer(a, peer_id) for a in addrs]

    def serve_rendezvous(self, service_class: Callable[[IHost], Any]) -> Any:
        """A rendezvous point on this host (the service registers its own stream handler)."""
        return service_class(self.host)

    def supports(self, peer_id: str, protocol: str) -> bool:
        """Whether identify said `peer_id` serves `protocol` (False before identify has finished)."""
        try:
            return protocol in self.host.get_peerstore().get_protocols(ID.from_base58(peer_id))
        except Exception:  # the peerstore raises for a peer it does not know yet
            return False

    def observed_addrs(self) -> list[multiaddr.Multiaddr]:
        """Where peers saw our connections come from (identify), each observed at least once. Loopback is never
        recorded by libp2p."""
        manager = getattr(self.host, "_observed_addr_manager", None)  # private, no public accessor in 0.8.1
        return [] if manager is None else list(manager.addrs(min_observers=1))

    def interface_ips(self) -> list[str]:
        """The IPs of the addresses this node listens on, wildcards expanded to the interfaces'."""
        from libp2p.utils.address_validation import expand_wildcard_address

        ips = []
        for addr in self.host.get_transport_addrs():
            for concrete in expand_wildcard_address(addr) if ip_of(addr) in WILDCARDS else [addr]:
                ip = ip_of(concrete)
                if ip is not None and ip not in ips:
                    ips.append(ip)
        return ips

    def connections(self) -> list[PeerConnection]:
        """Each open connection as `/status` shows it: who, which way it was dialled, over which addresses."""
        found = []
        for peer, conns in self.host.get_network().get_connections_map().items():
            for conn in conns:
                found.append(describe_connection(peer.to_base58(), conn))
        return found


@dataclass(frozen=True, slots=True)
class PeerConnection:
    peer_id: str
    direction: str  # inbound (they dialled us), outbound (we dialled them) or unknown
    addrs: tuple[str, ...]  # the connection's transport addresses
    relayed: bool  # through a circuit relay (a /p2p-circuit address)


def describe_connection(peer_id: str, conn: Any) -> PeerConnection:
    direction = getattr(conn, "direction", None)
    name = getattr(direction, "name", str(direction or "unknown")).lower()
    try:
        addrs = tuple(str(a) for a in conn.get_transport_addresses())
    except Exception:  # a connection closing under us has no addresses left to tell
        addrs = ()
    try:  # a circuit's connection says so itself; its addresses say it too
        relayed = conn.get_connection_type().name == "RELAYED"
    except Exception:
        relayed = False
    return PeerConnection(peer_id, name, addrs, relayed or any(is_circuit(a) for a in addrs))


class ConnectionListeners(INotifee):
    """Tells listeners of each peer that connects or disconnects (`P2PHost.on_connection`). libp2p awaits notifees
    inline, so a listener must only take note (set an event, send without blocking), never wait."""

    def __init__(self) -> None:
        self.listeners: list[Callable[[str, bool], None]] = []

    def _tell(self, conn: INetConn, connected: bool) -> None:
        peer_id = conn.muxed_conn.peer_id.to_base58()
        for listener in self.listeners:
            try:
                listener(peer_id, connected)
            except Exception:  # a listener's bug must not break libp2p's connection handling
                log.exception("connection listener failed", peer=peer_id)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._tell(conn, True)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._tell(conn, False)

    async def listen(self, network: INetwork, addr: multiaddr.Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, addr: multiaddr.Multiaddr) -> None:
        return None


class PeerEventLog(INotifee):
    """Logs connects, disconnects and the node's own listen addresses coming and going: the operator's record of
    who the node talked to, from where. libp2p awaits these inline, so each only logs."""

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        info = describe_connection(conn.muxed_conn.peer_id.to_base58(), conn)
        log.info("peer connected", peer=info.peer_id, direction=info.direction, addrs=info.addrs, relayed=info.relayed)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        log.info("peer disconnected", peer=conn.muxed_conn.peer_id.to_base58())

    async def listen(self, network: INetwork, addr: multiaddr.Multiaddr) -> None:
        log.info("listening", addr=str(addr))

    async def listen_close(self, network: INetwork, addr: multiaddr.Multiaddr) -> None:
        log.info("stopped listening", addr=str(addr))


@asynccontextmanager
async def _listening(host: IHost, listen_addrs: list[multiaddr.Multiaddr]) -> AsyncIterator[None]:
    entered = False
    try:
        async with host.run(listen_addrs=listen_addrs):
            entered = True
            yield
    except Exception as exc:
        if entered:
            raise
        # The swarm wraps a failed bind in its own error types (OpenConnectionError, SwarmException, groups).
        raise ListenError(f"cannot listen on {', '.join(map(str, listen_addrs))}: {exc}") from None


async def _stop_auto_connector(host: IHost) -> None:
    # The swarm's auto-connector starts with the network and keeps dialling every peer in the peerstore (addresses
    # learned through identify included) until it holds 100 connections. A mesh node talks to the peers it chose
    # to dial and those that dialled it, nothing more; `stop()` makes its periodic and on-disconnect runs no-ops.
    auto_connector = getattr(host.get_network(), "auto_connector", None)
    if auto_connector is not None:
        await auto_connector.stop()


@asynccontextmanager
async def open_host(
    identity: NodeIdentity,
    listen: Sequence[str],
    *,
    announce: Sequence[str] = (),
    defences: Defences | None = None,
    on_refusal: RefusalSink | None = None,
    tuning: PubsubTuning | None = None,
) -> AsyncIterator[P2PHost]:
    """Build, listen and run a host for the duration of the block; on exit the network and all its tasks close.

    `announce` replaces the addresses the node tells peers (see `transports.addresses`). `defences` (by default
    `Defences()`) bounds what peers can make the host hold; each refusal is reported to `on_refusal`, by reason.
    `tuning` (by default `LEAN`) switches the overrides of `transports.pubsub`.
    Raises `ListenError` for an address it cannot listen on, or `AddressError` for a bad announce address, before
    anything is started."""
    defences = defences or Defences()
    tuning = tuning or LEAN
    listen_addrs = [parse_listen_addr(a) for a in listen]
    for maddr in listen_addrs:
        probe_port_free(maddr)
    book = AddressBook([parse_announce_addr(a) for a in announce])
    host = new_host(
        key_pair=identity.libp2p_keypair(),
        sec_opt=noise_only(identity, buffered=tuning.buffered_noise),
        muxer_opt=yamux_only(),
        connection_config=defences.connection_config(max_connections_per_peer=1),
        resource_manager=defences.resource_manager(),
        enable_mDNS=False,
        enable_upnp=False,
        listen_addrs=listen_addrs,
        addrs_factory=book,
    )
    refusals = Refusals(on_refusal)
    penalties = PenaltyBox(defences.penalties)
    install_defences(host, defences, refusals, penalties)
    install_circuit_aware_addrs(host)
    install_settled_multiselect(host)
    # Our bootstrap keeper owns the backoff between attempts; libp2p's own three retries would only stack on it.
    host.get_network().retry_config = RetryConfig(max_retries=0)  # type: ignore[attr-defined]
    host.get_network().register_notifee(PeerEventLog())
    async with _listening(host, listen_addrs):
        await _stop_auto_connector(host)
        try:
            yield P2PHost(host, addresses=book, tuning=tuning, penalties=penalties, refusals=refusals)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await close_fast(host, grace=defences.close_grace)
