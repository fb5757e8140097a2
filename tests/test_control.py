"""The control stream: one long-lived stream per peer carries claims, results, statuses, pushes and aborts,
multiplexed by id, with the same answers and bounds as the one-exchange protocols, and a fallback for peers that do
not speak it."""

from __future__ import annotations

import itertools
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.stream_muxer.yamux.yamux import TYPE_WINDOW_UPDATE, YAMUX_HEADER_FORMAT

from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.control import CONTROL_PROTOCOL
from transports.direct import MAX_CONTROL_FRAME, DirectTransport
from transports.framing import read_frame, write_frame
from transports.p2p import P2PHost, open_host
from transports.pubsub import LEAN, STOCK, PubsubTuning
from transports.wire.codec import pack, unpack_strict
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason, Rejection

OFFER_ID = b"\x01" * 16


@dataclass
class Pair:
    server: P2PHost
    client: P2PHost
    server_direct: DirectTransport
    client_direct: DirectTransport
    desk: FakeDesk
    statuses: itertools.count[int]
    nursery: trio.Nursery


@asynccontextmanager
async def pair(tuning: PubsubTuning = LEAN) -> AsyncIterator[Pair]:
    desk = FakeDesk()
    statuses = itertools.count()
    async with (
        open_host(NodeIdentity.generate(), [LOOPBACK], tuning=tuning) as server,
        open_host(NodeIdentity.generate(), [LOOPBACK], tuning=tuning) as client,
        trio.open_nursery() as nursery,
    ):
        pushed: list[tuple[str, dict[str, Any]]] = []
        server_direct = DirectTransport(
            server,
            desk,
            stall_timeout=2.0,
            status=lambda: {"peerId": server.peer_id, "n": next(statuses)},
            abort=lambda sender, offer_id: offer_id == OFFER_ID,
            presence=lambda sender, status: pushed.append((sender, status)),
        )
        client_direct = DirectTransport(client, FakeDesk(), stall_timeout=2.0)
        await nursery.start(server_direct.run, RecordingSink())
        await nursery.start(client_direct.run, RecordingSink())
        await client.connect(server.addrs[0])
        yield Pair(server, client, server_direct, client_direct, desk, statuses, nursery)
        nursery.cancel_scope.cancel()


def test_every_kind_of_request_travels_on_one_stream() -> None:
    async def main() -> None:
        async with pair() as p:
            peer = p.server.peer_id
            for _ in range(5):
                assert await p.client_direct.request_claim(peer, OFFER_ID) is None
                assert await p.client_direct.send_result(peer, b"signed result") is None
            assert isinstance(await p.client_direct.request_status(peer), dict)
            assert await p.client_direct.push_status(peer, {"peerId": p.client.peer_id}) is None
            assert await p.client_direct.send_abort(peer, OFFER_ID) is None
            unknown = await p.client_direct.send_abort(peer, b"\x02" * 16)
            assert unknown is not None and unknown.reason == Reason.UNKNOWN_OFFER  # the same refusal as before
            assert p.client_direct.control.opened == 1
            assert len(p.desk.claims) == 5 and p.desk.results == [(b"signed result", p.client.peer_id)] * 5
            assert p.server_direct.active_handlers == 1  # the control stream's handler, and no other stream

    run_trio(main)


def test_both_ends_read_a_lean_control_stream_without_returning_credit_after_each_frame() -> None:
    """Buffered reads with half-window credit (`PubsubTuning.control_reads`): 20 exchanges move a few KB, under half a
    window, so neither end sends a WINDOW_UPDATE; a stock stream credits after nearly every read, on both ends."""

    async def updates(tuning: PubsubTuning) -> int:
        async with pair(tuning) as p:
            peer = p.server.peer_id
            assert await p.client_direct.request_claim(peer, OFFER_ID) is None  # the stream is open
            seen = [0]
            for host, other in ((p.server, p.client), (p.client, p.server)):
                conn = host.host.get_network().get_connections(ID.from_base58(other.peer_id))[0].muxed_conn
                write_frame = conn._write_frame  # type: ignore[attr-defined]

                async def counting(data: bytes, write_frame: Any = write_frame) -> None:
                    if struct.unpack(YAMUX_HEADER_FORMAT, data[:12])[1] == TYPE_WINDOW_UPDATE:
                        seen[0] += 1
                    await write_frame(data)

                conn._write_frame = counting  # type: ignore[attr-defined]
            for _ in range(10):
                assert await p.client_direct.request_claim(peer, OFFER_ID) is None
                assert await p.client_direct.send_result(peer, b"signed result") is None
            assert p.client_direct.control.opened == 1
            return seen[0]

    async def main() -> None:
        assert await updates(LEAN) == 0
        assert await updates(STOCK) >= 20

    run_trio(main)


