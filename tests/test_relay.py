"""The relay service (`--relay-service`) is bounded: its limits reach py-libp2p's relay resources, and a reservation
past a cap is refused. Real hosts on loopback, each client reserving through the node's own `Relay` service.

(Circuits through a relay, across a NAT, are tests/test_netns_swarm.py.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import trio
from structlog.testing import capture_logs

from mesh.node import MeshNode, NodeConfig
from tests.test_p2p_fakes import LOOPBACK, wait_until
from transports.p2p import open_host
from transports.relay import HardenedRelayProtocol, Relay, RelayServiceLimits
from transports.wire.identity import NodeIdentity

CHECK_S = 0.05  # the clients' reservation rounds: short, so that the readiness waits below return soon


async def test_a_relay_node_hands_its_limits_to_py_libp2p_s_relay_resources() -> None:
    expected = RelayServiceLimits()
    config = NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none", relay_service=True)
    async with MeshNode.open(config) as relay_node:
        protocol = relay_node.relay.protocol
        assert isinstance(protocol, HardenedRelayProtocol) and protocol.allow_hop
        assert protocol.per_ip == expected.reservations_per_ip
        for limits in (protocol.limits, protocol.resource_manager.limits):
            assert limits.max_reservations == expected.max_reservations
            assert limits.reservation_ttl == expected.reservation_ttl_s
            assert limits.max_circuit_conns == expected.circuits_per_reservation
            assert limits.duration == expected.circuit_duration_s
            assert limits.data == expected.circuit_bytes
    # Every bound is finite: a relay for strangers.
    assert 0 < expected.max_reservations <= 1024 and 0 < expected.reservations_per_ip < expected.max_reservations
    assert 0 < expected.circuit_bytes <= 64 << 20 and 0 < expected.circuit_duration_s <= 3600

    async with MeshNode.open(NodeConfig(identity=NodeIdentity.generate(), sandbox_mode="none")) as plain:
        assert plain.relay.protocol is not None and not plain.relay.protocol.allow_hop  # no --relay-service


@contextlib.asynccontextmanager
async def relay_and_clients(limits: RelayServiceLimits, count: int) -> AsyncIterator[tuple[Relay, list[Relay]]]:
    """A serving relay and `count` hosts connected to it, each running a `Relay` that always reserves on it."""
    async with contextlib.AsyncExitStack() as stack:
        relay_host, *client_hosts = [
            await stack.enter_async_context(open_host(NodeIdentity.generate(), [LOOPBACK])) for _ in range(count + 1)
        ]
        async with trio.open_nursery() as nursery:
            relay = Relay(relay_host, serve=True, limits=limits)
            await nursery.start(relay.run)
            clients = []
            for client_host in client_hosts:
                client = Relay(client_host, relays=relay_host.addrs[:1], reserve="always", check_interval_s=CHECK_S)
                await nursery.start(client.run)
                await client_host.connect(relay_host.addrs[0])
                clients.append(client)
            yield relay, clients
            nursery.cancel_scope.cancel()


def refusals(logs: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for entry in logs if entry["event"] == "relay refused a reservation")


async def test_a_reservation_past_the_relay_s_cap_is_refused() -> None:
    limits = RelayServiceLimits(max_reservations=2, reservations_per_ip=8)
    with capture_logs() as logs:
        async with relay_and_clients(limits, 3) as (relay, clients):
            await wait_until(
                lambda: sum(len(c.reserved) for c in clients) == 2, what="two clients hold a reservation", timeout=20.0
            )
            await wait_until(lambda: refusals(logs) >= 1, what="the third client is refused", timeout=20.0)
            assert sorted(len(c.reserved) for c in clients) == [0, 1, 1]
            assert relay.protocol is not None and len(relay.protocol.resource_manager._reservations) == 2


async def test_reservations_from_one_ip_past_its_share_are_refused() -> None:
    limits = RelayServiceLimits(max_reservations=16, reservations_per_ip=2)
    with capture_logs() as logs:
        async with relay_and_clients(limits, 3) as (relay, clients):  # all from 127.0.0.1
            await wait_until(
                lambda: sum(len(c.reserved) for c in clients) == 2, what="two clients hold a reservation", timeout=20.0
            )
            await wait_until(
                lambda: refusals(logs) >= 1, what="the third client from the same IP is refused", timeout=20.0
            )
            assert sorted(len(c.reserved) for c in clients) == [0, 1, 1]
            assert isinstance(relay.protocol, HardenedRelayProtocol) and relay.protocol.refused["per_ip"] >= 1
