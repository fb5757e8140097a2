"""What this node tells peers it can be reached at: the addresses identify sends, `reply_to` carries, `/status` shows.

py-libp2p 0.8.1 announces a wildcard listener verbatim (`/ip4/0.0.0.0/...`), and identify then *replaces* a peer's
address book with it, so the address the peer dialled is forgotten (research: libp2p-network.md §7). The
`AddressBook` is the host's `addrs_factory` and decides instead:

- `--announce` addresses, when the operator gave any, are announced as they are (the operator knows the NAT's
  port mapping or the DNS name); otherwise each wildcard listener becomes one address per interface, and loopback is
  dropped when anything else is left (a peer elsewhere cannot use it);
- relay circuits this node holds a reservation on are added (`/ip4/R/tcp/P/p2p/RELAY/p2p-circuit`), so that a node
  behind NAT can be reached through them;
- confirmed observed addresses (identify, four distinct observers) are kept when nothing is announced.

`CircuitAwareHost` fixes what `get_addrs()` then does to circuit addresses: upstream strips "the /p2p/ part" using
the *first* `/p2p/` value, which on a circuit is the relay's, and so announces our PeerID at the relay's port.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

import multiaddr
from libp2p.abc import IHost
from libp2p.host.basic_host import BasicHost
from libp2p.utils.address_validation import expand_wildcard_address
from multiaddr.protocols import P_P2P

WILDCARDS = frozenset({"0.0.0.0", "::"})
CIRCUIT = "p2p-circuit"


def ip_of(addr: multiaddr.Multiaddr) -> str | None:
    for name in ("ip4", "ip6"):
        try:
            return str(addr.value_for_protocol(name))
        except Exception:  # the multiaddr package raises ProtocolLookupError (and others) for a missing part
            continue
    return None


def is_loopback(addr: multiaddr.Multiaddr) -> bool:
    ip = ip_of(addr)
    return ip is not None and ipaddress.ip_address(ip).is_loopback


def is_circuit(addr: multiaddr.Multiaddr | str) -> bool:
    return f"/{CIRCUIT}" in str(addr)


def with_peer(addr: multiaddr.Multiaddr | str, peer_id: str) -> str:
    """`addr` as a full dialable address of `peer_id`: `/p2p/<peer_id>` appended unless it ends with it already.
    (A circuit address holds the relay's `/p2p/` in its middle: "contains /p2p/" is not the test.)"""
    text = str(addr)
    return text if text.endswith(f"/p2p/{peer_id}") else f"{text}/p2p/{peer_id}"


class AddressBook:
    def __init__(self, announce: Sequence[str] = ()) -> None:
        self.announce = [multiaddr.Multiaddr(a) for a in announce]
        self._circuits: list[multiaddr.Multiaddr] = []

    @property
    def circuits(self) -> list[str]:
        return [str(c) for c in self._circuits]

    def add_circuit(self, relay_addr: str) -> None:
        """`relay_addr` is the relay's own `/…/p2p/RELAY`; the circuit through it is announced from now on."""
        circuit = multiaddr.Multiaddr(f"{relay_addr}/{CIRCUIT}")
        if circuit not in self._circuits:
            self._circuits.append(circuit)

    def remove_circuit(self, relay_addr: str) -> None:
        circuit = multiaddr.Multiaddr(f"{relay_addr}/{CIRCUIT}")
        if circuit in self._circuits:
            self._circuits.remove(circuit)

    def __call__(self, candidates: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        """The host's `addrs_factory`: called by every `get_addrs()` (identify, our own `addrs`)."""
        if self.announce:
            direct = list(self.announce)
        else:
            direct = []
            for addr in candidates:
                for concrete in expand_wildcard_address(addr) if ip_of(addr) in WILDCARDS else [addr]:
                    if concrete not in direct:
                        direct.append(concrete)
            routable = [a for a in direct if not is_loopback(a)]
            direct = routable or direct
        return direct + [c for c in self._circuits if c not in direct]


class CircuitAwareHost(BasicHost):
    """`get_addrs()` that replaces only a *trailing* `/p2p/` with our own, so circuit addresses stay intact."""

    def get_addrs(self) -> list[multiaddr.Multiaddr]:
        own = multiaddr.Multiaddr(f"/p2p/{self.get_id()!s}")
        candidates = list(self.get_transport_addrs())
        if self._observed_addr_manager is not None:
            seen = {str(a) for a in candidates}
            candidates += [a for a in self._observed_addr_manager.addrs() if str(a) not in seen]
        addrs = list(self._addrs_factory(candidates)) if self._addrs_factory is not None else candidates
        result = []
        for addr in addrs:
            protocols = [p.name for p in addr.protocols()]
            if protocols and protocols[-1] == "p2p":
                addr = addr.decapsulate_code(P_P2P)
            result.append(addr.encapsulate(own))
        return result


def install_circuit_aware_addrs(host: IHost) -> None:
    """`new_host` takes no host class, and the fix is one method: swap the class of the stock host it built."""
    if type(host) is not BasicHost:
        raise TypeError(f"expected py-libp2p's BasicHost, got {type(host).__name__}: revisit CircuitAwareHost")
    host.__class__ = CircuitAwareHost


def local_address_towards(ip: str) -> str:
    """The address of this machine's interface that routes to `ip` (a UDP `connect` sends nothing), so that a
    one-shot offerer listens where the peers it talks to can reach it back: loopback for a loopback peer."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((ip, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1" if family == socket.AF_INET else "::1"


AddrsFactory = Callable[[list[multiaddr.Multiaddr]], list[multiaddr.Multiaddr]]
