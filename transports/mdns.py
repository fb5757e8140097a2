"""Finding peers on the same LAN by mDNS, on the interfaces the node listens on, announcing addresses they can dial.

py-libp2p 0.8.1's own mDNS (`new_host(enable_mDNS=True)`) listens on every interface with no way to choose, puts
port 4001 in its SRV record whatever we listen on, announces a 0.0.0.0 listener verbatim (so peers found it and
could not dial it), asks the route to 8.8.8.8 for its A record, and hands what it finds to a process-wide
singleton on zeroconf's thread (libp2p-network.md §6). We assemble its building blocks instead: one `Zeroconf` on
our own interfaces, a broadcaster given our expanded addresses, and a listener whose discoveries go to this node's
callback on the Trio side.

mDNS is unauthenticated: what it says is a hint. Dialling the address checks the PeerID (Noise), so a liar can only
make us try a dial.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

import structlog
import trio
from libp2p.discovery.mdns.broadcaster import PeerBroadcaster
from libp2p.discovery.mdns.listener import PeerListener
from libp2p.discovery.mdns.mdns import SERVICE_TYPE
from libp2p.discovery.mdns.utils import stringGen
from libp2p.peer.peerinfo import PeerInfo
from zeroconf import IPVersion, ServiceInfo, Zeroconf

from transports.addresses import is_circuit, with_peer
from transports.p2p import P2PHost

log = structlog.get_logger("edgecoder.mdns")

# (PeerID, full multiaddrs ending /p2p/<PeerID>) of a peer found on the LAN.
FoundFn = Callable[[str, list[str]], None]


def lan_ips(ips: Sequence[str]) -> list[str]:
    """The IPv4 addresses mDNS should run on: not loopback (nobody else is there), not link-local."""
    chosen = []
    for ip in ips:
        address = ipaddress.ip_address(ip)
        if address.version == 4 and not address.is_loopback and not address.is_link_local:
            chosen.append(ip)
    return chosen


class _Broadcaster(PeerBroadcaster):
    """Our interface IPs in the A records, instead of upstream's route lookup towards 8.8.8.8."""

    def __init__(self, *args: Any, interface_ips: list[str], **kwargs: Any) -> None:
        self._interface_ips = interface_ips
        super().__init__(*args, **kwargs)

    def _get_local_ips(self) -> list[str]:
        return list(self._interface_ips)


class _Listener(PeerListener):
    """Upstream's listener, with each discovery handed to one callback instead of a process-wide singleton (several
    nodes in one process, as tests and simulations run them, would each hear every other node's discoveries)."""

    def __init__(self, *args: Any, on_peer: Callable[[PeerInfo], None], **kwargs: Any) -> None:
        self._on_peer = on_peer
        super().__init__(*args, **kwargs)

    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        if name == self.service_name or type_ != self.service_type:
            return
        info: ServiceInfo | None = self._get_service_info_with_retry(zc, type_, name)
        peer = None if info is None else self._extract_peer_info(info)
        if peer is not None:
            self._on_peer(peer)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.add_service(zc, type_, name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        """A peer that left: nothing to forget here (upstream clears the peerstore, and with it every address of that
        peer we learnt elsewhere); the connection manager notices the disconnect."""


class LanDiscovery:
    name = "mdns"

    def __init__(self, host: P2PHost, on_found: FoundFn) -> None:
        self.host = host
        self.on_found = on_found
        self.found: set[str] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        interfaces = lan_ips(self.host.interface_ips())
        if not interfaces:
            log.info("mdns off: the node listens on no LAN interface")
            task_status.started()
            await trio.sleep_forever()
        announce = [a.rsplit("/p2p/", 1)[0] for a in self.host.addrs if not is_circuit(a)]
        token = trio.lowlevel.current_trio_token()
        own = self.host.peer_id

        def on_peer(peer: PeerInfo) -> None:  # on zeroconf's thread: cross to Trio, never dial from here
            peer_id = peer.peer_id.to_base58()
            if peer_id != own:
                addrs = [with_peer(a, peer_id) for a in peer.addrs]
                token.run_sync_soon(self._found, peer_id, addrs)

        zeroconf = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only))
        service_name = f"{stringGen(63)}.{SERVICE_TYPE}"
        broadcaster = _Broadcaster(
            zeroconf, SERVICE_TYPE, service_name, own, port=0, listen_addrs=announce, interface_ips=interfaces
        )
        listener: _Listener | None = None
        try:
            await trio.to_thread.run_sync(broadcaster.register)
            listener = _Listener(self.host.host.get_peerstore(), zeroconf, SERVICE_TYPE, service_name, on_peer=on_peer)
            log.info("mdns on", interfaces=interfaces, announce=announce)
            task_status.started()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close, zeroconf, broadcaster, listener)

    @staticmethod
    def _close(zeroconf: Zeroconf, broadcaster: PeerBroadcaster, listener: PeerListener | None) -> None:
        try:
            broadcaster.unregister()
        finally:
            if listener is not None:
                listener.stop()
            zeroconf.close()

    def _found(self, peer_id: str, addrs: list[str]) -> None:
        if peer_id not in self.found:
            self.found.add(peer_id)
            log.info("peer found by mdns", peer=peer_id, addrs=addrs)
        self.on_found(peer_id, addrs)
