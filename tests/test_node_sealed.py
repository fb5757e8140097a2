"""Sealed gossip offers between real nodes on loopback, real Docker: the code and input reach the granted runner
alone, a passive listener on the offers topic never sees them, and a tampered payload runs nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from mesh.claims import ClaimDesk, Sealing
from mesh.demo import heard_by
from mesh.node import MeshNode, NodeConfig
from mesh.peers import PeerDirectory
from tests.docker_support import sandbox_policy
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer, parse_offer
from transports.wire.reasons import Reason, Rejection
from transports.wire.sealed import Payload, SealKey, direct_form, open_payload

MARKER = "sealed-marker-4d2f9a61"
# Prints its input's marker and the length of its own source: the output proves the runner had both.
ECHO = f"import json, sys\n# {MARKER}\nprint(json.load(sys.stdin)['marker'])\n"


@contextlib.asynccontextmanager
async def mesh(runners: int = 2) -> AsyncIterator[dict[str, Any]]:
    """`runners` sandboxed nodes, a passive listener (cannot sandbox: it only relays offers) and an offerer."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(mode: str, peers: list[str]) -> MeshNode:
            config = NodeConfig(
                identity=NodeIdentity.generate(),
                peers=peers,
                sandbox_mode=mode,  # type: ignore[arg-type]
                executor_policy=sandbox_policy(),
                heartbeat_interval=0.5,
            )
            return await stack.enter_async_context(MeshNode.open(config))

        first = await start("docker", [])
        nodes = [first] + [await start("docker", first.addrs[:1]) for _ in range(runners - 1)]
        listener = await start("none", first.addrs[:1])
        offerer = await start("none", first.addrs[:1])
        with trio.fail_after(15):
            while len(offerer.peers.fresh()) < runners + 1 or not listener.gossip.subscribed:
                await trio.sleep(0.05)
        yield {"nodes": nodes, "listener": listener, "offerer": offerer}


pytestmark = pytest.mark.docker


def test_a_passive_listener_never_sees_the_code_or_input_and_the_offer_still_runs() -> None:
    async def main() -> None:
        async with mesh(runners=2) as m:
            offerer: MeshNode = m["offerer"]
            seen = heard_by(m["listener"])
            raw = offerer.make_offer(language="python", code=ECHO, input={"marker": MARKER})
            assert MARKER.encode() in raw  # the clear offer the caller made: the node seals it before it goes out
            outcome = await offerer.offer_gossip(raw, timeout=60)
            assert outcome.result is not None, outcome.refusal
            assert outcome.ok and outcome.result.result.stdout == MARKER + "\n"
            await trio.sleep(0.5)
            assert seen, "the listener heard no offer at all"
            assert all(MARKER.encode() not in data for data in seen)
            assert all(parse_offer(data).offer.sealed is not None for data in seen)
            oid = parse_offer(raw).offer.offer_id
            assert sum(n.ran.count(oid) for n in m["nodes"]) == 1

    trio.run(main)


def test_a_tampered_payload_is_refused_and_nothing_runs() -> None:
    async def main() -> None:
        async with mesh(runners=1) as m:
            offerer: MeshNode = m["offerer"]
            grant = offerer.desk.grant_sealed_claim

            async def tampering(*args: Any) -> Rejection | bytes:
                granted = await grant(*args)
                if isinstance(granted, Rejection):
                    return granted
                return granted[:-1] + bytes([granted[-1] ^ 1])  # one bit of the tag

            offerer.desk.grant_sealed_claim = tampering  # type: ignore[method-assign,assignment]
            raw = offerer.make_offer(language="python", code=ECHO, input={"marker": MARKER})
            outcome = await offerer.offer_gossip(raw, timeout=60)
            assert outcome.result is not None, outcome.refusal
            result = outcome.result.result
            assert not result.ok and result.exit_code is None and result.queue_reason == "payload_mismatch"
            assert not result.queue_for_cloud
            assert not m["nodes"][0].ran
            assert m["nodes"][0].gossip.stats["offer_payload_refused"] == 1

    trio.run(main)


