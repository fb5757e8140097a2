"""Fuzz harness for every BLE parser a hostile peer reaches, seeded from real messages.

Two targets, each fed `inputs` mutated frames:

* the offering side's GATT write path: `OfferServer.write` on several links (OFFER, EXCHANGE and unknown
  characteristics), with links connecting and dropping, the clock moving and grants lapsing. Seeds are the frames of
  real messages: signed claims valid for the link they are written on, signed results, refusals, SEND_OFFER.
* the node's side: the notification inboxes (`link.Inbox.on_frame`, the offer's and the exchange's, at their real
  caps) and the decoders of what a peripheral serves or notifies (`PeerInfo`, `Capabilities`, `Answer`).

After every input the invariants are checked: nothing but `BleFault` escapes a decoder, nothing at all escapes a
write or a notification handler, buffered bytes stay within the documented bounds, link and record counts stay
within their caps. Memory is measured with tracemalloc (current and peak, over the whole run).

Run: `.venv/bin/python -m tests.ble_fuzz --inputs 100000` (prints the totals; exit 1 on any violation).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tests.test_ble_support import signed_offer, signed_result
from transports.ble.framing import DIGEST_SIZE, SEQ, START, encode_frames, notify_frame_size
from transports.ble.link import MAX_PENDING_MESSAGES, Inbox
from transports.ble.offer_server import Notify, OfferServer, ServerLimits
from transports.ble.protocol import (
    DEFAULT_MAX_OFFER_BYTES,
    EXCHANGE_UUID,
    MAX_SMALL_MESSAGE,
    NONCE_SIZE,
    OFFER_UUID,
    SEND_OFFER,
    Answer,
    Capabilities,
    Claim,
    Kind,
    PeerInfo,
    Refusal,
    offer_digest,
)
from transports.ble.reasons import BleFault
from transports.ble.results import verify_with_mesh_codec
from transports.wire.identity import NodeIdentity

T = TypeVar("T")
MTUS = (23, 185, 247, 517)
# Growth after the warm-up is caches filling (bounded ones), not state kept per input: well under 1 MB. Measured in a
# process of its own (tracemalloc counts every thread's allocations).
MAX_GROWTH_BYTES = 1_000_000
ROUND_INPUTS = 500
LINKS = 6
CHARACTERISTICS = (EXCHANGE_UUID, EXCHANGE_UUID, EXCHANGE_UUID, OFFER_UUID, "5e7c0de0-0000-0000-0000-00000000beef")


@dataclass
class Totals:
    target: str
    inputs: int = 0
    crashes: int = 0
    violations: list[str] = field(default_factory=list)
    faults: int = 0  # typed rejections (expected)
    accepted: int = 0  # complete messages or decodes that passed
    results: int = 0  # verified results the offering side accepted
    answers: int = 0  # notifications the offering side sent back
    dropped: int = 0  # links the offering side dropped
    max_buffered: int = 0
    bound: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{self.target}: {self.inputs} inputs, {self.crashes} crashes, {len(self.violations)} violations, "
            f"{self.faults} typed rejections, {self.accepted} accepted (grants or decodes), {self.results} results, "
            f"{self.answers} answers, {self.dropped} links "
            f"dropped, max buffered {self.max_buffered} B "
            f"(bound {self.bound} B), {self.seconds:.1f} s ({1e6 * self.seconds / max(1, self.inputs):.0f} us/input)"
        )


def last(records: Sequence[T]) -> T | None:
    return records[-1] if records else None


def mutate(rng: random.Random, frame: bytes) -> bytes:
    """One mutation of a real frame, chosen to hit the headers as often as the payload."""
    data = bytearray(frame)
    choice = rng.randrange(10)
    if choice == 0 and data:  # flip bits
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate
        del data[rng.randrange(len(data) + 1) :]
    elif choice == 2:  # extend
        data += rng.randbytes(rng.randint(1, 64))
    elif choice == 3 and len(data) >= SEQ.size:  # any sequence number
        data[: SEQ.size] = SEQ.pack(rng.choice((0, 1, 2, rng.randrange(1 << 16), (1 << 16) - 1)))
    elif choice == 4 and len(data) >= SEQ.size + START.size:  # any message number and declared length
        length = rng.choice((0, 1, DIGEST_SIZE, MAX_SMALL_MESSAGE + 1, 1 << 20, (1 << 32) - 1, rng.randrange(1 << 32)))
        data[SEQ.size : SEQ.size + START.size] = START.pack(rng.randrange(256), length)
    elif choice == 5:  # random bytes of any size up to a long attribute
        data = bytearray(rng.randbytes(rng.choice((0, 1, 2, 7, 20, 244, 512, rng.randrange(600)))))
    elif choice == 6 and data:  # one byte set to an edge value
        data[rng.randrange(len(data))] = rng.choice((0x00, 0x7F, 0x80, 0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF))
    # 7-9: the real frame unchanged (so that reassembly also makes progress)
    return bytes(data)


class WritePathFuzz:
    """The offering side: many links writing mutated real frames to one `OfferServer`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = 0.0
        self.offerer = NodeIdentity.generate()
        self.nodes = [NodeIdentity.generate() for _ in range(2)]
        self.offer = signed_offer(pad=3000)
        self.limits = ServerLimits(grant_lease_s=30.0, link_idle_s=20.0)
        self._nonce = 0
        self.new_round()
        self.totals = Totals("GATT write path (offering side)")
        self.totals.bound = self.limits.max_result_bytes + 1 + self.limits.max_links * MAX_SMALL_MESSAGE
        self.results = [signed_result(self.offer, node) for node in self.nodes]

    def new_round(self) -> None:
        """A fresh offering side (a new offer round), so that grants and results keep being exercised."""
        self.server = OfferServer(
            self.offer, verify_with_mesh_codec, limits=self.limits, clock=lambda: self.now, make_nonce=self.make_nonce
        )
        self.nonces: dict[int, bytes] = {}
        self.sent: dict[int, int] = {}
        self.connected: set[int] = set()
        self.counted_result = False

    def make_nonce(self) -> bytes:
        self._nonce += 1
        return self._nonce.to_bytes(NONCE_SIZE, "big")

    def seed_frames(self, link: int, mtu: int) -> tuple[str, list[bytes]]:
        """The characteristic and frames of one real message this link could send (sometimes to the wrong place)."""
        nonce = self.nonces.get(link, bytes(NONCE_SIZE))
        node = self.rng.choice(self.nodes)
        size = notify_frame_size(mtu)
        # Mostly the number the link expects next (so that whole messages get through), sometimes any.
        number = self.sent.get(link, 0) if self.rng.random() < 0.7 else self.rng.randrange(256)
        choice = self.rng.randrange(5)
        if choice == 0:
            message = Claim.signed(node, nonce, offer_digest(self.offer)).encode()
        elif choice == 1:
            message = bytes([Kind.RESULT]) + self.results[self.nodes.index(node)]
        elif choice == 2:
            message = Refusal("busy", "x" * self.rng.randrange(300)).encode()
        elif choice == 3:
            return (OFFER_UUID if self.rng.random() < 0.8 else EXCHANGE_UUID), [SEND_OFFER]
        else:
            message = bytes([self.rng.randrange(256)]) + self.rng.randbytes(self.rng.randrange(40))
        characteristic = EXCHANGE_UUID if self.rng.random() < 0.8 else self.rng.choice(CHARACTERISTICS)
        return characteristic, encode_frames(message, size, number)

    def step(self) -> None:
        if self.totals.inputs % ROUND_INPUTS == 0:
            self.new_round()
        rng, server = self.rng, self.server
        link = rng.randrange(1, LINKS + 1)
        roll = rng.random()
        if roll < 0.02:
            server.disconnect(link)
            self.connected.discard(link)
            return
        if roll < 0.04:
            self.now += rng.choice((0.5, 5.0, 31.0))
            for action in server.tick():
                self.totals.dropped += 1
                server.disconnect(action.link)
                self.connected.discard(action.link)
            return
        if link not in self.connected:
            if not server.connect(link):
                self.connected.add(link)
                self.sent[link] = 0
                self.nonces[link] = server.capabilities(link)[-NONCE_SIZE:]
            return
        mtu = rng.choice(MTUS)
        characteristic, frames = self.seed_frames(link, mtu)
        whole = rng.random() < 0.5
        start = 0 if whole else rng.randrange(len(frames))
        if whole and characteristic == EXCHANGE_UUID and frames[0] != SEND_OFFER:
            self.sent[link] = self.sent.get(link, 0) + 1
        for frame in frames[start : None if whole else start + rng.randint(1, 8)]:
            value = mutate(rng, frame) if rng.random() < (0.1 if whole else 0.5) else frame
            # The records are bounded deques: a new record is told by its identity, not by the length.
            last_claim, last_refused = last(server.claims), last(server.results_refused)
            actions = server.write(link, characteristic, value, mtu)
            claim = last(server.claims)
            if claim is not last_claim and claim is not None:
                self.totals.accepted += claim.granted
                self.totals.faults += not claim.granted
            self.totals.faults += last(server.results_refused) is not last_refused
            for action in actions:
                if isinstance(action, Notify):
                    self.totals.answers += 1
                    if any(len(f) > notify_frame_size(mtu) for f in action.frames):
                        self.totals.violations.append(f"a notification frame larger than MTU-3 at MTU {mtu}")
                else:
                    self.totals.dropped += 1
                    server.disconnect(action.link)
                    self.connected.discard(action.link)
        self.check()

    def check(self) -> None:
        server, t = self.server, self.totals
        buffered = server.buffered_bytes
        t.max_buffered = max(t.max_buffered, buffered)
        if buffered > t.bound:
            t.violations.append(f"{buffered} bytes buffered > bound {t.bound}")
        if server.link_count > self.limits.max_links:
            t.violations.append(f"{server.link_count} links > {self.limits.max_links}")
        if len(server.claims) > self.limits.keep_records or len(server.refusals) > self.limits.keep_records:
            t.violations.append("records over their cap")
        if server.result is not None and server.result.offer_digest != offer_digest(self.offer):
            t.violations.append("accepted a result for another offer")
        if server.result is not None and not self.counted_result:
            self.counted_result = True
            t.results += 1


