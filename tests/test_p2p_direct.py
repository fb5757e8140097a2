"""Direct streams: offer in, result back on the same stream; typed refusals for everything else; bounded handlers."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.direct import (
    CLAIM_PROTOCOL,
    OFFER_PROTOCOL,
    STATUS_PROTOCOL,
    DirectTransport,
    ReplyError,
)
from transports.framing import read_frame, write_frame
from transports.p2p import P2PHost, open_host
from transports.wire.codec import pack, unpack_strict
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason, Rejection

OFFER = b"\x92\xc4\x03abc\xc4\x02sg"  # the transport never decodes an offer: any bytes will do here
RESULT = b"signed-result-bytes"


@dataclass
class Pair:
    server: P2PHost
    client: P2PHost
    direct: DirectTransport  # the server's
    client_direct: DirectTransport
    sink: RecordingSink
    desk: FakeDesk
    nursery: trio.Nursery


@asynccontextmanager
async def pair(*, stall_timeout: float = 2.0, result_timeout: float = 5.0) -> AsyncIterator[Pair]:
    sink, desk = RecordingSink(), FakeDesk()
    async with (
        open_host(NodeIdentity.generate(), [LOOPBACK]) as server,
        open_host(NodeIdentity.generate(), [LOOPBACK]) as client,
        trio.open_nursery() as nursery,
    ):
        sink.nursery = nursery
        direct = DirectTransport(
            server,
            desk,
            stall_timeout=stall_timeout,
            result_timeout=result_timeout,
            status=lambda: {"peerId": server.peer_id, "sandboxMode": "docker"},
        )
        await nursery.start(direct.run, sink)
        client_direct = DirectTransport(client, FakeDesk())  # a client only: its methods need no run()
        yield Pair(server, client, direct, client_direct, sink, desk, nursery)
        nursery.cancel_scope.cancel()


async def raw_exchange(p: Pair, protocol: str, payload: bytes) -> dict[str, object]:
    """Write bytes as they are (no framing help) and read one answer frame."""
    peer = await p.client.connect(p.server.addrs[0])
    stream = await p.client.open_stream(peer, protocol)
    await stream.write(payload)
    answer = unpack_strict(await read_frame(stream, max_len=4096, timeout=5), max_size=4096)
    await stream.close()
    assert isinstance(answer, dict)
    return answer


def test_an_offer_gets_its_result_back_on_the_same_stream() -> None:
    async def main() -> None:
        async with pair() as p:
            p.sink.reply_with, p.sink.reply_delay = RESULT, 0.05  # the result comes later, from another task
            answer = await p.client_direct.send_offer(p.server.addrs[0], OFFER)
            assert answer.refusal is None and answer.result == RESULT
            [delivery] = p.sink.deliveries
            assert (delivery.raw, delivery.transport, delivery.sender) == (OFFER, "direct", p.client.peer_id)
            assert await delivery.claim()  # a direct offer is addressed to us: nothing to claim
            try:
                await delivery.reply(b"again")
                raise AssertionError("a second reply must fail")
            except ReplyError:
                pass
            # Now connected: a bare PeerID works as the address.
            answer = await p.client_direct.send_offer(p.server.peer_id, OFFER)
            assert answer.result == RESULT

    run_trio(main)


def test_a_rejected_offer_gets_a_typed_refusal() -> None:
    async def main() -> None:
        async with pair() as p:
            p.sink.rejection = Rejection(Reason.LANGUAGE_NOT_ALLOWED, "ruby")
            answer = await p.client_direct.send_offer(p.server.addrs[0], OFFER)
            assert answer == type(answer)(None, Rejection(Reason.LANGUAGE_NOT_ALLOWED, "ruby"))

    run_trio(main)


def test_a_withdrawn_node_refuses_with_sandbox_unavailable_and_never_delivers() -> None:
    async def main() -> None:
        async with pair() as p:
            p.sink.participating = False
            answer = await p.client_direct.send_offer(p.server.addrs[0], OFFER)
            assert answer.refusal is not None and answer.refusal.reason is Reason.SANDBOX_UNAVAILABLE
            assert p.sink.deliveries == []

    run_trio(main)


def test_an_oversize_frame_is_refused_from_its_length_alone() -> None:
    async def main() -> None:
        async with pair(stall_timeout=3.0) as p:
            # Only the 4-byte header announcing 64 MiB is sent: an answer that comes before the stall timeout can
            # only have been decided from the length, without waiting for the payload.
            with trio.fail_after(1.0):
                answer = await raw_exchange(p, OFFER_PROTOCOL, struct.pack(">I", 64 << 20))
            assert answer["type"] == "refusal" and answer["reason"] == "too_large"
            assert p.sink.deliveries == []
            await wait_until(lambda: p.direct.active_handlers == 0, what="handler to finish")

    run_trio(main)


def test_a_stalled_stream_times_out_and_frees_its_handler() -> None:
    async def main() -> None:
        async with pair(stall_timeout=0.3) as p:
            peer = await p.client.connect(p.server.addrs[0])
            stream = await p.client.open_stream(peer, OFFER_PROTOCOL)
            await stream.write(struct.pack(">I", 100) + b"only part")  # then nothing more
            await wait_until(lambda: p.direct.active_handlers == 1, what="handler to start")
            answer = unpack_strict(await read_frame(stream, max_len=4096, timeout=3), max_size=4096)
            assert answer["reason"] == "timeout"
            await wait_until(lambda: p.direct.active_handlers == 0, what="handler to be freed")
            assert p.direct.refused["timeout"] == 1 and p.sink.deliveries == []

    run_trio(main)


def test_an_admitted_offer_without_a_result_times_out_and_a_late_reply_fails() -> None:
    async def main() -> None:
        async with pair(result_timeout=0.3) as p:
            answer = await p.client_direct.send_offer(p.server.addrs[0], OFFER)
            assert answer.refusal is not None and answer.refusal.reason is Reason.TIMEOUT
            [delivery] = p.sink.deliveries
            try:
                await delivery.reply(RESULT)
                raise AssertionError("a reply after the timeout must fail")
            except ReplyError:
                pass
            await wait_until(lambda: p.direct.active_handlers == 0, what="handler to finish")

    run_trio(main)


def test_garbage_is_malformed() -> None:
    async def main() -> None:
        async with pair() as p:
            # A claim that is not msgpack, a msgpack value that is not a claim, and an offer frame cut short.
            for protocol, payload in [
                (CLAIM_PROTOCOL, struct.pack(">I", 3) + b"\xc1\xc1\xc1"),
                (CLAIM_PROTOCOL, struct.pack(">I", 2) + pack([1])),
                (CLAIM_PROTOCOL, struct.pack(">I", 9) + pack({"type": "claim"})),
            ]:
                answer = await raw_exchange(p, protocol, payload)
                assert answer["reason"] == "malformed", (payload, answer)
            peer = await p.client.connect(p.server.addrs[0])
            stream = await p.client.open_stream(peer, OFFER_PROTOCOL)
            await stream.write(struct.pack(">I", 100) + b"short")
            await stream.close_write()  # type: ignore[attr-defined]  # EOF mid-frame (yamux has it, INetStream not)
            answer = unpack_strict(await read_frame(stream, max_len=4096, timeout=3), max_size=4096)
            assert answer["reason"] == "malformed"
            assert p.desk.claims == [] and p.sink.deliveries == []

    run_trio(main)


def test_claims_and_results_round_trip_through_the_desk() -> None:
    async def main() -> None:
        async with pair() as p:
            offer_id = bytes(range(16))
            assert await p.client_direct.request_claim(p.server.addrs[0], offer_id) is None
            p.desk.claim_answer = Rejection(Reason.CLAIM_REFUSED, "taken")
            assert await p.client_direct.request_claim(p.server.peer_id, offer_id) == p.desk.claim_answer
            assert p.desk.claims == [(offer_id, p.client.peer_id)] * 2

            assert await p.client_direct.send_result(p.server.peer_id, RESULT) is None
            p.desk.result_answer = Rejection(Reason.WRONG_EXECUTOR, "not the claimant")
            assert await p.client_direct.send_result(p.server.peer_id, RESULT) == p.desk.result_answer
            assert p.desk.results == [(RESULT, p.client.peer_id)] * 2

    run_trio(main)


def test_an_unreachable_peer_is_a_refusal_not_an_exception() -> None:
    async def main() -> None:
        async with pair() as p:
            absent = NodeIdentity.generate().peer_id
            answer = await p.client_direct.send_offer(f"/ip4/127.0.0.1/tcp/1/p2p/{absent}", OFFER)
            assert answer.refusal is not None and answer.refusal.reason is Reason.UNREACHABLE
            assert await p.client_direct.request_claim(absent, bytes(16)) is not None

    run_trio(main)


def test_a_stream_closed_or_reset_before_the_answer_is_unreachable_not_the_peers_refusal() -> None:
    """Issue 10: a failed or reset stream used to reach the caller as `malformed`, the peer's fault, so gossip stopped
    trying the offerer's other addresses. Nobody answered: `unreachable`. (With the frame fault mapped back to
    MALFORMED in `_ANSWER_FRAME_REASONS`, this fails.)"""

    async def main() -> None:
        async with pair() as p:
            for ending in ("reset", "close"):

                async def hang_up(stream: Any, ending: str = ending) -> None:
                    await read_frame(stream, max_len=1 << 16, timeout=5)
                    await (stream.reset() if ending == "reset" else stream.close())

                p.server.set_handler(OFFER_PROTOCOL, hang_up)
                answer = await p.client_direct.send_offer(p.server.addrs[0], OFFER)
                assert answer.refusal is not None, (ending, answer)
                assert answer.refusal.reason is Reason.UNREACHABLE, (ending, answer.refusal)

    run_trio(main)


def test_framing_round_trip() -> None:
    async def main() -> None:
        async with pair() as p:
            got: list[bytes] = []

            async def echo(stream: object) -> None:
                got.append(await read_frame(stream, max_len=10, timeout=1))
                await write_frame(stream, got[-1][::-1])
                await stream.close()  # type: ignore[attr-defined]

            p.server.set_handler("/test/echo/1", echo)
            peer = await p.client.connect(p.server.addrs[0])
            stream = await p.client.open_stream(peer, "/test/echo/1")
            await write_frame(stream, b"0123456789")
            assert await read_frame(stream, max_len=10, timeout=1) == b"9876543210"

    run_trio(main)


def test_a_peer_answers_for_its_current_status_and_a_peer_without_one_is_a_typed_refusal() -> None:
    async def main() -> None:
        async with pair() as p:
            status = await p.client_direct.request_status(p.server.addrs[0])
            assert status == {"peerId": p.server.peer_id, "sandboxMode": "docker"}
            # The client serves no status protocol: asking it is a refusal, not an exception.
            answer = await p.direct.request_status(p.client.peer_id)
            assert isinstance(answer, Rejection)
            garbage = await raw_exchange(p, STATUS_PROTOCOL, b"\x00\x00\x00\x02\xc1\xc1")
            assert garbage["type"] == "status"  # the request's content does not matter: any frame asks

    run_trio(main)