def test_concurrent_requests_each_get_their_own_answer() -> None:
    async def main() -> None:
        async with pair() as p:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await p.client_direct.request_status(p.server.peer_id))

            async with trio.open_nursery() as nursery:
                for _ in range(40):  # more than MAX_IN_FLIGHT: the rest wait their turn
                    nursery.start_soon(ask)
            assert sorted(a["n"] for a in answers) == list(range(40))  # each answer went to exactly one request
            assert p.client_direct.control.opened == 1

    run_trio(main)


def test_the_desks_refusal_comes_back_as_it_would_on_a_stream_of_its_own() -> None:
    async def main() -> None:
        async with pair() as p:
            p.desk.claim_answer = Rejection(Reason.NOT_INVITED, "other invitees")
            refusal = await p.client_direct.request_claim(p.server.peer_id, OFFER_ID)
            assert refusal == p.desk.claim_answer
            assert p.server_direct.refused[str(Reason.NOT_INVITED)] == 1

    run_trio(main)


def test_a_peer_without_the_control_protocol_is_asked_the_old_way() -> None:
    async def main() -> None:
        async with pair() as p:
            p.server.remove_handler(CONTROL_PROTOCOL)
            assert await p.client_direct.request_claim(p.server.peer_id, OFFER_ID) is None
            assert await p.client_direct.request_claim(p.server.peer_id, OFFER_ID) is None
            assert p.client_direct.control.opened == 0 and len(p.desk.claims) == 2

    run_trio(main)


def test_a_dropped_connection_fails_nothing_later_the_next_request_opens_a_new_stream() -> None:
    async def main() -> None:
        async with pair() as p:
            assert await p.client_direct.request_claim(p.server.peer_id, OFFER_ID) is None
            await p.client.disconnect(p.server.peer_id)
            await wait_until(lambda: not p.client_direct.control._channels, what="the channel to close")
            assert await p.client_direct.request_claim(p.server.addrs[0], OFFER_ID) is None  # redials
            assert p.client_direct.control.opened == 2

    run_trio(main)


async def raw_control(p: Pair) -> Any:
    stream = await p.client.open_stream(p.server.peer_id, CONTROL_PROTOCOL)
    return stream


async def answer_of(stream: Any) -> dict[str, Any]:
    answer = unpack_strict(await read_frame(stream, max_len=MAX_CONTROL_FRAME, timeout=5), max_size=MAX_CONTROL_FRAME)
    assert isinstance(answer, dict)
    return answer


def test_hostile_control_frames_get_typed_refusals_and_the_node_keeps_serving() -> None:
    async def main() -> None:
        async with pair() as p:
            stream = await raw_control(p)
            # A claim request past a claim's bound is refused by its id, and the stream goes on.
            await write_frame(stream, pack({"id": 1, "type": "claim", "offerId": OFFER_ID, "pad": "x" * 9000}))
            assert await answer_of(stream) == {
                "re": 1,
                "type": "refusal",
                "reason": "too_large",
                "detail": "a claim request of 9049 bytes",
            }
            await write_frame(stream, pack({"id": 2, "type": "claim", "offerId": b"short"}))
            assert (await answer_of(stream))["reason"] == "malformed"
            await write_frame(stream, pack({"id": 3, "type": "teleport"}))
            assert (await answer_of(stream))["reason"] == "malformed"
            await write_frame(stream, pack({"id": 4, "type": "claim", "offerId": OFFER_ID}))
            assert await answer_of(stream) == {"re": 4, "type": "grant"}
            # A frame without an id cannot be answered by id: refused, and the stream is closed.
            await write_frame(stream, pack(["not", "a", "map"]))
            assert (await answer_of(stream))["reason"] == "malformed"
            # Nothing of it reached the client's own channel, which still works.
            assert await p.client_direct.request_claim(p.server.peer_id, OFFER_ID) is None

    run_trio(main)


def test_an_answer_to_a_request_never_made_closes_that_channel_only() -> None:
    async def main() -> None:
        async with pair() as p:

            async def lying(stream: Any) -> None:
                frame = await read_frame(stream, max_len=MAX_CONTROL_FRAME, timeout=5)
                request = unpack_strict(frame, max_size=MAX_CONTROL_FRAME)
                await write_frame(stream, pack({"re": request["id"] + 100, "type": "grant"}))
                await trio.sleep(5)

            p.server.set_handler(CONTROL_PROTOCOL, lying)
            refusal = await p.client_direct.request_claim(p.server.peer_id, OFFER_ID)
            assert refusal is not None and refusal.reason == Reason.UNREACHABLE
            await wait_until(lambda: not p.client_direct.control._channels, what="the lying channel to close")

    run_trio(main)