def test_the_old_clear_form_still_runs_when_the_offerer_sends_it() -> None:
    async def main() -> None:
        async with mesh(runners=1) as m:
            offerer: MeshNode = m["offerer"]
            offerer.offerer.seal_gossip = False
            seen = heard_by(m["listener"])
            raw = offerer.make_offer(language="python", code=ECHO, input={"marker": MARKER})
            outcome = await offerer.offer_gossip(raw, timeout=60)
            assert outcome.ok, outcome.refusal
            await trio.sleep(0.5)
            assert any(MARKER.encode() in data for data in seen)  # what the clear form exposes

    trio.run(main)


# -- the claim desk: only the runner granted gets the payload ---------------------------------------------------


def _status(peer_id: str) -> dict[str, Any]:
    return {
        "peerId": peer_id,
        "sandboxMode": "docker",
        "freeSlots": 1,
        "languages": ["python"],
        "isolation": ["runc"],
        "addrs": [],
    }


def test_only_the_granted_claimant_gets_the_payload_and_a_refused_one_gets_nothing() -> None:
    async def main() -> None:
        me = NodeIdentity.generate()
        desk = ClaimDesk(PeerDirectory(stale_after=60))
        clear = TaskOffer.create(me, language="python", code=ECHO, input={"marker": MARKER})
        sealing = Sealing(clear.payload)
        received = parse_offer(clear.sealed_with(sealing.key.public).sign(me))
        desk.post(received, sealing=sealing)
        first, second = NodeIdentity.generate().peer_id, NodeIdentity.generate().peer_id
        first_key, second_key = SealKey(), SealKey()
        granted = await desk.grant_sealed_claim(received.offer.offer_id, first, _status(first), first_key.public)
        refused = await desk.grant_sealed_claim(received.offer.offer_id, second, _status(second), second_key.public)
        assert isinstance(granted, bytes) and isinstance(refused, Rejection)
        assert refused.reason == Reason.CLAIM_REFUSED and MARKER not in refused.detail
        assert received.offer.sealed is not None
        assert open_payload(granted, received.digest, first_key, received.offer.sealed) == clear.payload
        # The payload sealed to the first claimant's key is no use to anyone else, even if it overheard it.
        with pytest.raises(Exception) as wrong:
            open_payload(granted, received.digest, second_key, received.offer.sealed)
        assert getattr(wrong.value, "reason", None) == Reason.PAYLOAD_MISMATCH
        # A claim without a key, on a sealed offer: refused, no grant taken.
        plain = await desk.grant_claim(received.offer.offer_id, second, _status(second))
        assert isinstance(plain, Rejection) and plain.reason == Reason.MALFORMED
        # A key no one can hold: refused before any grant.
        zero = await desk.grant_sealed_claim(received.offer.offer_id, second, _status(second), bytes(32))
        assert isinstance(zero, Rejection) and zero.reason == Reason.MALFORMED
        assert desk.get(received.offer.offer_id) is not None
        job = desk.get(received.offer.offer_id)
        assert job is not None and len(job.job.grants) == 1

    trio.run(main)


# -- direct offers take the same envelope-plus-payload form ------------------------------------------------------


def test_a_direct_offer_in_the_envelope_plus_payload_form_runs_and_a_mismatching_payload_runs_nothing() -> None:
    async def main() -> None:
        async with mesh(runners=1) as m:
            offerer: MeshNode = m["offerer"]
            runner: MeshNode = m["nodes"][0]
            clear = offerer.make_offer(to=runner.peer_id, language="python", code=ECHO, input={"marker": MARKER})
            outcome = await offerer.offer_direct(runner.addrs[0], offerer.sealed_direct(clear))
            assert outcome.ok and outcome.result is not None, outcome.refusal
            assert outcome.result.result.stdout == MARKER + "\n"
            # Another payload than the offer's digests name: refused on the stream, nothing runs.
            other = offerer.make_offer(to=runner.peer_id, language="python", code=ECHO, input={"marker": MARKER})
            offer = parse_offer(other).offer
            sealed = offer.sealed_with(SealKey().public).sign(offerer.identity)
            frame = direct_form(sealed, Payload("print('not what was signed')", offer.input))
            refused = await offerer.offer_direct(runner.addrs[0], frame)
            assert refused.refusal is not None and refused.refusal.reason == Reason.PAYLOAD_MISMATCH
            assert offer.offer_id not in runner.ran and len(runner.ran) == 1

    trio.run(main)
