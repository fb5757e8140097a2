"""GossipSub peer scoring with real thresholds, over real connections: issue 11's invalid-gossip flood, reproduced
on py-libp2p's neutral scoring first, then cut off by ours; IGNORE (no penalty for refusals of our clock or policy);
the graylist report; the ban outliving the score py-libp2p forgets on disconnect."""

from __future__ import annotations

from libp2p.peer.id import ID

from tests.hardening_support import RefusalLog
from tests.pubsub_support import GossipFlooder, gossip_node, make_offer
from tests.test_p2p_fakes import run_trio, wait_until
from transports.gossip import OFFERS_TOPIC
from transports.hardening import Refusal
from transports.pubsub import STOCK, GossipScorer, score_params
from transports.pubsub.scoring import GRAYLIST_THRESHOLD
from transports.wire.identity import NodeIdentity
from transports.wire.offers import now_ms
from transports.wire.reasons import Rejection

FLOOD_RATE = 250.0  # bad-signature offers a second, about issue 11's 247


def accept_anything(raw: bytes) -> Rejection | None:
    return None


def test_a_peer_flooding_bad_signature_offers_is_cut_off_refused_on_redial_and_honest_offers_keep_flowing() -> None:
    async def main() -> None:
        refusals = RefusalLog()
        async with gossip_node() as honest, gossip_node(on_refusal=refusals) as victim, GossipFlooder.open() as bad:
            await honest.host.connect(victim.addr)
            await wait_until(lambda: honest.host.peer_id in victim.gossip.mesh_peers(), what="offers mesh")
            assert await bad.connect(victim.addr)
            victim_id = ID.from_base58(victim.host.peer_id)
            offers = [make_offer(honest.identity, i, reply_to=tuple(honest.host.addrs)) for i in range(20)]

            for raw in offers[:5]:
                assert await honest.gossip.publish_offer(raw) is None
            written = await bad.flood(victim_id, rate=FLOOD_RATE)  # until the victim cuts it off
            for raw in offers[5:]:
                assert await honest.gossip.publish_offer(raw) is None

            await wait_until(lambda: bad.host.peer_id not in victim.host.connected_peers(), what="attacker gone")
            assert victim.host.banned(bad.host.peer_id)
            assert refusals[Refusal.INVALID_GOSSIP] == 1
            refused = victim.gossip.stats["offer_rejected:bad_signature"]
            # 50 refusals take its score to the graylist threshold; a few more were already on the wire.
            print(f"\nflood: {written} written, {refused} validated before the cut-off")
            assert 50 <= refused <= written and refused <= 70, (refused, written)

            # Its redials are refused at the swarm, for the length of the ban.
            assert not await bad.connect(victim.addr, timeout=2)
            assert refusals[Refusal.PEER_BANNED] >= 1

            await wait_until(lambda: set(offers) <= set(victim.heard), what="every honest offer at the victim")
            assert not victim.host.banned(honest.host.peer_id)
            scorer = victim.gossip.router.scorer
            assert isinstance(scorer, GossipScorer)
            assert scorer.score(ID.from_base58(honest.host.peer_id), [OFFERS_TOPIC]) >= 0
            assert honest.host.peer_id in victim.gossip.mesh_peers()

    run_trio(main, deadline=90)


def test_with_py_libp2p_neutral_scoring_the_same_flood_is_validated_message_after_message() -> None:
    """The attack reproduced: py-libp2p's own thresholds (minus infinity) never cut the flooder off."""

    async def main() -> None:
        refusals = RefusalLog()
        async with gossip_node(tuning=STOCK, on_refusal=refusals) as victim, GossipFlooder.open() as bad:
            assert await bad.connect(victim.addr)
            victim_id = ID.from_base58(victim.host.peer_id)
            assert await bad.flood(victim_id, rate=FLOOD_RATE, count=200) == 200
            await wait_until(lambda: victim.gossip.stats["offer_rejected:bad_signature"] == 200, what="all refused")
            assert bad.host.peer_id in victim.host.connected_peers()
            assert refusals[Refusal.INVALID_GOSSIP] == 0

    run_trio(main, deadline=60)


def test_refusals_of_our_clock_are_ignored_and_cost_the_forwarder_nothing() -> None:
    """A relay forwards what its own validator accepts. 80 offers that expired long ago (our `expired`, an IGNORE)
    leave its score at zero; the same number of bad signatures (a REJECT) get it cut off."""

    async def main() -> None:
        refusals = RefusalLog()
        async with gossip_node(validate=accept_anything) as relay, gossip_node(on_refusal=refusals) as victim:
            await relay.host.connect(victim.addr)
            await wait_until(lambda: relay.host.peer_id in victim.gossip.mesh_peers(), what="offers mesh")
            relay_id = ID.from_base58(relay.host.peer_id)
            scorer = victim.gossip.router.scorer
            assert isinstance(scorer, GossipScorer)
            stale = now_ms() - 3_600_000
            for i in range(80):
                raw = make_offer(relay.identity, i, issued_at_ms=stale, ttl_ms=60_000)
                assert await relay.gossip.publish_offer(raw) is None
            await wait_until(lambda: victim.gossip.stats["offer_rejected:expired"] == 80, what="80 expired refused")
            assert scorer.forgiven >= 80 and scorer.counted == 0
            assert scorer.score(relay_id, [OFFERS_TOPIC]) >= 0
            assert not victim.host.banned(relay.host.peer_id)

            for i in range(80):
                forged = bytearray(make_offer(relay.identity, 100 + i))
                forged[-1] ^= 1
                if await relay.gossip.publish_offer(bytes(forged)) is not None:
                    break
                if victim.host.banned(relay.host.peer_id):
                    break
            await wait_until(lambda: victim.host.banned(relay.host.peer_id), what="the relay banned")
            assert refusals[Refusal.INVALID_GOSSIP] == 1

    run_trio(main, deadline=90)


def test_the_scorer_forgives_ignored_messages_cached_or_not_and_reports_a_peer_below_graylist_once_it_gets_there() -> (
    None
):
    peer = ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize())
    reported: list[ID] = []
    scorer = GossipScorer(score_params())
    scorer.graylisted = reported.append
    current: list[bytes | None] = [None]
    scorer.current_message_id = lambda: current[0]

    scorer.forgive(b"ignored")
    current[0] = b"ignored"
    for _ in range(100):  # the first refusal and every copy refused from the validation cache alike
        scorer.on_invalid_message(peer, OFFERS_TOPIC)
    assert scorer.forgiven == 100 and scorer.invalid_messages[peer][OFFERS_TOPIC] == 0

    current[0] = b"rejected"
    for n in range(1, 51):
        scorer.on_invalid_message(peer, OFFERS_TOPIC)
        below = scorer.score(peer, [OFFERS_TOPIC]) < GRAYLIST_THRESHOLD
        assert bool(reported) == below, n
    assert reported == []  # -50 is the threshold itself: not below it
    scorer.on_invalid_message(peer, OFFERS_TOPIC)
    assert reported == [peer]


def test_behaviour_penalties_alone_get_a_peer_reported_at_the_heartbeat() -> None:
    peer = ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize())
    reported: list[ID] = []
    scorer = GossipScorer(score_params())
    scorer.graylisted = reported.append
    scorer.penalize_behavior(peer, 10.0)  # one GRAFT flood: honest churn can do that
    scorer.on_heartbeat()
    assert reported == []
    scorer.penalize_behavior(peer, 600.0)  # (600 - 20) x 0.1 = -58 after decay
    scorer.on_heartbeat()
    assert reported == [peer]
