"""The namespace harness itself: routing, NAT, loss, partitions, the delay relay, cleanup and the skip-or-fail rule.

Everything here is probed with plain Python sockets created inside the namespaces (there is no ping), and every
address dialled belongs to an interface inside a namespace the test created.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail
from tests.netns import (
    DelayRelay,
    Host,
    NetnsProcess,
    NodeProcess,
    ProcessFailed,
    Topology,
    make_key,
    open_topology,
    sweep_stale,
)
from tests.netns.processes import REPO
from tests.netns.topology import ip, netns_names, parse_proc_net_tcp

pytestmark = pytest.mark.netns

PORT = 7000


@pytest.fixture
def net() -> Iterator[Topology]:
    with open_topology() as topology:
        yield topology


def routed(net: Topology) -> tuple[Host, Host, Host]:
    """Two LANs joined by a router: a and c on lan1, b on lan2."""
    lan1, lan2 = net.lan("lan1", "10.77.1.0/24"), net.lan("lan2", "10.77.2.0/24")
    net.router("r", [lan1, lan2])
    return net.host("a", lan1), net.host("b", lan2), net.host("c", lan1)


def accept_one(server: socket.socket, timeout: float = 5.0) -> tuple[socket.socket, tuple[str, int]]:
    server.settimeout(timeout)
    conn, peer = server.accept()
    return conn, peer


def test_hosts_on_two_subnets_talk_across_the_router(net: Topology) -> None:
    a, b, _ = routed(net)
    assert a.address.startswith("10.77.1.") and b.address.startswith("10.77.2.")
    with b.listen_tcp(PORT) as server, a.tcp_connect(b.address, PORT) as client:
        conn, peer = accept_one(server)
        with conn:
            client.sendall(b"across")
            assert conn.recv(16) == b"across"
    assert peer[0] == a.address  # routed, not translated
    # The root namespace has no route into these subnets: the hosts are reachable only from their own network.
    assert "10.77." not in ip("route", "show").stdout


def test_nat_lets_the_inside_dial_out_and_nobody_dial_in(net: Topology) -> None:
    public, home = net.lan("public", "10.77.10.0/24"), net.lan("home", "192.168.77.0/24")
    nat = net.router("nat", [home], nat_outside=public)
    outside, inside = net.host("outside", public), net.host("inside", home)

    with outside.listen_tcp(PORT) as server, inside.tcp_connect(outside.address, PORT):
        conn, peer = accept_one(server)
        conn.close()
    assert peer[0] == nat.address_on(public), "MASQUERADE: the outside sees the router's address, not the host's"

    with inside.listen_tcp(PORT):
        assert not outside.can_connect(inside.address, PORT, timeout=1)  # the outside has no route in
        # Even a neighbour that knows the inside range and routes it to the NAT router is dropped there.
        outside.add_route(str(home.subnet), nat.address_on(public))
        assert not outside.can_connect(inside.address, PORT, timeout=1)
        assert not outside.can_connect(nat.address_on(public), 22, timeout=1)


def test_link_local_multicast_reaches_the_whole_bridge_and_stops_at_the_router(net: Topology) -> None:
    """What mDNS needs: a datagram to 224.0.0.251:5353 reaches every host on the LAN, and no other LAN."""
    a, b, c = routed(net)
    group, port = "224.0.0.251", 5353

    def member(host: Host) -> socket.socket:
        rx = host.open_socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.bind((group, port))
        membership = socket.inet_aton(group) + socket.inet_aton(host.address)
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        rx.settimeout(1)
        return rx

    listeners = {h.name: member(h) for h in (b, c)}
    with a.open_socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
        tx.sendto(b"who is there", (group, port))
    try:
        data, sender = listeners["c"].recvfrom(64)
        assert data == b"who is there" and sender[0] == a.address  # c shares a's bridge
        with pytest.raises(TimeoutError):
            listeners["b"].recvfrom(64)  # b is behind the router: link-local multicast is never forwarded
    finally:
        for rx in listeners.values():
            rx.close()


def measure_udp_loss(sender: Host, receiver: Host, count: int = 2000, batch: int = 50) -> float:
    """Send `count` numbered datagrams in batches, each batch drained before the next (so no queue on the way
    overflows), and return the fraction that never arrived."""
    rx = receiver.open_socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = sender.open_socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((receiver.address, PORT))
        rx.settimeout(0.05)  # a batch is over when nothing more came for 50 ms
        seen: set[int] = set()
        for start in range(0, count, batch):
            for seq in range(start, min(start + batch, count)):
                try:
                    tx.sendto(seq.to_bytes(4, "big"), (receiver.address, PORT))
                except PermissionError:  # dropped by the sender's own OUTPUT chain, which says so (EPERM)
                    pass
            expected = set(range(start, min(start + batch, count)))
            while not expected <= seen:
                try:
                    data = rx.recv(16)
                except TimeoutError:
                    break
                seen.add(int.from_bytes(data, "big"))
        return 1 - len(seen) / count


def test_random_loss_drops_about_the_configured_fraction(net: Topology) -> None:
    a, b, c = routed(net)
    assert measure_udp_loss(a, b) == 0.0  # the measurement itself loses nothing
    p = 0.2
    # Binomial spread at n=2000, p=0.2 is 0.009; the bound is five and a half of those.
    with net.routers["r"].add_loss(p):
        forwarded = measure_udp_loss(a, b)
        assert abs(forwarded - p) < 0.05, forwarded
        assert measure_udp_loss(a, c) == 0.0  # same LAN, not through the router: untouched
    with a.add_loss(p):
        sent = measure_udp_loss(a, c)
        assert abs(sent - p) < 0.05, sent
    assert measure_udp_loss(a, b) == 0.0  # both rules removed
    print(f"\nmeasured loss: router p={p}: {forwarded:.3f}; host p={p}: {sent:.3f}")


def test_partition_cuts_both_ways_and_heals(net: Topology) -> None:
    a, b, c = routed(net)
    servers = {h.name: h.listen_tcp(PORT) for h in (a, b, c)}
    try:
        assert a.can_connect(b.address, PORT) and b.can_connect(a.address, PORT)
        split = net.partition([a], [b])
        assert not a.can_connect(b.address, PORT, timeout=1)
        assert not b.can_connect(a.address, PORT, timeout=1)
        assert a.can_connect(c.address, PORT) and b.can_connect(c.address, PORT)  # only a-b is cut
        split.heal()
        assert a.can_connect(b.address, PORT) and b.can_connect(a.address, PORT)

        began = time.monotonic()
        with net.partition([a], [b]):
            assert not a.can_connect(b.address, PORT, timeout=0.5)
        assert time.monotonic() - began >= 0.5, "the dial must time out (packets vanish), not fail at once"

        with net.routers["r"].cut(net.lans["lan1"], net.lans["lan2"]):
            assert not a.can_connect(b.address, PORT, timeout=1) and not b.can_connect(c.address, PORT, timeout=1)
            assert a.can_connect(c.address, PORT)  # same LAN: the router is not on the path
        assert a.can_connect(b.address, PORT)
    finally:
        for server in servers.values():
            server.close()


def test_a_partition_cuts_a_host_behind_nat_and_spares_its_neighbour(net: Topology) -> None:
    public, home = net.lan("public", "10.77.10.0/24"), net.lan("home", "192.168.77.0/24")
    nat = net.router("nat", [home], nat_outside=public)
    seed, inside, neighbour = net.host("seed", public), net.host("inside", home), net.host("neighbour", home)
    assert net.nat_of(inside) is nat and net.nat_of(seed) is None
    with seed.listen_tcp(PORT), neighbour.listen_tcp(PORT):
        with net.partition([inside], [seed]):
            assert not inside.can_connect(seed.address, PORT, timeout=0.5)  # dropped in the NAT, before translation
            assert neighbour.can_connect(seed.address, PORT)  # the same NAT address, another host: untouched
            assert inside.can_connect(neighbour.address, PORT)
        assert inside.can_connect(seed.address, PORT)


def echo_server(server: socket.socket) -> threading.Thread:
    """Echo one connection until its EOF, then close it (which ends the client's read)."""

    def serve() -> None:
        conn, _ = accept_one(server)
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def round_trip(client: socket.socket, payload: bytes) -> float:
    began = time.monotonic()
    client.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += client.recv(65536)
    assert got == payload
    return time.monotonic() - began


def test_the_delay_relay_adds_at_least_its_delay_each_way_and_keeps_the_bytes(net: Topology, tmp_path: Path) -> None:
    a, b, c = routed(net)
    delay_ms = 150
    with b.listen_tcp(PORT) as direct_server, b.listen_tcp(PORT + 1) as relayed_server:
        echo_server(direct_server)
        echo_server(relayed_server)
        relay = DelayRelay(c, (b.address, PORT + 1), delay_ms, log_path=tmp_path / "relay.log")
        with a.tcp_connect(b.address, PORT, timeout=5) as client:
            direct = round_trip(client, b"ping")
        with a.tcp_connect(relay.address, relay.port, timeout=5) as client:
            client.settimeout(10)
            relayed = round_trip(client, b"ping")
            big = os.urandom(1 << 20)  # a megabyte, in many chunks: order and content kept
            round_trip(client, big)
            client.shutdown(socket.SHUT_WR)  # the EOF travels through, and the server's close travels back
            assert client.recv(16) == b""
        assert relay.stop() == 0
    print(f"\nround trip: direct {direct * 1000:.2f} ms, through a {delay_ms} ms relay {relayed * 1000:.1f} ms")
    assert relayed >= 2 * delay_ms / 1000  # a lower bound by construction, not a speed target


def test_the_node_launcher_waits_for_ready_stops_cleanly_restarts_and_reports_failures(
    net: Topology, tmp_path: Path
) -> None:
    """`edgecoder node` in a namespace (SANDBOX_MODE=none: no Docker needed to test the launcher itself)."""
    a, b, _ = routed(net)
    env = {"SANDBOX_MODE": "none"}
    key = make_key(tmp_path / "a.key")
    node = NodeProcess(a, key, env=env, log_path=tmp_path / "a.log", name="A")
    assert node.addr == f"/ip4/{a.address}/tcp/4001/p2p/{node.peer_id}" and node.ready.data["sandboxMode"] == "none"
    assert node.metric("edgecoder_participating") == 0.0  # read from inside its namespace, on its own 127.0.0.1
    peer = NodeProcess(b, make_key(tmp_path / "b.key"), "--peer", node.addr, env=env, log_path=tmp_path / "b.log")
    assert peer.connected_to(a)

    again = node.restart()
    assert node.popen.returncode == 0, f"exit {node.popen.returncode}: {node.stderr()[-3000:]}"
    assert node.wait_event("stopped", timeout=1)
    assert (again.peer_id, again.addr) == (node.peer_id, node.addr)  # same key, same port
    assert again.log_path != node.log_path and "shutting down" in node.stderr()

    loose = tmp_path / "loose.key"
    loose.write_bytes(b"\x01" * 32)
    loose.chmod(0o644)
    with pytest.raises(ProcessFailed, match=r"(?s)exited 2.*loose permissions"):
        NodeProcess(a, loose, env=env, port=4002, log_path=tmp_path / "bad.log", name="bad")


def test_teardown_deletes_every_namespace_and_process_of_the_run(tmp_path: Path) -> None:
    root_links_before = set(ip("-o", "link", "show").stdout.split("\n"))
    with open_topology() as net:
        a, _, _ = routed(net)
        public = net.lan("public", "10.77.10.0/24")
        home = net.lan("home", "192.168.77.0/24")
        net.router("nat", [home], nat_outside=public)
        net.host("inside", home)
        net.routers["r"].add_loss(0.1)
        sleeper = NetnsProcess(a, [sys.executable, "-c", "import time; time.sleep(600)"], log_path=tmp_path / "s")
        tag = net.tag
        assert len(net.namespaces()) == 4 + 2 + 4  # switches, routers, hosts
    assert not [ns for ns in netns_names() if ns.startswith(tag)]
    assert sleeper.popen.poll() is not None
    # Nothing ever appeared in the root namespace (docker's own veths come and go; ours never live there).
    new_links = [line for line in set(ip("-o", "link", "show").stdout.split("\n")) - root_links_before if line]
    assert not [line for line in new_links if "veth" not in line], new_links


def test_a_dead_runs_namespaces_are_swept_and_a_live_runs_are_not() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # reaped: that pid no longer exists
    stale, live = f"ecn-{dead_pid}-abc123-left", f"ecn-{os.getpid()}-abc123-mine"
    ip("netns", "add", stale)
    ip("netns", "add", live)
    try:
        sweep_stale()  # a parallel run's own sweep may have taken the stale one first: either way it is gone
        assert stale not in netns_names()
        assert live in netns_names()
    finally:
        for ns in (stale, live):
            if ns in netns_names():
                ip("netns", "delete", ns)


def test_proc_net_tcp_parsing() -> None:
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0A014D0A:0FA1 0A024D0A:C350 01 00000000:00000000 00:00000000 00000000     0        0 1\n"
        "   1: 0A014D0A:0FA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2\n"
    )
    # Established only (01; 0A is LISTEN), addresses little-endian as the kernel prints them.
    assert parse_proc_net_tcp(text) == [("10.77.1.10", 4001, "10.77.2.10", 50000)]


