"""The offering side's claims (issue 11): a claim must be bound to a key that can be checked, and a grant that never
delivers must lapse. Driven through the I/O-free `OfferServer` with a fake clock, and once over the simulated radio.
"""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
import trio

from tests.test_ble_support import FAST, NODE, OFFERER, FakeIntake, signed_offer, signed_result
from transports.ble import BleTransport
from transports.ble.framing import Reassembler, encode_frames
from transports.ble.offer_server import Disconnect, Notify, OfferServer, ServerLimits
from transports.ble.protocol import (
    EXCHANGE_UUID,
    MAX_SMALL_MESSAGE,
    NONCE_SIZE,
    OFFER_UUID,
    SEND_OFFER,
    Answer,
    Capabilities,
    Claim,
    Kind,
    Refusal,
    offer_digest,
)
from transports.ble.results import verify_with_mesh_codec
from transports.ble.sim import open_simulated_radio
from transports.wire.identity import NodeIdentity

MTU = 247
OFFER = b""  # signed afresh for each test (fresh_offer): an offer signed at import had expired (60 s) under load


@pytest.fixture(autouse=True)
def fresh_offer() -> None:
    global OFFER
    OFFER = signed_offer()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Central:
    """One link to an `OfferServer`, speaking the protocol as the node's central does (framing included)."""

    def __init__(self, server: OfferServer, link: int) -> None:
        self.server, self.link = server, link
        self.actions = server.connect(link)
        self.nonce = Capabilities.decode(server.capabilities(link)).nonce
        self.sent = 0
        self.answers = Reassembler(MAX_SMALL_MESSAGE)

    def send(self, message: bytes) -> list[Answer]:
        frames = encode_frames(message, MTU - 3, self.sent)
        self.sent += 1
        answers = []
        for frame in frames:
            for action in self.server.write(self.link, EXCHANGE_UUID, frame, MTU):
                self.actions.append(action)
                if isinstance(action, Notify):
                    for notified in action.frames:
                        done = self.answers.feed(notified)
                        if done is not None:
                            answers.append(Answer.decode(done))
        return answers

    def claim(self, signer: NodeIdentity, nonce: bytes | None = None, peer_id: str | None = None) -> Answer:
        claim = Claim.signed(signer, self.nonce if nonce is None else nonce, offer_digest(OFFER))
        if peer_id is not None:
            claim = dataclasses.replace(claim, claimant=peer_id)
        (answer,) = self.send(claim.encode())
        return answer

    def result(self, signer: NodeIdentity) -> Answer:
        (answer,) = self.send(bytes([Kind.RESULT]) + signed_result(OFFER, signer))
        return answer


def server(clock: Clock | None = None, **limits: float) -> OfferServer:
    return OfferServer(OFFER, verify_with_mesh_codec, limits=ServerLimits(**limits), clock=clock or Clock())  # type: ignore[arg-type]


def test_a_claim_carrying_any_string_as_its_claimant_is_refused_and_locks_nothing() -> None:
    s = server()
    attacker = Central(s, 1)
    for fake in ("anything", "12D3KooWnotakey", "Qm" + "1" * 44, ""):
        answer = attacker.claim(NODE, peer_id=fake)
        assert not answer.ok
    # A secp256k1 or RSA PeerID embeds no Ed25519 key: refused, never a crash (issue 11's offerer crash).
    assert not attacker.claim(NODE, peer_id="16Uiu2HAmLhLvBoYaoZfaMUKuibM6ac163GwKY74c5kiSLg5KvLpY").ok
    assert s.granted_to is None
    assert Central(s, 2).claim(NODE).ok  # the honest claimant still gets it


def test_a_claim_in_someone_elses_name_or_replayed_from_another_link_is_refused() -> None:
    s = server()
    impostor = NodeIdentity.generate()
    a = Central(s, 1)
    # Signed by the impostor but naming NODE's PeerID: the signature does not verify for NODE's key.
    forged = Claim.signed(impostor, a.nonce, offer_digest(OFFER))
    (answer,) = a.send(dataclasses.replace(forged, claimant=NODE.peer_id).encode())
    assert not answer.ok and "signature" in answer.detail
    # NODE's genuine claim, captured on link 2 and replayed on link 3: link 3's nonce differs.
    b, c = Central(s, 2), Central(s, 3)
    captured = Claim.signed(NODE, b.nonce, offer_digest(OFFER))
    (replayed,) = c.send(captured.encode())
    assert not replayed.ok and "signature" in replayed.detail
    assert s.granted_to is None


def test_one_claimant_at_a_time_and_the_same_claimant_again_after_a_reconnect() -> None:
    s = server()
    assert Central(s, 1).claim(NODE).ok
    assert not Central(s, 2).claim(NodeIdentity.generate()).ok
    s.disconnect(1)
    again = Central(s, 3)
    assert again.claim(NODE).ok  # the grant holder on a new link
    assert again.result(NODE).ok and s.result is not None


