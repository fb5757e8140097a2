"""Rendezvous at the seeds: how a node finds peers beyond its bootstrap list and its LAN.

Every node serves the rendezvous protocol, bounded (`BoundedRendezvousService`), so any node can be a seed; a node
registers its announced addresses (circuits included) in our namespace at each bootstrap peer that serves it, and
asks each for the others registered there, handing them to the connection manager. Registrations are refreshed
before their TTL ends; discovery repeats every `discover_every_s`.

Why rendezvous and not the DHT (libp2p-network.md §6): the seeds are already the set a node trusts to find the
swarm; a registration costs one message every hour, a lookup one round trip; py-libp2p's Kademlia works but keeps
an empty routing table until the first query, returns duplicate providers, and brings table maintenance we do not
need at this scale. GossipSub's peer exchange helps too, but only when a peer leaves a topic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import trio
import varint
from google.protobuf.message import DecodeError
from libp2p.abc import INetStream
from libp2p.discovery.rendezvous.client import RendezvousClient
from libp2p.discovery.rendezvous.config import MAX_MESSAGE_SIZE, RENDEZVOUS_PROTOCOL
from libp2p.discovery.rendezvous.pb.rendezvous_pb2 import Message
from libp2p.discovery.rendezvous.service import RendezvousService
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.peer.id import ID
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from transports.addresses import with_peer
from transports.p2p import P2PHost

log = structlog.get_logger("edgecoder.rendezvous")

NAMESPACE = "edgecoder/mesh/1"
REGISTRATION_TTL_S = 2 * 3600
# A rendezvous point keeps at most this many registrations (upstream's own per-namespace cap is the same).
MAX_REGISTRATIONS = 1000

FoundFn = Callable[[str, list[str]], None]


class BoundedRendezvousService(RendezvousService):
    """Upstream's service takes any namespace and keeps namespaces without bound: one peer could register under a
    million. Ours serves only our namespace. Its stream loop is ours too: upstream's logs every client's ordinary
    close at ERROR level (a yamux EOF is not the `IncompleteReadError` it expects), which buried real errors."""

    def _handle_register(self, peer_id: Any, register_msg: Any) -> Any:
        if register_msg.ns != NAMESPACE:
            register_msg.ns = ""  # refused by upstream's own validation as an invalid namespace
        return super()._handle_register(peer_id, register_msg)

    async def _handle_stream(self, stream: INetStream) -> None:
        peer_id = stream.muxed_conn.peer_id
        try:
            while True:
                try:
                    request = Message()
                    request.ParseFromString(await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE_SIZE))
                except (IOException, MessageTooLarge, DecodeError):  # closed, reset, oversized or garbled: done
                    return
                if request.type == Message.REGISTER:
                    response = self._handle_register(peer_id, request.register)
                elif request.type == Message.DISCOVER:
                    response = self._handle_discover(peer_id, request.discover)
                elif request.type == Message.UNREGISTER:
                    self._handle_unregister(peer_id, request.unregister)
                    continue
                else:
                    return
                payload = response.SerializeToString()
                await stream.write(varint.encode(len(payload)) + payload)
        except IOException:
            return  # the client went away mid-answer
        finally:
            try:
                await stream.close()
            except Exception:  # already reset by the client
                pass


class Rendezvous:
    name = "rendezvous"

    def __init__(
        self,
        host: P2PHost,
        *,
        seeds: Callable[[], list[str]],
        on_found: FoundFn,
        serve: bool = True,
        register: bool = True,
        discover_every_s: float = 60.0,
        check_interval_s: float = 2.0,
    ) -> None:
        self.host = host
        self.seeds = seeds  # PeerIDs of the bootstrap peers we are connected to
        self.on_found = on_found
        self.serve = serve
        self.register = register  # a one-shot offerer looks around but does not advertise itself
        self.discover_every_s = discover_every_s
        self.check_interval_s = check_interval_s
        self._registered: dict[str, float] = {}  # seed -> when to refresh
        self._registered_addrs: dict[str, list[str]] = {}  # seed -> the addresses it holds for us
        self._next_discovery: dict[str, float] = {}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.serve:
            self.host.serve_rendezvous(BoundedRendezvousService)
        try:
            task_status.started()
            while True:
                await self._round()
                await trio.sleep(self.check_interval_s)
        finally:
            if self.serve:
                self.host.remove_handler(str(RENDEZVOUS_PROTOCOL))

    async def _round(self) -> None:
        now = trio.current_time()
        for seed in self.seeds():
            if not self.host.supports(seed, RENDEZVOUS_PROTOCOL):
                continue
            client = RendezvousClient(self.host.host, ID.from_base58(seed))
            # Registered again before the TTL is half gone, and at once when our addresses change (a relay
            # reservation adds the circuit that is the only way to reach us from outside a NAT).
            addrs = self.host.addrs
            stale = self._registered_addrs.get(seed) != addrs
            if self.register and (stale or self._registered.get(seed, 0.0) <= now):
                try:
                    with trio.fail_after(10):
                        ttl = await client.register(NAMESPACE, REGISTRATION_TTL_S)
                    self._registered[seed] = now + ttl / 2
                    self._registered_addrs[seed] = addrs
                    self._next_discovery[seed] = now  # a new registration is also the moment to look around
                except Exception as exc:  # the client raises RendezvousError, ValueError and stream errors
                    log.info("rendezvous registration failed", seed=seed, error=f"{type(exc).__name__}: {exc}")
                    self._registered[seed] = now + 30.0
            if self._next_discovery.get(seed, 0.0) <= now:
                self._next_discovery[seed] = now + self.discover_every_s
                await self._discover(client, seed)

    async def _discover(self, client: RendezvousClient, seed: str) -> None:
        try:
            with trio.fail_after(10):
                peers, _ = await client.discover(NAMESPACE, limit=100)
        except Exception as exc:
            log.info("rendezvous discovery failed", seed=seed, error=f"{type(exc).__name__}: {exc}")
            return
        for peer in peers:
            peer_id = peer.peer_id.to_base58()
            if peer_id == self.host.peer_id:
                continue
            addrs = [with_peer(a, peer_id) for a in peer.addrs]
            self.on_found(peer_id, addrs)