RULE_TARGET = "tests/test_netns_harness.py::test_hosts_on_two_subnets_talk_across_the_router"


def run_rule(prefix: list[str], env: dict[str, str], *, required: bool) -> subprocess.CompletedProcess[str]:
    """One netns test in a child pytest, with or without EDGECODER_REQUIRE_NETNS=1."""
    env = {k: v for k, v in env.items() if k != "EDGECODER_REQUIRE_NETNS"}
    if required:
        env["EDGECODER_REQUIRE_NETNS"] = "1"
    argv = [*prefix, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", RULE_TARGET]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def assert_skips_then_fails(prefix: list[str], env: dict[str, str], reason: str) -> None:
    skipped = run_rule(prefix, env, required=False)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout + skipped.stderr
    assert f"needs root and iproute2/iptables: {reason}" in skipped.stdout, skipped.stdout
    failed = run_rule(prefix, env, required=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"EDGECODER_REQUIRE_NETNS=1 but needs root and iproute2/iptables: {reason}" in failed.stdout, failed.stdout


def test_without_iproute2_netns_tests_skip_with_the_reason_or_fail_when_required() -> None:
    """The conftest rule, on a machine whose PATH has no `ip`: a clear skip, and a failure when required."""
    assert_skips_then_fails([], {**os.environ, "PATH": "/nonexistent"}, "`ip` is not installed")


def test_without_root_netns_tests_skip_with_the_reason_or_fail_when_required() -> None:
    """The same rule seen by a developer without root (uid 65534), where that user can read this checkout."""
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    readable = subprocess.run([*as_nobody, sys.executable, "-c", f"open({str(REPO / 'tests/conftest.py')!r})"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    if readable.returncode != 0:
        problem = f"uid 65534 cannot run this checkout's Python or read its files: {readable.stderr.strip()[-200:]}"
        skip_or_fail(problem, "EDGECODER_REQUIRE_NETNS")
    assert_skips_then_fails(as_nobody, {**os.environ, "HOME": "/tmp"}, "not running as root (euid 65534)")
