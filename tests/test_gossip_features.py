"""py-libp2p's GossipSub "v2" features as `GossipRouter` switches them, and why eclipse protection is inert in 0.8.1.

`python -m simulations scale --adaptive-gossip on|off --eclipse-protection on|off` reports the mesh with each; these
tests pin what the switches reach and what upstream does with them, so that the figures keep meaning what
docs/simulations.md says they mean.
"""

from __future__ import annotations

from tests.test_p2p_fakes import run_trio
from tests.test_p2p_gossip import check_offer, link, nodes
from transports.gossip import GossipRouter
from transports.pubsub import LEAN, STOCK
from transports.pubsub.tuning import with_gossip_features


def test_the_router_passes_both_switches_to_upstream_and_keeps_our_defaults() -> None:
    for tuning in (LEAN, STOCK):
        ours = GossipRouter(tuning)
        assert (ours.adaptive_gossip_enabled, ours.eclipse_protection_enabled) == (False, True)
        flipped = GossipRouter(with_gossip_features(tuning, adaptive_gossip=True, eclipse_protection=False))
        assert (flipped.adaptive_gossip_enabled, flipped.eclipse_protection_enabled) == (True, False)


def test_eclipse_protection_has_no_peer_ips_to_work_from_on_connected_hosts() -> None:
    """Upstream grafts for IP diversity from `scorer.ip_by_peer`, filled by `_track_peer_ip` in `add_peer`, which
    looks for the peer's stream in `pubsub.peers` before pubsub has stored it. So on hosts that are connected and
    meshed, no IP is ever recorded and `_ensure_mesh_diversity` returns nothing. The day upstream fixes this, this
    test fails and eclipse protection starts to act (on loopback, where every peer has one IP, it would then try
    to graft for diversity it cannot find): measure it again."""

    async def main() -> None:
        async with nodes([check_offer] * 3) as (a, b, c):
            await link(a, b)
            await link(a, c)
            for node in (a, b, c):
                router = node.gossip.router
                assert router.eclipse_protection_enabled
                assert router.scorer is not None and router.scorer.ip_by_peer == {}
                assert all(router._ensure_mesh_diversity(topic) == [] for topic in router.mesh)

    run_trio(main)