def test_a_grant_that_never_delivers_lapses_and_the_offer_opens_to_others() -> None:
    clock = Clock()
    s = server(clock, grant_lease_s=30.0)
    squatter, honest = NodeIdentity.generate(), NodeIdentity.generate()
    link = Central(s, 1)
    assert link.claim(squatter).ok
    clock.now = 29.0
    assert not Central(s, 2).claim(honest).ok  # still within the lease
    clock.now = 30.0
    assert s.granted_to is None and s.lapsed == {squatter.peer_id}
    late = Central(s, 3)
    assert not late.claim(squatter).ok  # the lapsed key is not granted this offer again
    assert not link.result(squatter).ok  # nor may it deliver on its old link
    winner = Central(s, 4)
    assert winner.claim(honest).ok and winner.result(honest).ok
    assert s.result.executor == honest.public_key


def test_re_claiming_does_not_extend_the_lease() -> None:
    clock = Clock()
    s = server(clock, grant_lease_s=10.0)
    squatter = NodeIdentity.generate()
    for step in range(1, 10):
        clock.now = float(step)
        assert Central(s, step).claim(squatter).ok  # a reconnect every second
        s.disconnect(step)
    clock.now = 11.0  # ten seconds after the first grant, however often it was renewed
    assert s.granted_to is None and squatter.peer_id in s.lapsed


def test_ungranted_links_may_buffer_only_a_small_message_and_links_are_bounded() -> None:
    s = server(max_links=2)
    a, b = Central(s, 1), Central(s, 2)
    assert isinstance(Central(s, 3).actions[0], Disconnect)  # a third link at once is dropped
    answers = a.send(b"\x02" + b"x" * 10_000)  # a result-sized message without a grant
    # Refused at its first frame, before buffering; every later frame is out of turn, and the link that keeps
    # sending them is dropped once it has spent its message budget.
    assert answers[0].detail == "ble/too_large" and not any(x.ok for x in answers)
    assert s.buffered_bytes == 0 and any(isinstance(x, Disconnect) for x in a.actions)
    assert b.claim(NODE).ok
    for frame in encode_frames(b"\x02" + b"y" * 10_000, MTU - 3, b.sent)[:-1]:
        s.write(2, EXCHANGE_UUID, frame, MTU)
    assert 0 < s.buffered_bytes <= ServerLimits().max_result_bytes + 1  # only the grant holder buffers a result


def test_a_link_that_talks_too_much_is_dropped() -> None:
    s = server(max_messages_per_link=3, max_offer_sends_per_link=1)
    a = Central(s, 1)
    assert isinstance(s.write(1, OFFER_UUID, SEND_OFFER, MTU)[0], Notify)
    assert isinstance(s.write(1, OFFER_UUID, SEND_OFFER, MTU)[0], Disconnect)
    b = Central(s, 2)
    for _ in range(3):
        b.send(Refusal("busy").encode())
    b.send(Refusal("busy").encode())
    assert any(isinstance(x, Disconnect) for x in b.actions)
    assert len(s.refusals) == 3 and a.link == 1


def test_each_link_gets_its_own_nonce() -> None:
    s = server()
    nonces = {Central(s, i).nonce for i in range(1, 4)}
    assert len(nonces) == 3 and all(len(n) == NONCE_SIZE for n in nonces)
    assert msgpack.unpackb(s.capabilities(99))["nonce"] == bytes(NONCE_SIZE)  # no link: a nonce nobody can use


def test_over_the_radio_a_lapsed_squatter_gives_way_to_an_honest_node() -> None:
    """A node that wins the claim and never replies holds the offer only for the lease; then another node runs it."""

    async def main() -> None:
        squatter = NodeIdentity.generate()
        silent = FakeIntake(executor=squatter)
        never = trio.Event()
        silent.before_reply = never.wait  # claims, then never delivers
        honest = FakeIntake()
        with trio.fail_after(20):
            async with open_simulated_radio() as radio, trio.open_nursery() as work:
                silent.background = work
                laptop = await radio.add_offering_peer(OFFERER, OFFER, limits=ServerLimits(grant_lease_s=1.0))
                a, b = await radio.central_backend(), await radio.central_backend()
                policy = dataclasses.replace(FAST, result_timeout_s=30.0)
                async with BleTransport.open(silent, policy, claimant=squatter, backend=a):
                    await silent.decided.wait()  # claimed and admitted; its reply never comes
                    # The honest node is refused while the lease runs, and tries again soon after.
                    eager = dataclasses.replace(FAST, retry_after_s=0.2)
                    async with BleTransport.open(honest, eager, claimant=NODE, backend=b):
                        result = await laptop.wait_result()
                    state = await laptop.state()
                    work.cancel_scope.cancel()
        assert result.executor == NODE.public_key
        assert state.lapsed == [squatter.peer_id]
        assert [c.claimant for c in state.claims if c.granted] == [squatter.peer_id, NODE.peer_id]

    trio.run(main)
