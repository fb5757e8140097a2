"""The seed's contract on the wire: a refusal the seed defines as a run result reaches the offerer in the seed's shape.

Two real libp2p hosts on loopback, the real direct transport and the real intake (no sandbox needed: the intake
refuses these before anything would run). The offerer reads the answer frame as a client of the documented protocol
would, and as our own client does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from executor.contract import SANDBOX_REQUIRED
from mesh.intake import Intake, IntakePolicy
from mesh.node import MeshNode, NodeConfig
from tests.test_p2p_fakes import LOOPBACK, FakeDesk, run_trio
from transports.direct import OFFER_PROTOCOL, DirectTransport
from transports.framing import read_frame, write_frame
from transports.p2p import P2PHost, open_host
from transports.wire.codec import unpack_strict
from transports.wire.identity import NodeIdentity
from transports.wire.offers import Audience, TaskOffer
from transports.wire.reasons import Reason

OFFERER = NodeIdentity.generate()


@dataclass
class Wire:
    node: P2PHost
    offerer: P2PHost
    intake: Intake
    client: DirectTransport


@asynccontextmanager
async def wire(*, participating: bool = True) -> AsyncIterator[Wire]:
    async with (
        open_host(NodeIdentity.generate(), [LOOPBACK]) as node,
        open_host(OFFERER, [LOOPBACK]) as offerer,
        trio.open_nursery() as nursery,
    ):
        intake = Intake(IntakePolicy(), participating=lambda: participating, peer_id=node.peer_id)
        await nursery.start(DirectTransport(node, FakeDesk()).run, intake)
        yield Wire(node, offerer, intake, DirectTransport(offerer, FakeDesk()))
        nursery.cancel_scope.cancel()


def host_request(to: str) -> bytes:
    offer = TaskOffer.create(
        OFFERER,
        language="python",
        code="import os; os.system('touch /tmp/pwned')",
        sandbox="host",
        audience=Audience.direct(to),
    )
    return offer.sign(OFFERER)


async def answer_frame(w: Wire, raw: bytes) -> dict[str, Any]:
    """The answer as bytes on the stream, decoded by hand: what any client of the documented protocol reads."""
    peer = await w.offerer.connect(w.node.addrs[0])
    stream = await w.offerer.open_stream(peer, OFFER_PROTOCOL)
    await write_frame(stream, raw)
    answer = unpack_strict(await read_frame(stream, max_len=8192, timeout=10), max_size=8192)
    await stream.close()
    assert isinstance(answer, dict)
    return answer


def test_a_remote_host_request_is_answered_with_the_seeds_run_result_beside_its_code() -> None:
    async def main() -> None:
        async with wire() as w:
            answer = await answer_frame(w, host_request(w.node.peer_id))
            assert answer["type"] == "refusal" and answer["reason"] == SANDBOX_REQUIRED
            assert answer["result"] == {
                "ok": False,
                "stdout": "",
                "stderr": SANDBOX_REQUIRED,
                "exitCode": None,
                "durationMs": 0,
                "queueForCloud": True,
                "queueReason": SANDBOX_REQUIRED,
                "errorKind": "sandbox-violation",
                "stdoutTruncated": False,
                "stderrTruncated": False,
            }
            # Refused at the intake: nothing queued, the id not spent (the same offer is refused the same way).
            assert w.intake.rejected[("direct", SANDBOX_REQUIRED)] == 1 and len(w.intake.jobs) == 0
            # Our own client hands the offerer the same result, with the code beside it.
            ours = await w.client.send_offer(w.node.addrs[0], host_request(w.node.peer_id))
            assert ours.result is None and ours.refusal is not None
            assert ours.refusal.reason is Reason.SANDBOX_REQUIRED
            assert ours.refusal.result is not None and ours.refusal.result.to_json() == answer["result"]
            assert w.intake.rejected[("direct", SANDBOX_REQUIRED)] == 2 and len(w.intake.jobs) == 0

    run_trio(main)


def test_a_node_that_cannot_sandbox_answers_sandbox_unavailable_as_a_run_result() -> None:
    async def main() -> None:
        async with wire(participating=False) as w:
            offer = TaskOffer.create(OFFERER, language="python", code="print(1)", audience=Audience.direct("x"))
            answer = await answer_frame(w, offer.sign(OFFERER))
            assert answer["reason"] == "sandbox_unavailable"
            result = answer["result"]
            assert result["ok"] is False and result["exitCode"] is None and result["durationMs"] == 0
            assert result["queueForCloud"] is True and result["queueReason"] == "sandbox_unavailable"
            assert result["stderr"].startswith("sandbox_unavailable: ")
            assert sum(w.intake.rejected.values()) == 0  # refused by the transport, before the intake saw it

    run_trio(main)


def test_a_gossip_host_request_is_the_seeds_run_result_at_once_not_a_timeout() -> None:
    """Over gossip a refusal has no way back to the offerer; every node refuses a host request at its intake, so the
    offerer answers itself, in the seed's shape, instead of waiting out its timeout."""

    async def main() -> None:
        config = NodeConfig(identity=OFFERER, sandbox_mode="none")
        async with MeshNode.open(config) as node:
            raw = node.make_offer(language="python", code="print(1)", sandbox="host")
            # Waiting out the timeout would overrun run_trio's own deadline (60 s) by far.
            outcome = await node.offer_gossip(raw, timeout=600)
            assert outcome.result is None and outcome.refusal is not None
            assert outcome.refusal.reason is Reason.SANDBOX_REQUIRED
            seed = outcome.refusal.result
            assert seed is not None and seed.stderr == SANDBOX_REQUIRED and seed.queue_reason == SANDBOX_REQUIRED
            assert outcome.issues == 0  # nothing was published

    run_trio(main)
