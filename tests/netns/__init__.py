"""A multi-host test harness on one machine: Linux network namespaces as hosts, bridges as LANs, routers with NAT,
iptables loss and partitions, a userspace delay relay, and launchers for real `edgecoder` processes.

    with open_topology() as net:                                  # everything is deleted on exit
        public, home = net.lan("public", "10.77.1.0/24"), net.lan("home", "192.168.77.0/24")
        net.router("nat", [home], nat_outside=public)             # MASQUERADE out; nothing dials in
        seed_host, relay_host, inside = net.host("seed", public), net.host("relay", public), net.host("inside", home)
        seed = NodeProcess(seed_host, make_key(tmp / "seed.key"), log_path=tmp / "seed.log")   # waits for `ready`
        slow = DelayRelay(relay_host, (seed_host.address, 4001), delay_ms=50, log_path=tmp / "relay.log")
        runner = NodeProcess(inside, make_key(tmp / "in.key"), "--peer", slow.multiaddr(seed.peer_id),
                             log_path=tmp / "in.log")
        with net.partition([inside], [seed_host, relay_host]):    # packets vanish until the block ends
            ...
        offer = run_offer(inside, key, code, "--to", seed.addr, input_json='{"xs": [2, 3]}')
        seed.answered()                                           # its "offer answered" log records

- topology.py: `Topology` (`lan`, `host`, `router`, `partition`), `Host`/`Router` (`add_loss`, `block`, `cut`,
  `add_rule`, `add_route`, sockets inside the namespace: `open_socket`, `tcp_connect`, `can_connect`, `http_get`).
- processes.py: `NodeProcess` (ready, events, logs, metrics, `wait_connected`, `restart`), `run_offer` and
  `OfferProcess` (in the background, `finish()`), `DelayRelay`, `NetnsProcess` for any other program.
- timings.py: `Timings`, the figures a scenario prints and writes under /tmp.

Tests that use it are marked `@pytest.mark.netns` (see tests/conftest.py for the skip-or-fail rule).
"""

from tests.netns.processes import (
    DelayRelay,
    NetnsProcess,
    NodeProcess,
    OfferProcess,
    OfferRun,
    ProcessFailed,
    make_key,
    run_offer,
)
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
    "OfferProcess",
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
