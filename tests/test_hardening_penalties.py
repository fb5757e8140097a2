"""Penalties for invalid direct-stream frames, and bans: the state machine's properties, then over real connections
a peer sending oversized, malformed or badly signed frames cut off, counted and refused, while an honest peer
keeps its offers flowing and a peer that is merely refused (busy, unknown offer) is never penalised."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from mesh.metrics import NodeMetrics
from tests.hardening_support import RefusalLog
from tests.test_p2p_fakes import LOOPBACK, FakeDesk, RecordingSink, run_trio, wait_until
from transports.direct import CLAIM_PROTOCOL, OFFER_PROTOCOL, DirectTransport
from transports.framing import FrameError, read_frame, write_frame
from transports.hardening import Defences, PenaltyBox, PenaltyLimits, Refusal
from transports.hardening.holdoff import BusyHoldoff, HoldoffLimits
from transports.p2p import DialError, P2PHost, open_host
from transports.wire.codec import pack
from transports.wire.identity import NodeIdentity
from transports.wire.reasons import Reason, Rejection

# -- the state machine -------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@given(gaps=st.lists(st.floats(0, 200, allow_nan=False), min_size=1, max_size=40))
def test_a_peer_is_banned_exactly_when_its_decayed_strikes_pass_the_threshold_less_one(gaps: list[float]) -> None:
    clock = Clock()
    limits = PenaltyLimits(strikes=5.0, half_life=30.0, ban_seconds=100.0)
    box = PenaltyBox(limits, clock=clock)
    expected = 0.0
    for gap in gaps:
        clock.now += gap
        expected = expected * math.pow(0.5, gap / limits.half_life) + 1.0
        newly = box.strike("p")
        assert newly == (expected > limits.strikes - 1)
        if newly:
            assert box.banned("p") and box.strikes("p") == 0.0
            return
        assert math.isclose(box.strikes("p"), expected, rel_tol=1e-9)
    assert not box.banned("p")


@given(wait=st.floats(0, 300, allow_nan=False))
def test_a_ban_lasts_its_time_then_the_peer_starts_again_with_no_strikes(wait: float) -> None:
    clock = Clock()
    box = PenaltyBox(PenaltyLimits(ban_seconds=100.0), clock=clock)
    assert box.ban("p") and not box.ban("p")  # once: the second is no news
    assert not box.strike("p")  # a banned peer is not banned again
    clock.now += wait
    assert box.banned("p") == (wait < 100.0)
    if wait >= 100.0:
        assert box.strikes("p") == 0.0 and box.active_bans == 0


@given(peers=st.lists(st.integers(0, 60), max_size=300))
def test_memory_is_bounded_whatever_the_peers(peers: list[int]) -> None:
    box = PenaltyBox(PenaltyLimits(strikes=3.0, max_tracked=8, max_banned=5), clock=Clock())
    for peer in peers:
        box.strike(str(peer))
        assert len(box._strikes) <= 8 and len(box._banned) <= 5


def test_limits_are_checked() -> None:
    for bad in ({"strikes": 0}, {"half_life": -1}, {"ban_seconds": 0}, {"max_tracked": 0}, {"max_banned": 0}):
        with pytest.raises(ValueError):
            PenaltyLimits(**bad)


def test_the_refusals_exist_at_zero_in_the_metrics() -> None:
    text = NodeMetrics().exposition().decode()
    for reason in (Refusal.INVALID_GOSSIP, Refusal.INVALID_FRAMES, Refusal.PEER_BANNED):
        assert f'edgecoder_connection_refusals_total{{reason="{reason}"}} 0.0' in text


# -- over real connections ---------------------------------------------------------------------------------------


@dataclass
class Server:
    host: P2PHost
    direct: DirectTransport
    sink: RecordingSink
    desk: FakeDesk
    refusals: RefusalLog


@asynccontextmanager
async def server(*, limits: PenaltyLimits | None = None, holdoff: BusyHoldoff | None = None) -> AsyncIterator[Server]:
    refusals = RefusalLog()
    defences = Defences(penalties=limits or PenaltyLimits())
    sink, desk = RecordingSink(), FakeDesk()
    async with (
        open_host(NodeIdentity.generate(), [LOOPBACK], on_refusal=refusals, defences=defences) as host,
        trio.open_nursery() as nursery,
    ):
        sink.nursery = nursery
        sink.reply_with = b"result"
        direct = DirectTransport(
            host, desk, stall_timeout=2.0, holdoff=holdoff if holdoff is not None else BusyHoldoff()
        )
        await nursery.start(direct.run, sink)
        yield Server(host, direct, sink, desk, refusals)
        nursery.cancel_scope.cancel()


async def send_raw(client: P2PHost, peer: str, protocol: str, payload: bytes) -> bytes | None:
    """Write `payload` as it is on a new stream and read the answer frame; None when the stream or the connection
    was refused or cut."""
    try:
        stream = await client.open_stream(peer, protocol)
        await stream.write(payload)
        return await read_frame(stream, max_len=4096, timeout=5)
    except (DialError, FrameError, Exception):
        return None


async def redial_is_refused(client: P2PHost, s: Server) -> None:
    """The handshake completes (the PeerID is only known after it), then the server refuses the connection before
    registering it: the dialer sees it closed at once, or its dial fail."""
    before = s.refusals[Refusal.PEER_BANNED]
    try:
        await client.connect(s.host.addrs[0])
    except DialError:
        pass
    await wait_until(lambda: s.refusals[Refusal.PEER_BANNED] == before + 1, what="the redial refused")
    await wait_until(lambda: s.host.peer_id not in client.connected_peers(), what="the dialer to see it closed")
    assert client.peer_id not in s.host.connected_peers()


OVERSIZED = (10_000_000).to_bytes(4, "big")  # a frame announcing 10 MB: refused from its length alone
MALFORMED_CLAIM = len(b"\xc1").to_bytes(4, "big") + b"\xc1"  # 0xc1 is never valid msgpack


@pytest.mark.parametrize("kind", ["oversized", "malformed", "bad_signature"])
def test_a_peer_sending_invalid_frames_is_cut_off_counted_and_refused_while_an_honest_peer_keeps_offering(
    kind: str,
) -> None:
    async def main() -> None:
        async with (
            server() as s,
            open_host(NodeIdentity.generate(), [LOOPBACK]) as attacker,
            open_host(NodeIdentity.generate(), [LOOPBACK]) as honest,
        ):
            if kind == "bad_signature":  # what the intake answers for an offer whose signature does not verify
                s.sink.rejection = Rejection(Reason.BAD_SIGNATURE, "offer signature does not verify")
            honest_direct = DirectTransport(honest, FakeDesk())
            peer = await attacker.connect(s.host.addrs[0])
            protocol, payload = {
                "oversized": (OFFER_PROTOCOL, OVERSIZED),
                "malformed": (CLAIM_PROTOCOL, MALFORMED_CLAIM),
                "bad_signature": (OFFER_PROTOCOL, len(b"offer").to_bytes(4, "big") + b"offer"),
            }[kind]
            for _ in range(20):
                if await send_raw(attacker, peer, protocol, payload) is None:
                    break
            # The tenth invalid frame banned it: the server handled exactly ten, refusing each.
            reason = {"oversized": Reason.TOO_LARGE, "malformed": Reason.MALFORMED}.get(kind, Reason.BAD_SIGNATURE)
            assert s.direct.refused[str(reason)] == 10
            await wait_until(lambda: peer not in attacker.connected_peers(), what="attacker cut off")
            assert s.host.banned(attacker.peer_id)
            assert s.refusals[Refusal.INVALID_FRAMES] == 1

            await redial_is_refused(attacker, s)

            s.sink.rejection = None
            answer = await honest_direct.send_offer(s.host.addrs[0], b"an honest offer")
            assert answer.refusal is None and answer.result == b"result"
            assert not s.host.banned(honest.peer_id)

    run_trio(main)


def test_refusals_that_are_not_the_peers_fault_cost_it_nothing() -> None:
    """Unknown offers, a busy node, claims refused: 40 of them and the peer is as welcome as before (it waits as
    each busy refusal tells it to: one that does not is held off, tests/test_hardening_holdoff.py)."""

    async def main() -> None:
        holdoff = BusyHoldoff(HoldoffLimits(retry_after_s=0.02))
        async with server(holdoff=holdoff) as s, open_host(NodeIdentity.generate(), [LOOPBACK]) as client:
            s.desk.claim_answer = Rejection(Reason.UNKNOWN_OFFER, "no such offer")
            s.sink.rejection = Rejection(Reason.BUSY, "queue full")
            client_direct = DirectTransport(client, FakeDesk())
            for _ in range(20):
                refusal = await client_direct.request_claim(s.host.addrs[0], b"\x01" * 16)
                assert refusal is not None and refusal.reason == Reason.UNKNOWN_OFFER
                answer = await client_direct.send_offer(s.host.addrs[0], b"offer")
                assert answer.refusal is not None and answer.refusal.reason == Reason.BUSY
                assert answer.refusal.retry_after_ms == 20
                await trio.sleep(answer.refusal.retry_after_ms / 1000)
            assert s.host.penalties.strikes(client.peer_id) == 0.0
            assert client.peer_id in s.host.connected_peers()

    run_trio(main)


def test_a_banned_peer_still_connected_has_its_streams_reset_unread() -> None:
    async def main() -> None:
        async with server() as s, open_host(NodeIdentity.generate(), [LOOPBACK]) as client:
            peer = await client.connect(s.host.addrs[0])
            assert s.host.penalties.ban(client.peer_id)  # banned, not yet disconnected
            assert await send_raw(client, peer, CLAIM_PROTOCOL, pack({"type": "claim"})) is None
            assert s.refusals[Refusal.PEER_BANNED] == 1 and s.desk.claims == []

    run_trio(main)


def test_when_the_ban_ends_the_peer_may_connect_again() -> None:
    async def main() -> None:
        limits = PenaltyLimits(strikes=2, ban_seconds=3.0)
        async with server(limits=limits) as s, open_host(NodeIdentity.generate(), [LOOPBACK]) as client:
            peer = await client.connect(s.host.addrs[0])
            for _ in range(2):
                await send_raw(client, peer, OFFER_PROTOCOL, OVERSIZED)
            await wait_until(lambda: s.host.banned(client.peer_id), what="ban")
            await wait_until(lambda: peer not in client.connected_peers(), what="cut off")
            await redial_is_refused(client, s)
            await wait_until(lambda: not s.host.banned(client.peer_id), what="the ban to end")
            assert await client.connect(s.host.addrs[0]) == s.host.peer_id
            stream = await client.open_stream(s.host.peer_id, CLAIM_PROTOCOL)
            await write_frame(stream, pack({"type": "claim", "offerId": b"\x02" * 16}))
            assert await read_frame(stream, max_len=4096, timeout=5)

    run_trio(main)
