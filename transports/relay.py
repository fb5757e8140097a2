"""Circuit relay v2 for nodes behind NAT, and hole punching (DCUtR) to leave the relay when the NATs allow it.

Every node runs one `Relay` service. It accepts relayed connections (the STOP protocol), lets the host dial
`/…/p2p/RELAY/p2p-circuit/p2p/PEER` addresses (`P2PHost.circuit_dialer`: the swarm itself drops relay addresses),
and runs DCUtR, which upgrades a relayed connection to a direct one by a simultaneous TCP open. With `serve=True`
(`--relay-service`) it is also a relay for others, with bounded reservations, circuits, bytes and durations.

A node reserves a slot on relays among its bootstrap peers when it is behind NAT (`reserve="auto"`): identify tells
it the address its relay saw it come from, and when that IP is none of its own interfaces' a NAT is in between. It
then announces its `/p2p-circuit` addresses, which offers' `reply_to`, identify and `/status` carry. AutoNAT is not
used: in py-libp2p 0.8.1 its dial-back reuses the existing connection and reports a NATed node public
(libp2p-network.md §5).

py-libp2p's relay hop has two bugs we correct in `HardenedRelayProtocol`: a RESERVE may name any PeerID in its
optional `peer` field (one connection could fill every slot with made-up ones), and circuits are keyed by target,
so the end of one circuit reset the others to the same target. Its per-IP limits are defined but never used; ours
bounds reservations per source IP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

import multiaddr
import structlog
import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.tools.anyio_service import background_trio_service

from transports.addresses import ip_of
from transports.operator_addrs import parse_peer_addr
from transports.p2p import DialError, P2PHost

log = structlog.get_logger("edgecoder.relay")

ReserveMode = Literal["auto", "always", "never"]


@dataclass(frozen=True, slots=True)
class RelayServiceLimits:
    """What a relay gives strangers. A circuit carries claims and results (small), not bulk data."""

    max_reservations: int = 128
    reservations_per_ip: int = 4
    reservation_ttl_s: int = 3600
    circuits_per_reservation: int = 8
    circuit_duration_s: int = 600
    circuit_bytes: int = 16 << 20

    def relay_limits(self) -> RelayLimits:
        return RelayLimits(
            duration=self.circuit_duration_s,
            data=self.circuit_bytes,
            max_circuit_conns=self.circuits_per_reservation,
            max_reservations=self.max_reservations,
            reservation_ttl=self.reservation_ttl_s,
        )


class _PerCircuit(dict[Any, Any]):
    """Stands in for the protocol's `_active_relays`, which 0.8.1 keys and tears down by target PeerID: there, one
    circuit's end reset every circuit to the same target. Here each circuit has its own key and a lookup by PeerID
    finds nothing, so only a circuit's own `_relay_data` pair ends it."""

    _next = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        _PerCircuit._next += 1
        super().__setitem__(("circuit", _PerCircuit._next), value)

    def __contains__(self, key: object) -> bool:
        return False


class HardenedRelayProtocol(CircuitV2Protocol):
    def __init__(self, host: Any, limits: RelayServiceLimits) -> None:
        super().__init__(host, limits.relay_limits(), allow_hop=True)
        self.per_ip = limits.reservations_per_ip
        self._reserved_from: dict[ID, str] = {}
        self._active_relays = _PerCircuit()
        self.refused: Counter[str] = Counter()

    async def _handle_reserve(self, stream: INetStream, msg: HopMessage) -> None:
        msg.ClearField("peer")  # the spec's RESERVE names no peer: the reserving peer is the connection's
        manager = self.resource_manager
        for peer in list(manager._reservations):  # reservations of peers gone away free their slot
            if not manager._is_peer_connected(peer):
                del manager._reservations[peer]
                self._reserved_from.pop(peer, None)
        peer = stream.muxed_conn.peer_id
        ip = _remote_ip(stream)
        held = sum(1 for p, from_ip in self._reserved_from.items() if from_ip == ip and p != peer)
        if ip is not None and held >= self.per_ip:
            self.refused["per_ip"] += 1
            refusal = HopMessage(type=HopMessage.STATUS, status=to_proto_status(StatusCode.RESOURCE_LIMIT_EXCEEDED))
            await write_delimited_msg(stream, refusal)
            return
        # Counted before the await: upstream reserves at once but answers (an await) before returning, and a
        # concurrent RESERVE from the same IP must see this one. Forgotten again if no reservation came of it.
        if ip is not None:
            self._reserved_from[peer] = ip
        try:
            await super()._handle_reserve(stream, msg)
        finally:
            if not manager.has_reservation(peer):
                self._reserved_from.pop(peer, None)

    async def _relay_data(self, src_stream: INetStream, dst_stream: INetStream, *args: Any, **kwargs: Any) -> None:
        try:
            await super()._relay_data(src_stream, dst_stream, *args, **kwargs)
        finally:  # this circuit's own two streams, and only them
            with trio.CancelScope(shield=True):
                for stream in (src_stream, dst_stream):
                    try:
                        await stream.reset()
                    except Exception:  # already reset by its other end
                        pass
            for key, streams in list(dict.items(self._active_relays)):
                if streams[0] is src_stream or streams[0] is dst_stream:
                    dict.__delitem__(self._active_relays, key)