class NodeSideFuzz:
    """The node's side: notification inboxes at their real caps, and the decoders of what a peripheral serves."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.totals = Totals("notification and read path (node side)")
        self.totals.bound = DEFAULT_MAX_OFFER_BYTES + DIGEST_SIZE
        identity = NodeIdentity.generate()
        offer = signed_offer(pad=2000)
        self.seeds: list[tuple[str, bytes]] = [
            ("identity", PeerInfo(identity.peer_id, identity.public_key).encode()),
            ("capabilities", Capabilities(rng.randbytes(NONCE_SIZE)).encode()),
            ("answer", Answer(Kind.GRANT, True).encode()),
            ("answer", Answer(Kind.RESULT_ACK, False, "no").encode()),
            ("offer", offer),
        ]
        self.new_inboxes()

    def new_inboxes(self) -> None:
        self.offers = Inbox(DEFAULT_MAX_OFFER_BYTES)
        self.exchange = Inbox(MAX_SMALL_MESSAGE)

    def decode(self, kind: str, value: bytes) -> None:
        decoder: Callable[[bytes], object] = {
            "identity": PeerInfo.decode,
            "capabilities": Capabilities.decode,
            "answer": Answer.decode,
        }[kind]
        try:
            decoder(value)
            self.totals.accepted += 1
        except BleFault:
            self.totals.faults += 1

    def step(self) -> None:
        rng = self.rng
        kind, message = rng.choice(self.seeds)
        if rng.random() < 0.3 and kind != "offer":
            self.decode(kind, mutate(rng, message))  # a read value (no framing)
            return
        inbox = self.offers if kind == "offer" else self.exchange
        frames = encode_frames(message, notify_frame_size(rng.choice(MTUS)), rng.randrange(3))
        for frame in frames[: rng.randint(1, len(frames))]:
            inbox.on_frame(None, bytearray(mutate(rng, frame) if rng.random() < 0.4 else frame))  # type: ignore[arg-type]
        for box, cap in ((self.offers, DEFAULT_MAX_OFFER_BYTES), (self.exchange, MAX_SMALL_MESSAGE)):
            buffered = box._reassembler.buffered
            self.totals.max_buffered = max(self.totals.max_buffered, buffered)
            if buffered > cap + DIGEST_SIZE:
                self.totals.violations.append(f"inbox buffered {buffered} > {cap + DIGEST_SIZE}")
            if len(box._items) > MAX_PENDING_MESSAGES + 1:
                self.totals.violations.append(f"{len(box._items)} pending messages")
            for item in box._items:
                self.totals.faults += isinstance(item, BleFault)
                self.totals.accepted += isinstance(item, bytes)
            if box._failed or len(box._items) > 1:  # a failed inbox is a session's end: the node opens a new one
                self.new_inboxes()
                break


@dataclass
class Memory:
    after_warm_up: int  # bytes held once each target has run its first tenth (imports, caches, first buffers)
    at_end: int
    peak: int

    @property
    def growth(self) -> int:
        return self.at_end - self.after_warm_up


def run(inputs: int, seed: int = 1) -> tuple[list[Totals], Memory]:
    """Fuzz both targets with `inputs` inputs each. Returns the totals and the memory held (tracemalloc)."""
    targets = (WritePathFuzz(random.Random(seed)), NodeSideFuzz(random.Random(seed + 1)))
    warm_up = max(1, inputs // 10)
    tracemalloc.start()
    for target in targets:
        feed(target, warm_up)
    after_warm_up = tracemalloc.get_traced_memory()[0]
    for target in targets:
        feed(target, inputs - warm_up)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return [t.totals for t in targets], Memory(after_warm_up, current, peak)


def feed(target: WritePathFuzz | NodeSideFuzz, count: int) -> None:
    began = time.perf_counter()
    for _ in range(count):
        target.totals.inputs += 1
        try:
            target.step()
        except Exception as exc:  # anything escaping is a crash: the node (or offerer) would go down
            target.totals.crashes += 1
            target.totals.violations.append(f"{type(exc).__name__}: {exc}")
    target.totals.seconds += time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    totals, memory = run(args.inputs, args.seed)
    for t in totals:
        print(t.line())
        for violation in t.violations[:5]:
            print(f"  violation: {violation}")
    print(
        f"memory (tracemalloc): {memory.after_warm_up / 1e6:.2f} MB after the first tenth, "
        f"{memory.at_end / 1e6:.2f} MB at the end (growth {memory.growth / 1e3:+.0f} kB), "
        f"peak {memory.peak / 1e6:.2f} MB"
    )
    unbounded = memory.growth >= MAX_GROWTH_BYTES
    if unbounded:
        print(f"  violation: memory grew {memory.growth / 1e3:.0f} kB after the warm-up (bound {MAX_GROWTH_BYTES:,} B)")
    return 1 if unbounded or any(t.violations for t in totals) else 0


if __name__ == "__main__":
    sys.exit(main())
