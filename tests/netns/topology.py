"""Hosts, LANs and routers built from Linux network namespaces, for tests that need real, separate hosts.

- A **host** is a network namespace with one interface per LAN it sits on (`eth0`, `eth1`, ...) and `lo` up.
- A **LAN** is a Linux bridge inside its own "switch" namespace: the root namespace never carries a bridge, a veth,
  an address, a route or an iptables rule of ours.
- A **router** is a namespace with one interface per LAN and `ip_forward=1`. A plain router becomes the gateway (the
  default route of the LAN's hosts) of each LAN it joins; a router between routers needs `add_route`. A NAT router
  has inside LANs, whose gateway it is, and one outside LAN, where it MASQUERADEs what leaves and drops every
  connection that starts outside: hosts behind it can dial out but cannot be dialled.
- Loss, partitions and other faults are iptables rules in a host's or router's namespace, each in a chain of its own,
  added and removed at run time (`Rule`, `Partition`).

Every namespace is named `ecn-<pid>-<run>-<name>`: parallel runs never collide, and `sweep_stale()` (called by every
new `Topology`) deletes what a run that died left behind, recognised by its pid no longer existing. That check
assumes the runs share one PID namespace (one machine or container), which is how this project's tests run.

Addresses come from private ranges and exist only on interfaces inside namespaces a `Topology` created.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NETNS_DIR = Path("/run/netns")
PREFIX = "ecn"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-")
CLONE_NEWNET = 0x40000000


class NetnsError(Exception):
    """A command that builds or changes the topology failed. The message carries the command and its stderr."""


def run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` exited {result.returncode}: {result.stderr.strip()}")
    return result


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("ip", *(("-n", ns) if ns else ()), *args, check=check)


def in_ns(ns: str, *argv: str) -> list[str]:
    """The argv that runs `argv` inside namespace `ns` (`ip netns exec` execs it: the pid is the program's own)."""
    return ["ip", "netns", "exec", ns, *argv]


def netns_names() -> list[str]:
    out = ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_netns(ns: str) -> None:
    """Kill what still runs inside `ns` (only processes a topology started live there), then delete it.

    A veth has both ends inside our namespaces, so deleting the namespaces deletes the veths; the kernel frees the
    namespace once its last process is gone.
    """
    for pid in pids_in(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids_in(ns) and time.monotonic() < deadline:
        time.sleep(0.02)
    ip("netns", "delete", ns, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of runs whose process is gone (a crash, a SIGKILL). Returns what was deleted."""
    swept = []
    for ns in netns_names():
        match = _NAME.match(ns)
        if match and not _pid_alive(int(match.group(1))):
            delete_netns(ns)
            swept.append(ns)
    return swept


def netns_problem() -> str | None:
    """Why namespace tests cannot run here, or None when they can: tried for real, then undone."""
    if os.geteuid() != 0:
        return f"not running as root (euid {os.geteuid()})"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    peer = f"{probe}2"
    try:
        ip("netns", "add", probe)
        ip("netns", "add", peer)
        ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", peer, ns=probe)
        ip("link", "add", "br0", "type", "bridge", ns=probe)
        run(*in_ns(probe, "iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"))
        run(*in_ns(probe, "iptables", "-w", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                   "--probability", "0.5", "-j", "DROP"))  # fmt: skip
        run(*in_ns(probe, "iptables", "-w", "-A", "FORWARD", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"))
    except (NetnsError, OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    finally:
        for ns in (probe, peer):
            if ns in netns_names():
                delete_netns(ns)
    return None


def socket_in(ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that lives in namespace `ns`: created by a short-lived thread that `setns`es there first.

    A socket keeps the namespace it was created in, so this process can probe any host without starting one.
    """
    made: dict[str, Any] = {}

    def create() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(NETNS_DIR / ns) as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({ns}): {os.strerror(errno)}")
            made["socket"] = socket.socket(family, kind)
        except BaseException as exc:
            made["error"] = exc

    thread = threading.Thread(target=create, name=f"setns-{ns}")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    sock: socket.socket = made["socket"]
    return sock


# -- iptables rules that can be removed ----------------------------------------------------------------------------


@dataclass
class Rule:
    """iptables rules in a chain of their own, jumped to from built-in chains: removed as one, at any time."""

    where: Namespace
    table: str
    chain: str
    jumps: list[list[str]]  # each: [built-in chain, *match arguments]
    removed: bool = False

    def remove(self) -> None:
        if self.removed:
            return
        self.removed = True
        for built_in, *match in self.jumps:
            self.where.iptables("-t", self.table, "-D", built_in, *match, "-j", self.chain)
        self.where.iptables("-t", self.table, "-F", self.chain)
        self.where.iptables("-t", self.table, "-X", self.chain)

    def __enter__(self) -> Rule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@dataclass
class Partition:
    """The DROP rules that keep two sides apart (see `Topology.partition`), removed together by `heal()`."""

    rules: list[Rule]

    def heal(self) -> None:
        for rule in self.rules:
            rule.remove()

    def __enter__(self) -> Partition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()


# -- the pieces ----------------------------------------------------------------------------------------------------


@dataclass
class Interface:
    name: str  # inside its namespace: eth0, eth1, ...
    lan: Lan
    address: ipaddress.IPv4Address


@dataclass
class Lan:
    """A bridge in a switch namespace; `gateway` is the address hosts route through (None: an isolated LAN)."""

    topology: Topology
    name: str
    subnet: ipaddress.IPv4Network
    switch: str  # the switch namespace's name
    gateway: ipaddress.IPv4Address | None = None
    _next_router: int = 1
    _next_host: int = 10
    _ports: int = 0

    def allocate(self, *, router: bool) -> ipaddress.IPv4Address:
        if router:
            offset, self._next_router = self._next_router, self._next_router + 1
            if offset >= 10:
                raise NetnsError(f"LAN {self.name}: at most 9 router addresses")
        else:
            offset, self._next_host = self._next_host, self._next_host + 1
        address = self.subnet.network_address + offset
        if address not in self.subnet or address == self.subnet.broadcast_address:
            raise NetnsError(f"LAN {self.name} ({self.subnet}) is full")
        return address

    def next_port(self) -> str:
        self._ports += 1
        return f"p{self._ports}"


class Namespace:
    """What hosts and routers share: a namespace, interfaces, iptables, sockets and processes inside."""

    def __init__(self, topology: Topology, name: str, ns: str) -> None:
        self.topology = topology
        self.name = name
        self.ns = ns
        self.interfaces: list[Interface] = []
        self._chains = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {[str(i.address) for i in self.interfaces]}>"

    @property
    def address(self) -> str:
        """The address on the first LAN."""
        return str(self.interfaces[0].address)

    def address_on(self, lan: Lan) -> str:
        for interface in self.interfaces:
            if interface.lan is lan:
                return str(interface.address)
        raise NetnsError(f"{self.name} is not on LAN {lan.name}")

    def interface_on(self, lan: Lan) -> str:
        for interface in self.interfaces:
            if interface.lan is lan:
                return interface.name
        raise NetnsError(f"{self.name} is not on LAN {lan.name}")

    def attach(self, lan: Lan, *, router: bool) -> Interface:
        """A veth from this namespace to the LAN's bridge, created directly inside the two namespaces."""
        name = f"eth{len(self.interfaces)}"
        port = lan.next_port()
        address = lan.allocate(router=router)
        ip("link", "add", name, "type", "veth", "peer", "name", port, "netns", lan.switch, ns=self.ns)
        ip("link", "set", port, "master", "br0", "up", ns=lan.switch)
        ip("addr", "add", f"{address}/{lan.subnet.prefixlen}", "dev", name, ns=self.ns)
        ip("link", "set", name, "up", ns=self.ns)
        interface = Interface(name, lan, address)
        self.interfaces.append(interface)
        return interface

    def exec(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return run(*in_ns(self.ns, *argv), check=check, timeout=timeout)

    def iptables(self, *args: str) -> None:
        self.exec("iptables", "-w", *args)

    def sysctl(self, key: str, value: str) -> None:
        # net.* sysctls are per namespace: this one's, never the root namespace's.
        self.exec("sysctl", "-q", "-w", f"{key}={value}")

    def add_route(self, destination: str, via: str) -> None:
        ip("route", "add", destination, "via", via, ns=self.ns)

    def add_rule(
        self, jumps: Sequence[Sequence[str]], rules: Sequence[Sequence[str]], *, table: str = "filter"
    ) -> Rule:
        """A new chain holding `rules` (each a list of iptables arguments after `-A CHAIN`), jumped to from each of
        `jumps` ([built-in chain, *match]). The jumps go first in their chains."""
        self._chains += 1
        chain = f"ECN{self._chains}"
        self.iptables("-t", table, "-N", chain)
        for spec in rules:
            self.iptables("-t", table, "-A", chain, *spec)
        for built_in, *match in jumps:
            self.iptables("-t", table, "-I", built_in, "1", *match, "-j", chain)
        return Rule(self, table, chain, [list(j) for j in jumps])

    def add_loss(self, probability: float, *, interface: str | None = None) -> Rule:
        """Drop each packet with `probability`, independently (iptables `statistic --mode random`).

        On a host: packets in and out on every interface but `lo` (or on `interface` only). On a router, see
        `Router.add_loss`.
        """
        _check_probability(probability)
        drop = ["-m", "statistic", "--mode", "random", "--probability", f"{probability}", "-j", "DROP"]
        if interface is None:
            jumps = [["INPUT", "!", "-i", "lo"], ["OUTPUT", "!", "-o", "lo"]]
        else:
            jumps = [["INPUT", "-i", interface], ["OUTPUT", "-o", interface]]
        return self.add_rule(jumps, [drop])

    def block(self, addresses: Iterable[str]) -> Rule:
        """Drop every packet to or from `addresses`, in and out of this namespace (forwarded ones too). A local
        program's send to them fails at once with EPERM; `Topology.partition` makes packets vanish instead."""
        rules = []
        for address in addresses:
            rules += [["-s", address, "-j", "DROP"], ["-d", address, "-j", "DROP"]]
        return self.add_rule([["INPUT"], ["OUTPUT"], ["FORWARD"]], rules)

    def open_socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        return socket_in(self.ns, family, kind)

    def listen_tcp(self, port: int = 0, *, address: str | None = None) -> socket.socket:
        server = self.open_socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address or "0.0.0.0", port))
        server.listen(64)
        return server

    def tcp_connect(self, address: str, port: int, *, timeout: float = 2.0) -> socket.socket:
        """A TCP connection from this namespace; raises OSError (refused, unreachable, timed out) when none forms."""
        client = self.open_socket()
        client.settimeout(timeout)
        try:
            client.connect((address, port))
        except BaseException:
            client.close()
            raise
        return client

    def can_connect(self, address: str, port: int, *, timeout: float = 2.0) -> bool:
        try:
            self.tcp_connect(address, port, timeout=timeout).close()
        except OSError:
            return False
        return True

    def http_get(self, address: str, port: int, path: str, *, timeout: float = 5.0) -> tuple[int, str]:
        """A plain HTTP/1.0 GET from inside this namespace (the nodes' metrics listen on their own 127.0.0.1)."""
        with self.tcp_connect(address, port, timeout=timeout) as conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, body.decode(errors="replace")

    def tcp_peers(self) -> list[tuple[str, int, str, int]]:
        """Established TCP connections in this namespace: (local ip, local port, remote ip, remote port)."""
        text = self.exec("cat", "/proc/net/tcp").stdout
        return parse_proc_net_tcp(text)


class Host(Namespace):
    pass


class Router(Namespace):
    def __init__(self, topology: Topology, name: str, ns: str) -> None:
        super().__init__(topology, name, ns)
        self.outside: str | None = None  # the MASQUERADE interface of a NAT router

    def add_loss(self, probability: float, *, interface: str | None = None) -> Rule:
        """Drop each forwarded packet with `probability` (every packet crossing the router, both directions), or
        only those arriving on `interface`."""
        _check_probability(probability)
        drop = ["-m", "statistic", "--mode", "random", "--probability", f"{probability}", "-j", "DROP"]
        jumps = [["FORWARD"]] if interface is None else [["FORWARD", "-i", interface]]
        return self.add_rule(jumps, [drop])

    def cut(self, lan_a: Lan, lan_b: Lan) -> Rule:
        """Forward nothing between two LANs, either way."""
        a, b = self.interface_on(lan_a), self.interface_on(lan_b)
        return self.add_rule([["FORWARD", "-i", a, "-o", b], ["FORWARD", "-i", b, "-o", a]], [["-j", "DROP"]])


def _check_probability(probability: float) -> None:
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"loss probability must be in (0, 1], got {probability}")


def parse_proc_net_tcp(text: str) -> list[tuple[str, int, str, int]]:
    established = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "01":  # 01 = TCP_ESTABLISHED
            continue
        (local_ip, local_port), (remote_ip, remote_port) = (_hex_endpoint(f) for f in fields[1:3])
        established.append((local_ip, local_port, remote_ip, remote_port))
    return established


def _hex_endpoint(text: str) -> tuple[str, int]:
    address, port = text.split(":")
    return str(ipaddress.IPv4Address(bytes.fromhex(address)[::-1])), int(port, 16)


# -- the topology --------------------------------------------------------------------------------------------------


@dataclass
class Topology:
    """Everything one test builds. Use as a context manager (or call `close()`): all of it is deleted on exit."""

    tag: str = field(init=False)
    lans: dict[str, Lan] = field(default_factory=dict, init=False)
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    routers: dict[str, Router] = field(default_factory=dict, init=False)
    _namespaces: list[str] = field(default_factory=list, init=False)
    processes: list[Any] = field(default_factory=list, init=False)  # every NetnsProcess started in it
    _closers: list[Any] = field(default_factory=list, init=False)
    closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        sweep_stale()
        self.tag = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def namespaces(self) -> list[str]:
        """This run's namespaces that exist right now (for the cleanup check)."""
        return [ns for ns in netns_names() if ns.startswith(f"{self.tag}-")]

    def _new_namespace(self, name: str) -> str:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,15}", name):
            raise ValueError(f"namespace names are short lowercase words, got {name!r}")
        ns = f"{self.tag}-{name}"
        if ns in self._namespaces:
            raise NetnsError(f"{name} exists already in this topology")
        ip("netns", "add", ns)
        self._namespaces.append(ns)
        ip("link", "set", "lo", "up", ns=ns)
        return ns

    def lan(self, name: str, subnet: str) -> Lan:
        """A LAN: a bridge in a switch namespace of its own. `subnet` must be private (RFC 1918)."""
        network = ipaddress.IPv4Network(subnet)
        if not network.is_private or network.is_loopback or network.is_link_local:
            raise ValueError(f"{subnet} is not a private range")
        switch = self._new_namespace(f"sw_{name}")
        ip("link", "add", "br0", "type", "bridge", ns=switch)
        # mDNS and other link-local multicast should reach every port, with or without an IGMP querier.
        ip("link", "set", "br0", "type", "bridge", "mcast_snooping", "0", ns=switch)
        ip("link", "set", "br0", "up", ns=switch)
        lan = Lan(self, name, network, switch)
        self.lans[name] = lan
        return lan

    def host(self, name: str, *lans: Lan) -> Host:
        """A host on one or more LANs; its default route is the first LAN's gateway, when it has one."""
        if not lans:
            raise ValueError("a host needs at least one LAN")
        host = Host(self, name, self._new_namespace(name))
        for lan in lans:
            host.attach(lan, router=False)
        first = host.interfaces[0]
        # Multicast (mDNS) leaves through the first LAN even on a LAN without a gateway.
        ip("route", "add", "224.0.0.0/4", "dev", first.name, ns=host.ns)
        if first.lan.gateway is not None:
            ip("route", "add", "default", "via", str(first.lan.gateway), ns=host.ns)
        self.hosts[name] = host
        return host

    def router(self, name: str, lans: Sequence[Lan], *, nat_outside: Lan | None = None) -> Router:
        """A router between `lans`, and the gateway of each of them.

        With `nat_outside`, a NAT router: `lans` are its inside, `nat_outside` its outside LAN, where it takes an
        address (not the gateway role), routes by default via that LAN's gateway, MASQUERADEs what leaves, and
        drops any connection that starts outside. Hosts already on `lans` get their default route now.
        """
        router = Router(self, name, self._new_namespace(name))
        for lan in lans:
            if lan.gateway is not None:
                raise NetnsError(f"LAN {lan.name} already has a gateway ({lan.gateway})")
            interface = router.attach(lan, router=True)
            lan.gateway = interface.address
            for host in self.hosts.values():
                if host.interfaces[0].lan is lan:
                    ip("route", "add", "default", "via", str(lan.gateway), ns=host.ns)
        router.sysctl("net.ipv4.ip_forward", "1")
        if nat_outside is not None:
            outside = router.attach(nat_outside, router=True)
            router.outside = outside.name
            if nat_outside.gateway is not None:
                ip("route", "add", "default", "via", str(nat_outside.gateway), ns=router.ns)
            router.iptables("-t", "nat", "-A", "POSTROUTING", "-o", outside.name, "-j", "MASQUERADE")
            router.iptables("-A", "FORWARD", "-i", outside.name, "-m", "conntrack", "--ctstate",
                            "ESTABLISHED,RELATED", "-j", "ACCEPT")  # fmt: skip
            router.iptables("-A", "FORWARD", "-i", outside.name, "-j", "DROP")
            router.iptables("-A", "INPUT", "-i", outside.name, "-m", "conntrack", "--ctstate",
                            "ESTABLISHED,RELATED", "-j", "ACCEPT")  # fmt: skip
            router.iptables("-A", "INPUT", "-i", outside.name, "-j", "DROP")
        self.routers[name] = router
        return router

    def nat_of(self, host: Namespace) -> Router | None:
        """The NAT router whose inside LAN holds `host`'s first interface, or None."""
        lan = host.interfaces[0].lan
        for router in self.routers.values():
            is_gateway = any(i.lan is lan and i.address == lan.gateway for i in router.interfaces)
            if router.outside is not None and router is not host and is_gateway:
                return router
        return None

    def partition(self, side_a: Iterable[Host], side_b: Iterable[Host]) -> Partition:
        """Nothing passes between the two sides until `heal()`. Packets vanish on the way, as in a real partition:
        a dial times out (never a quick "Operation not permitted"), and established connections stall.

        Each packet from a host on one side to a host on the other is dropped where it can be told apart: at the
        receiver's INPUT, by its source address; or, when the sender is behind a NAT (the receiver would only see
        the router's address, shared by the NAT's other hosts), in that NAT router's FORWARD, before translation.
        """
        a, b = list(side_a), list(side_b)
        input_drops: dict[Namespace, list[list[str]]] = {}
        forward_drops: dict[Namespace, list[list[str]]] = {}
        for receivers, senders in ((a, b), (b, a)):
            for receiver in receivers:
                for sender in senders:
                    sender_nat = self.nat_of(sender)
                    if sender_nat is not None and sender_nat is not self.nat_of(receiver):
                        for src in sender.interfaces:
                            for dst in receiver.interfaces:
                                spec = ["-s", str(src.address), "-d", str(dst.address), "-j", "DROP"]
                                forward_drops.setdefault(sender_nat, []).append(spec)
                    else:
                        specs = [["-s", str(i.address), "-j", "DROP"] for i in sender.interfaces]
                        input_drops.setdefault(receiver, []).extend(specs)
        rules = [where.add_rule([["INPUT"]], specs) for where, specs in input_drops.items()]
        rules += [where.add_rule([["FORWARD"]], specs) for where, specs in forward_drops.items()]
        return Partition(rules)

    def on_close(self, closer: Any) -> None:
        """Run `closer()` first when the topology closes (process launchers register their stop here)."""
        self._closers.append(closer)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        errors: list[BaseException] = []
        for closer in reversed(self._closers):
            try:
                closer()
            except BaseException as exc:  # keep deleting: a failed stop must not leave namespaces behind
                errors.append(exc)
        for ns in reversed(self._namespaces):
            delete_netns(ns)
        left = self.namespaces()
        if left:
            raise NetnsError(f"namespaces left after cleanup: {left}")
        if errors:
            raise errors[0]


@contextlib.contextmanager
def open_topology() -> Iterator[Topology]:
    topology = Topology()
    try:
        yield topology
    finally:
        topology.close()