def _remote_ip(stream: INetStream) -> str | None:
    try:
        remote = stream.muxed_conn.get_remote_address()  # type: ignore[attr-defined]
    except Exception:  # a relayed connection has no socket address of its own
        return None
    return None if not remote else str(remote[0])


class Relay:
    """The node's relay service: see the module docstring. `relays` are full multiaddrs of candidate relays (the
    bootstrap peers): a node reserves only on those that speak the hop protocol."""

    name = "relay"

    def __init__(
        self,
        host: P2PHost,
        *,
        relays: Sequence[str] = (),
        serve: bool = False,
        reserve: ReserveMode = "auto",
        limits: RelayServiceLimits | None = None,
        check_interval_s: float = 2.0,
    ) -> None:
        self.host = host
        self.serve = serve
        self.reserve_mode: ReserveMode = reserve
        self.limits = limits or RelayServiceLimits()
        self.check_interval_s = check_interval_s
        self.candidates = {parse_peer_addr(addr)[1]: addr for addr in relays}
        self.reserved: dict[str, str] = {}  # relay PeerID -> the relay address our circuit goes through
        self.protocol: CircuitV2Protocol | None = None
        self._transport: CircuitV2Transport | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        libp2p_host = self.host.host
        protocol = HardenedRelayProtocol(libp2p_host, self.limits) if self.serve else CircuitV2Protocol(libp2p_host)
        self.protocol = protocol
        # Dial with the STOP role only: with CLIENT (upstream's default) every dial makes a reservation first.
        self._transport = CircuitV2Transport(libp2p_host, protocol, RelayConfig(roles=RelayRole.STOP))
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(protocol))
            await stack.enter_async_context(background_trio_service(DCUtRProtocol(libp2p_host)))
            self.host.circuit_dialer = self._dial_circuit
            try:
                async with trio.open_nursery() as nursery:
                    task_status.started()
                    while True:
                        await self._keep_reservations(nursery)
                        await trio.sleep(self.check_interval_s)
            finally:
                self.host.circuit_dialer = None
                for relay_addr in self.reserved.values():
                    self.host.addresses.remove_circuit(relay_addr)

    async def _dial_circuit(self, maddr: multiaddr.Multiaddr) -> None:
        assert self._transport is not None
        relay_addr = str(maddr).split("/p2p-circuit", 1)[0]
        await self.host.connect(relay_addr)  # the relay first: the circuit runs over our connection to it
        await self._transport.dial(maddr)

    def behind_nat(self) -> bool:
        """True once identify says a relay saw us come from an IP that is none of our interfaces'."""
        observed = {ip for ip in map(ip_of, self.host.observed_addrs()) if ip is not None}
        if not observed:
            return False
        own = set(self.host.interface_ips())
        return not observed & own

    async def _keep_reservations(self, nursery: trio.Nursery) -> None:
        connected = set(self.host.connected_peers())
        for relay_id, relay_addr in list(self.reserved.items()):
            if relay_id not in connected:
                del self.reserved[relay_id]
                self.host.addresses.remove_circuit(relay_addr)
                log.info("relay reservation lost", relay=relay_id)
        if self.reserve_mode == "never" or (self.reserve_mode == "auto" and not self.behind_nat()):
            return
        for relay_id, relay_addr in self.candidates.items():
            if relay_id in self.reserved or relay_id not in connected:
                continue
            if not self.host.supports(relay_id, HOP_PROTOCOL):
                continue  # not a relay (no --relay-service), or identify has not finished yet
            await self._reserve(relay_id, relay_addr, nursery)

    async def _reserve(self, relay_id: str, relay_addr: str, nursery: trio.Nursery) -> None:
        assert self._transport is not None
        try:
            stream = await self.host.open_stream(relay_id, HOP_PROTOCOL)
            with trio.fail_after(10):
                ok = await self._transport.reserve(stream, ID.from_base58(relay_id), nursery)
        except (DialError, trio.TooSlowError, Exception) as exc:  # a relay's refusal comes in several types
            log.warning("relay reservation failed", relay=relay_id, error=f"{type(exc).__name__}: {exc}")
            return
        if not ok:
            log.warning("relay refused a reservation", relay=relay_id)
            return
        self.reserved[relay_id] = relay_addr
        self.host.addresses.add_circuit(relay_addr)
        log.info("relay reservation made", relay=relay_id, circuit=f"{relay_addr}/p2p-circuit")
