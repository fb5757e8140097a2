"""The addresses an operator gives (listen, announce, bootstrap peers): parsed and checked before anything runs, each
refusal an `AddressError` that names the address and what is expected."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Sequence

import multiaddr
from libp2p.peer.peerinfo import info_from_p2p_addr

from transports.addresses import WILDCARDS, ip_of


class AddressError(ValueError):
    """An address given by the operator is not one we can use; the message names it and says what is expected."""


class ListenError(AddressError):
    """The node cannot listen where it was asked to; the message names the address and the fix."""


def parse_announce_addr(text: str) -> str:
    """An address to announce: any multiaddr naming a host and a TCP port (`/ip4`, `/ip6`, `/dns4`, `/dns6`,
    `/dns`), without `/p2p` (our own PeerID is appended), or `AddressError`."""
    try:
        maddr = multiaddr.Multiaddr(text)
    except Exception as exc:  # the multiaddr package raises several unrelated types
        raise AddressError(
            f"--announce {text!r} is not a multiaddr ({exc}); expected /ip4/203.0.113.7/tcp/4001"
        ) from None
    names = [p.name for p in maddr.protocols()]
    if len(names) != 2 or names[0] not in ("ip4", "ip6", "dns", "dns4", "dns6") or names[1] != "tcp":
        raise AddressError(f"--announce {text!r} must be /ip4|/ip6|/dns4|/dns6/HOST/tcp/PORT (no /p2p: ours is added)")
    return str(maddr)


def parse_peer_addr(text: str) -> tuple[multiaddr.Multiaddr, str]:
    """A dialable `/ip4/…/tcp/N/p2p/<PeerID>` (or dns, or a relay circuit) and its PeerID, or `AddressError`."""
    if not text.startswith("/"):
        raise AddressError(f"{text!r} is not a multiaddr; expected /ip4/ADDR/tcp/PORT/p2p/<PeerID>")
    try:
        maddr = multiaddr.Multiaddr(text)
        peer_id = info_from_p2p_addr(maddr).peer_id.to_base58()
    except Exception as exc:  # multiaddr and libp2p raise several unrelated types for a bad address
        raise AddressError(f"{text!r} is not a dialable /ip4/…/tcp/…/p2p/<PeerID> multiaddr: {exc}") from None
    return maddr, peer_id


def parse_listen_addr(text: str) -> multiaddr.Multiaddr:
    """A `/ip4/ADDR/tcp/PORT` (or `/ip6/...`) multiaddr to listen on, or `ListenError`."""
    try:
        maddr = multiaddr.Multiaddr(text)
    except Exception as exc:  # the multiaddr package raises several unrelated types
        raise ListenError(f"--listen {text!r} is not a multiaddr ({exc}); expected /ip4/0.0.0.0/tcp/4001") from None
    protocols = [p.name for p in maddr.protocols()]
    if len(protocols) != 2 or protocols[0] not in ("ip4", "ip6") or protocols[1] != "tcp":
        raise ListenError(f"--listen {text!r} must be /ip4/ADDR/tcp/PORT or /ip6/ADDR/tcp/PORT")
    return maddr


def listens_beyond_loopback(listen: Sequence[str]) -> bool:
    """Whether any listen address is reachable from another machine (a wildcard, or a non-loopback address)."""
    for text in listen:
        ip = ip_of(parse_listen_addr(text))
        if ip is not None and (ip in WILDCARDS or not ipaddress.ip_address(ip).is_loopback):
            return True
    return False


def probe_port_free(maddr: multiaddr.Multiaddr) -> None:
    """Refuse a port another process already listens on.

    py-libp2p binds with SO_REUSEPORT (DCUtR hole punching dials from the listen port), so a second node on a busy
    port would silently share it with the first. Linux lets sockets share a port only when every one of them sets
    SO_REUSEPORT, so a plain bind here fails exactly when something already holds the port.
    """
    family = socket.AF_INET6 if maddr.protocols()[0].name == "ip6" else socket.AF_INET
    host = maddr.value_for_protocol(maddr.protocols()[0].code)
    port = int(maddr.value_for_protocol("tcp"))
    if port == 0:
        return
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT after a restart is no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenError(f"port {port} on {host} is already in use: pick another --listen port") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ListenError(f"{host} is not an address of this machine: pick one it has") from None
            if exc.errno == errno.EACCES:
                raise ListenError(f"port {port} needs privileges: use a port above 1023") from None
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
