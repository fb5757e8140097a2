"""Interop with an implementation nobody here wrote: a pinned js-libp2p 2.x peer (tests/interop/js) and our nodes.

Everything is on loopback: real `MeshNode`s in this process, one Node.js process per js peer, driven over stdin.

- The js peer dials us over Noise + yamux, identify shows meshsub 1.2/1.1/1.0 only, and both sides mesh; heartbeats
  cross both ways under the one id both compute (`from || seqno`).
- A js relay carries an offer between two of our nodes that share no gossip link: claimed, run in Docker, answered
  once.
- Invalid offers a js peer publishes (bad signature, malformed, expired) stop at our node: a js peer behind it sees
  none of them, not even in IHAVE.
- A late-joining js peer that is outside our fanout gets our offers' IHAVE under their sha256 ids, and sends no IWANT
  for an offer it already holds (this needs the message cache keyed by our id: see test_p2p_gossip_router.py).
- An mplex-only js peer cannot connect: it is refused at muxer negotiation, both ways, and our node keeps serving.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from libp2p.peer.id import ID

from executor.contract import SANDBOX_REQUIRED
from mesh.node import MeshNode, NodeConfig
from tests.docker_support import sandbox_policy, wait_pool_ready
from tests.interop.jspeer import JsPeer, JsPeerError, summed
from transports.direct import OFFER_PROTOCOL
from transports.gossip import MESHSUB_PROTOCOLS, OFFERS_TOPIC
from transports.p2p import DialError
from transports.pubsub.tuning import IDONTWANT_THRESHOLD
from transports.wire.codec import Domain, pack, seal, unpack_strict
from transports.wire.identity import NodeIdentity
from transports.wire.offers import Audience, TaskOffer, parse_offer

pytestmark = pytest.mark.interop

SUM = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n"

# A topic other than offers: libp2p's default message id (from || seqno), which both sides must compute alike.
OTHER_TOPIC = "edgecoder/other/1"


@asynccontextmanager
async def our_node(mode: str = "none", *, forward_offers: bool = True) -> AsyncIterator[MeshNode]:
    config = NodeConfig(
        identity=NodeIdentity.generate(),
        sandbox_mode=mode,  # type: ignore[arg-type]
        executor_policy=sandbox_policy(),
        heartbeat_interval=0.5,
        forward_offers=forward_offers,
    )
    async with MeshNode.open(config) as node:
        yield node


async def eventually(check: Callable[[], Awaitable[bool]], *, what: str, timeout: float = 15.0) -> float:
    """Poll an async condition (most of them ask the js peer) until it holds; return how long that took (s)."""
    started = time.perf_counter()
    with trio.move_on_after(timeout):
        while not await check():
            await trio.sleep(0.05)
        return time.perf_counter() - started
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def peer_id_bytes(peer_id: str) -> bytes:
    return ID.from_base58(peer_id).to_bytes()


def test_a_js_peer_dials_us_over_noise_and_yamux_and_we_mesh_on_gossipsub() -> None:
    async def main() -> None:
        async with our_node() as node, JsPeer.open() as js:
            await js.call("subscribe", topic=OTHER_TOPIC)
            await node.gossip.pubsub.subscribe(OTHER_TOPIC)
            started = time.perf_counter()
            conn = await js.dial(node.addrs[0])
            connected_ms = (time.perf_counter() - started) * 1000
            assert conn["peerId"] == node.peer_id
            assert (conn["encryption"], conn["multiplexer"]) == ("/noise", "/yamux/1.0.0")

            async def meshed() -> bool:
                return js.peer_id in node.gossip.mesh_peers(OTHER_TOPIC) and node.peer_id in await js.mesh(OTHER_TOPIC)

            meshed_ms = connected_ms + 1000 * await eventually(meshed, what="both sides in each other's mesh")
            streams = (await js.call("mesh", topic=OTHER_TOPIC))["streams"]
            assert streams[node.peer_id] == "/meshsub/1.2.0"
            identify = await js.call("identify", peer=node.peer_id)
            assert [p for p in identify["protocols"] if p.startswith("/meshsub/")] == list(MESHSUB_PROTOCOLS)
            for version in ("/meshsub/1.3.0", "/meshsub/1.4.0", "/meshsub/2.0.0"):
                with pytest.raises(JsPeerError, match="protocol selection failed"):
                    await js.call("dialProtocol", peer=node.peer_id, protocol=version)

            print(f"\njs peer: connected in {connected_ms:.0f} ms, both sides meshed {meshed_ms:.0f} ms after the dial")

            # A message of ours on a topic other than offers reaches the js peer, which computes its id as we do:
            # our PeerID bytes, then the seqno.
            await node.gossip.pubsub.publish(OTHER_TOPIC, b"ours")

            async def ours_arrived() -> bool:
                return any(m["from"] == node.peer_id for m in await js.received(OTHER_TOPIC))

            await eventually(ours_arrived, what="our message at the js peer")
            ours = next(m for m in await js.received(OTHER_TOPIC) if m["from"] == node.peer_id)
            ours_id = bytes.fromhex(ours["msgId"])
            assert len(ours_id) == 46 and ours_id[:-8] == peer_id_bytes(node.peer_id)
            assert node.gossip.pubsub.seen_messages.has(ours_id)

            # And the js peer's message (signed by js-libp2p, StrictSign) is authenticated and cached under the same
            # kind of id by our node.
            await js.call("publish", topic=OTHER_TOPIC, data=pack({"from": "js"}).hex())

            def js_ids() -> list[bytes]:
                window = node.gossip.router.mcache.window(OTHER_TOPIC)
                return [m for m in window if m[:-8] == peer_id_bytes(js.peer_id)]

            async def theirs_arrived() -> bool:
                return bool(js_ids())

            await eventually(theirs_arrived, what="the js peer's message at our node")
            assert len(js_ids()) == 1 and len(js_ids()[0]) == 46

    trio.run(main)


@pytest.mark.docker
def test_a_js_relay_carries_an_offer_between_two_of_our_nodes_and_it_runs_exactly_once() -> None:
    async def main() -> None:
        async with (
            our_node("none") as offerer,
            our_node("docker") as runner,
            JsPeer.open() as relay,
        ):
            assert runner.executor is not None
            await wait_pool_ready(runner.executor)
            for topic in (OFFERS_TOPIC,):
                await relay.call("subscribe", topic=topic)
            await relay.dial(offerer.addrs[0])
            await relay.dial(runner.addrs[0])
            assert runner.peer_id not in offerer.p2p.connected_peers()  # the only path between them is the relay

            async def relay_meshes_the_runner() -> bool:
                return runner.gossip.subscribed and runner.peer_id in await relay.mesh(OFFERS_TOPIC)

            await eventually(relay_meshes_the_runner, what="the runner in the relay's offers mesh")
            raw = offerer.make_offer(language="python", code=SUM, input={"xs": [1, 2, 3, 4]})
            offer_id = parse_offer(raw).offer.offer_id
            started = time.perf_counter()
            outcome = await offerer.offer_gossip(raw, timeout=60)
            answered_ms = (time.perf_counter() - started) * 1000
            assert outcome.result is not None, outcome.refusal
            assert outcome.ok and outcome.result.result.stdout == "10\n"
            assert outcome.result.executor == runner.identity.public_key
            print(f"\noffer through the js relay answered in {answered_ms:.0f} ms")

            # What the js relay received is the sealed offer the node published: the same id, no code, no input.
            heard = [bytes.fromhex(m["data"]) for m in await relay.received(OFFERS_TOPIC)]
            relayed = [
                m
                for m, data in zip(await relay.received(OFFERS_TOPIC), heard, strict=True)
                if parse_offer(data).offer.offer_id == offer_id
            ]
            assert len(relayed) == 1
            published = bytes.fromhex(relayed[0]["data"])
            assert (relayed[0]["msgId"], relayed[0]["source"]) == (sha256_hex(published), offerer.peer_id)
            assert parse_offer(published).offer.sealed is not None and SUM.encode() not in published
            assert runner.ran.count(offer_id) == 1
            assert runner.intake.admitted["gossip"] == 1
            # One claim granted, no other refused (a second runner would have been refused), and the finished offer
            # has left the offerer's desk.
            assert outcome.claims_refused == 0 and offerer.desk.get(offer_id) is None
            assert runner.metrics.claims.labels("granted")._value.get() == 1

    trio.run(main)


@pytest.mark.docker
def test_invalid_offers_from_a_js_peer_are_refused_and_never_forwarded() -> None:
    async def main() -> None:
        async with our_node("docker") as ours, JsPeer.open() as hostile, JsPeer.open() as behind:
            for js in (hostile, behind):
                await js.call("subscribe", topic=OFFERS_TOPIC)
                await js.dial(ours.addrs[0])

            async def meshed() -> bool:
                mesh = ours.gossip.mesh_peers(OFFERS_TOPIC)
                return (
                    hostile.peer_id in mesh
                    and behind.peer_id in mesh
                    and ours.peer_id in await behind.mesh(OFFERS_TOPIC)
                )

            await eventually(meshed, what="both js peers in our offers mesh")
            signer = NodeIdentity.generate()

            def offer(code: str, **fields: Any) -> bytes:
                # reply_to empty: nobody can claim these, so our node admits the valid one and runs nothing
                return TaskOffer.create(signer, language="python", code=code, reply_to=(), **fields).sign(signer)

            bad_signature = bytearray(offer("print('tampered')"))
            bad_signature[-1] ^= 1
            invalid = {
                "bad_signature": bytes(bad_signature),
                "malformed": pack({"version": 1, "not": "an offer"}),
                "expired": offer("print('old')", issued_at_ms=1_000_000, ttl_ms=60_000),
            }
            # Large enough for an IDONTWANT: we send them only for offers above IDONTWANT_THRESHOLD (transports/pubsub).
            sentinel = offer("print('valid')", input={"pad": "x" * (IDONTWANT_THRESHOLD + 1024)})
            for raw in [*invalid.values(), sentinel]:
                await hostile.call("publish", topic=OFFERS_TOPIC, data=raw.hex())

            async def sentinel_behind() -> bool:
                return any(m["data"] == sentinel.hex() for m in await behind.received(OFFERS_TOPIC))

            await eventually(sentinel_behind, what="the valid offer at the js peer behind our node")

            # Every invalid offer was judged (and a refused one is never forwarded, nor cached for IHAVE).
            async def all_judged() -> bool:
                return sum(ours.gossip.stats[f"offer_rejected:{r}"] for r in invalid) == len(invalid)

            await eventually(all_judged, what="our validator's verdicts")
            for reason in invalid:
                assert ours.gossip.stats[f"offer_rejected:{reason}"] == 1
                assert ours.intake.rejected[("gossip-validator", reason)] == 1
            assert ours.intake.admitted["gossip"] == 1  # the valid one
            control = await behind.control()
            invalid_ids = {sha256_hex(raw) for raw in invalid.values()}
            assert [m["data"] for m in await behind.received(OFFERS_TOPIC)] == [sentinel.hex()]
            assert not invalid_ids & set(summed(control["received"]["messages"]))
            assert not invalid_ids & set(summed(control["received"]["ihave"]))
            assert ours.peer_id in await behind.mesh(OFFERS_TOPIC)  # it was in a position to be sent them

            # Our IDONTWANT for the valid (large) one names it by the same id as everything else: its sha256.
            async def idontwant() -> bool:
                received = (await behind.control())["received"]["idontwant"].get(ours.peer_id, {})
                return sha256_hex(sentinel) in received

            await eventually(idontwant, what="our IDONTWANT under the offer's sha256")
            print(f"\nrefused by our validator: {dict(ours.intake.rejected)}; behind us: the valid one only")

    trio.run(main)


@pytest.mark.docker
def test_ten_kinds_of_invalid_offers_from_a_js_peer_are_each_counted_once_under_their_own_reason() -> None:
    """Issue 27 saw one `malformed` more than ten kinds of invalid offers contained. Here every kind is published
    alone and its verdict awaited before the next, so each count is attributed to the kind that caused it; at the end
    the validator's counts, the intake's and the metric are compared whole, a valid offer's admission included."""

    async def main() -> None:
        async with our_node("docker") as ours, JsPeer.open() as hostile:
            await hostile.call("subscribe", topic=OFFERS_TOPIC)
            await hostile.dial(ours.addrs[0])

            async def meshed() -> bool:
                return hostile.peer_id in ours.gossip.mesh_peers(OFFERS_TOPIC)

            await eventually(meshed, what="the js peer in our offers mesh")
            signer = NodeIdentity.generate()

            def offer(code: str, **fields: Any) -> bytes:
                return TaskOffer.create(signer, language="python", code=code, reply_to=(), **fields).sign(signer)

            valid = offer("print('valid')")
            tampered = bytearray(offer("print('tampered')"))
            tampered[-1] ^= 1
            fields = TaskOffer.create(signer, language="python", code="print(9)", reply_to=()).to_wire_fields()
            kinds: list[tuple[str, bytes, str]] = [
                ("bad signature", bytes(tampered), "bad_signature"),
                ("expired", offer("print('old')", issued_at_ms=1_000_000, ttl_ms=60_000), "expired"),
                ("issued in the future", offer("print('f')", issued_at_ms=10**13, ttl_ms=60_000), "not_yet_valid"),
                ("over the size cap", b"\x00" * 300_000, "too_large"),
                ("version 9, signed", seal(Domain.OFFER, {**fields, "version": 9}, signer), "unsupported_version"),
                ("a map that is no envelope", pack({"version": 1, "not": "an offer"}), "malformed"),
                ("not msgpack", b"\xc1\xc1\xc1", "malformed"),
                ("truncated", valid[: len(valid) // 2], "malformed"),
                ("empty", b"", "malformed"),
                ("an unknown field, signed", seal(Domain.OFFER, {**fields, "extra": 1}, signer), "malformed"),
            ]
            assert len({raw for _, raw, _ in kinds}) == len(kinds)  # ten messages, ten message ids

            def rejected() -> Counter[str]:
                return Counter(
                    {k.split(":", 1)[1]: v for k, v in ours.gossip.stats.items() if k.startswith("offer_rejected:")}
                )

            for judged, (kind, raw, reason) in enumerate(kinds, start=1):
                before = rejected()
                await hostile.call("publish", topic=OFFERS_TOPIC, data=raw.hex())

                async def verdict(judged: int = judged) -> bool:
                    return sum(rejected().values()) >= judged

                await eventually(verdict, what=f"our verdict on {kind}")
                assert rejected() - before == Counter({reason: 1}), kind
            await hostile.call("publish", topic=OFFERS_TOPIC, data=valid.hex())

            async def admitted() -> bool:
                return ours.intake.admitted["gossip"] == 1

            await eventually(admitted, what="the valid offer admitted")
            expected = Counter(reason for _, _, reason in kinds)
            assert rejected() == expected
            assert ours.intake.rejected == Counter({("gossip-validator", r): n for r, n in expected.items()})
            assert dict(ours.intake.admitted) == {"gossip": 1}
            print(f"\nten kinds, counted: {dict(expected)}")

    trio.run(main)


def test_a_late_joining_js_peer_gets_our_offers_under_sha256_ids_and_no_iwant_for_offers_it_has() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            # A one-shot offerer (not in the offers mesh) publishes to a fanout of six subscribers and sends IHAVE
            # to every other subscriber at each heartbeat: that is where message ids meet on the wire.
            offerer = await stack.enter_async_context(our_node("none", forward_offers=False))
            fanout = offerer.gossip.router.degree  # a topic it has not joined goes to `degree` subscribers
            early = [await stack.enter_async_context(JsPeer.open()) for _ in range(fanout)]
            for js in early:
                await js.call("subscribe", topic=OFFERS_TOPIC)
                await js.dial(offerer.addrs[0])

            async def subscribed(count: int) -> bool:
                return len(offerer.gossip.offer_subscribers()) == count

            await eventually(lambda: subscribed(fanout), what="the early peers' subscriptions")
            offers = [offerer.make_offer(language="python", code=f"print({i})") for i in range(8)]
            for raw in offers[:4]:
                assert await offerer.gossip.publish_offer(raw) is None

            # The late peer meshes with one early peer, then joins the offerer: our node replays the offers it
            # holds, and its fanout is full, so from then on the late peer hears of offers by our IHAVE, as well as
            # through the early peer's mesh.
            late = await stack.enter_async_context(JsPeer.open())
            await late.call("subscribe", topic=OFFERS_TOPIC)
            await late.dial(early[0].addrs[0])
            await late.dial(offerer.addrs[0])
            await eventually(lambda: subscribed(fanout + 1), what="the late peer's subscription")

            async def late_meshed() -> bool:
                return late.peer_id in await early[0].mesh(OFFERS_TOPIC) and early[0].peer_id in await late.mesh(
                    OFFERS_TOPIC
                )

            await eventually(late_meshed, what="the late peer meshed with an early one")
            assert late.peer_id not in {p.to_base58() for p in offerer.gossip.router.fanout[OFFERS_TOPIC]}
            for raw in offers[4:]:
                assert await offerer.gossip.publish_offer(raw) is None

            by_id = {sha256_hex(raw): n for n, raw in enumerate(offers)}

            def ihave_from_offerer(control: dict[str, Any]) -> Counter[str]:
                return Counter(control["received"]["ihave"].get(offerer.peer_id, {}))

            # Readiness: every offer advertised to the late peer in two heartbeats or more, i.e. again after it held
            # the offer. Under another id than the one it holds the offer by, this never happens: the figures are
            # printed either way, and the assertions below say what went wrong.
            async def gossiped_twice() -> bool:
                ihave = ihave_from_offerer(await late.control())
                return all(ihave[h] >= 2 for h in by_id)

            with trio.move_on_after(20):
                await eventually(gossiped_twice, what="our IHAVE for every offer, twice", timeout=20)
            control = await late.control()
            received = await late.received(OFFERS_TOPIC)
            # Each offer under both ids the late peer could have been told: its sha256, and `from || seqno`.
            upstream_id = {
                m["msgId"]: (peer_id_bytes(m["from"]) + bytes.fromhex(m["seqno"])).hex()
                for m in received
                if m["from"] == offerer.peer_id
            }
            ihave = ihave_from_offerer(control)
            iwants = [w for w in control["iwantsSent"] if w["peer"] == offerer.peer_id]
            iwant_count = Counter(w["id"] for w in iwants)
            held = control["firstHeld"]
            already_held = Counter(w["id"] for w in iwants if w["id"] in held and held[w["id"]] <= w["at"])
            deliveries = Counter(control["received"]["messages"].get(offerer.peer_id, {}))
            score = (await late.call("scores"))["peers"].get(offerer.peer_id, {})
            print("\nlate js peer, per offer (0-3 published before it joined), ids as sha256 / from||seqno:")
            for h, n in by_id.items():
                up = upstream_id.get(h, "")
                print(
                    f"  offer {n}: IHAVE {ihave[h]}/{ihave[up]}  IWANT {iwant_count[h]}/{iwant_count[up]}"
                    f"  (for an offer it held: {already_held[h] + already_held[up]})"
                    f"  delivered by us {deliveries[h]}"
                )
            print(
                f"  IWANT in all: {len(iwants)}, for an offer it already held: {sum(already_held.values())};"
                f" broken promises: {score.get('brokenPromises')}, worst behaviour penalty: {score.get('worstPenalty')}"
            )

            assert {m["msgId"] for m in received} == set(by_id)  # every offer, under its sha256 id
            assert set(ihave) <= set(by_id), "our IHAVE named offers by another id than their sha256"
            assert all(ihave[h] >= 2 for h in by_id)
            assert sum(already_held.values()) == 0
            assert max(iwant_count.values(), default=0) <= 1  # at most once, for an offer not yet held
            assert score.get("brokenPromises") == 0 and score.get("worstPenalty") is None

    trio.run(main)


def test_an_mplex_only_js_peer_cannot_connect_and_our_node_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with our_node() as node, JsPeer.open(muxer="mplex") as mplex_only, JsPeer.open() as yamux:
            with caplog.at_level(logging.ERROR, logger="libp2p.network.swarm"):
                with pytest.raises(JsPeerError, match="MuxerUnavailableError") as refused:
                    await mplex_only.dial(node.addrs[0])

                async def logged() -> bool:
                    return bool(_logged(caplog, mplex_only.peer_id))

                await eventually(logged, what="our node's log line")
            assert mplex_only.peer_id not in node.p2p.connected_peers()
            with pytest.raises(DialError, match=r"protocols not supported: tried \['/yamux/1.0.0'\]") as ours:
                await node.p2p.connect(mplex_only.addrs[0])
            print(f"\njs side: {refused.value}\nour side, inbound: {_logged(caplog, mplex_only.peer_id)}")
            print(f"our side, outbound: {ours.value}")
            assert (await yamux.dial(node.addrs[0]))["multiplexer"] == "/yamux/1.0.0"

    trio.run(main)


def _logged(caplog: pytest.LogCaptureFixture, peer_id: str) -> str:
    return next((r.getMessage() for r in caplog.records if peer_id in r.getMessage()), "")


def test_a_js_client_following_the_documented_contract_gets_a_host_request_refused_as_the_seeds_run_result() -> None:
    """Issue 22: a js-libp2p client that sends a remote offer asking for the host reads, on the offer stream, the
    seed's result (ok false, stderr `sandbox_required_for_remote_task`, no process) beside the reason code."""

    async def main() -> None:
        async with our_node("docker") as ours, JsPeer.open() as js:
            await js.dial(ours.addrs[0])
            signer = NodeIdentity.generate()
            raw = TaskOffer.create(
                signer, language="python", code="print(1)", sandbox="host", audience=Audience.direct(ours.peer_id)
            ).sign(signer)
            framed = len(raw).to_bytes(4, "big") + raw
            reply = await js.call("exchange", peer=ours.peer_id, protocol=OFFER_PROTOCOL, data=framed.hex())
            answer = unpack_strict(bytes.fromhex(reply["answer"]), max_size=8192)
            assert answer["type"] == "refusal" and answer["reason"] == SANDBOX_REQUIRED
            result = answer["result"]
            assert (result["ok"], result["stderr"], result["exitCode"], result["durationMs"]) == (
                False,
                SANDBOX_REQUIRED,
                None,
                0,
            )
            assert result["queueForCloud"] is True and result["queueReason"] == SANDBOX_REQUIRED
            assert ours.intake.rejected[("direct", SANDBOX_REQUIRED)] == 1 and not ours.ran

    trio.run(main)
