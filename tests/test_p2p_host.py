"""The host: Noise only (a plaintext dialer is refused), no 250 ms dial penalty, real addresses reported."""

from __future__ import annotations

import multiaddr
import pytest
from libp2p import new_host
from libp2p.network.config import ConnectionConfig
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport

from tests.test_p2p_fakes import LOOPBACK, run_trio
from transports.p2p import DialError, P2PHost, open_host, yamux_only
from transports.wire.identity import NodeIdentity


def test_addrs_are_full_multiaddrs_with_the_real_port() -> None:
    identity = NodeIdentity.generate()

    async def main() -> None:
        async with open_host(identity, [LOOPBACK]) as host:
            assert host.peer_id == identity.peer_id  # same seed: host key = signing key
            [addr] = host.addrs
            assert addr.startswith("/ip4/127.0.0.1/tcp/")
            assert addr.endswith(f"/p2p/{identity.peer_id}")
            assert "/tcp/0/" not in addr

    run_trio(main)


def test_a_plaintext_only_dialer_is_refused_and_a_noise_dialer_connects() -> None:
    async def main() -> None:
        async with open_host(NodeIdentity.generate(), [LOOPBACK]) as ours:
            keypair = NodeIdentity.generate().libp2p_keypair()
            plaintext = new_host(
                key_pair=keypair,
                sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(keypair)},
                muxer_opt=yamux_only(),
                connection_config=ConnectionConfig(max_connections_per_peer=1),
            )
            async with plaintext.run(listen_addrs=[multiaddr.Multiaddr(LOOPBACK)]):
                with pytest.raises(DialError):
                    await P2PHost(plaintext, dial_timeout=3).connect(ours.addrs[0])
                assert plaintext.get_connected_peers() == []
                assert ours.connected_peers() == []

            async with open_host(NodeIdentity.generate(), [LOOPBACK]) as noise:
                assert await noise.connect(ours.addrs[0]) == ours.peer_id
                assert ours.peer_id in noise.connected_peers()

    run_trio(main)


def test_our_hosts_never_arm_the_250_ms_dial_fallback() -> None:
    """py-libp2p waits 250 ms on a dial-fallback timer whenever a peer may hold more than one connection; our hosts
    allow one. A pin of that override (the connect latency itself is a benchmark's business: bench_e2e.py)."""

    async def main() -> None:
        async with open_host(NodeIdentity.generate(), [LOOPBACK]) as server:
            config = server.host.get_network().connection_config  # type: ignore[attr-defined]
            assert isinstance(config, ConnectionConfig) and config.max_connections_per_peer == 1
            async with open_host(NodeIdentity.generate(), [LOOPBACK]) as client:
                assert await client.connect(server.addrs[0]) == server.peer_id

    run_trio(main)


def test_dial_failures_are_dial_errors_with_a_reason() -> None:
    async def main() -> None:
        async with open_host(NodeIdentity.generate(), [LOOPBACK]) as host:
            absent = NodeIdentity.generate().peer_id
            with pytest.raises(DialError, match=r"failed|timed out"):
                await host.connect(f"/ip4/127.0.0.1/tcp/1/p2p/{absent}")
            with pytest.raises(DialError, match="multiaddr"):
                await host.connect("/ip4/127.0.0.1/tcp/1")
            with pytest.raises(DialError, match="not connected"):
                await host.ensure_connected(absent)

    run_trio(main)
