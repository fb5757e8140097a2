"""A multi-host test harness on one machine: Linux network namespaces as hosts, bridges as LANs, routers with NAT,
iptables loss and partitions, a userspace delay relay, and launchers for real `edgecoder` processes.

    with open_topology() as net:
        lan1, lan2 = net.lan("lan1", "10.77.1.0/24"), net.lan("lan2", "10.77.2.0/24")
        net.router("r", [lan1, lan2])
        a, b = net.host("a", lan1), net.host("b", lan2)
        node_a = NodeProcess(a, key_a, log_path=tmp / "a.log")
        node_b = NodeProcess(b, key_b, "--peer", node_a.addr, log_path=tmp / "b.log")

Tests that use it are marked `@pytest.mark.netns` (see tests/conftest.py for the skip-or-fail rule).
"""

from tests.netns.processes import DelayRelay, NetnsProcess, NodeProcess, OfferRun, ProcessFailed, make_key, run_offer
from tests.netns.timings import Timings
from tests.netns.topology import (
    Host,
    Lan,
    Namespace,
    NetnsError,
    Partition,
    Router,
    Rule,
    Topology,
    netns_problem,
    open_topology,
    sweep_stale,
)

__all__ = [
    "DelayRelay",
    "Host",
    "Lan",
    "Namespace",
    "NetnsError",
    "NetnsProcess",
    "NodeProcess",
    "OfferRun",
    "Partition",
    "ProcessFailed",
    "Router",
    "Rule",
    "Timings",
    "Topology",
    "make_key",
    "netns_problem",
    "open_topology",
    "run_offer",
    "sweep_stale",
]
