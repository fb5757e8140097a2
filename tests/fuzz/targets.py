"""The fuzz targets: each takes bytes from a peer and must end in the parser's typed rejection or a value.

A target returns normally for both; anything it raises is a crash. `SEEDS` builds each target's seed corpus from
real messages, so that the fuzzer starts from inputs that reach deep into each parser.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import msgpack
import trio

from executor.contract import ExecResult
from mesh.coordinator.app import _json_object
from mesh.intake import Intake, IntakePolicy
from mesh.peers import Heartbeat
from transports.ble.framing import Reassembler, encode_frames
from transports.ble.protocol import Answer, Capabilities, Claim, Kind, PeerInfo, Refusal
from transports.ble.reasons import BleFault
from transports.coordinator import parse_pull_answer
from transports.direct import MAX_CONTROL_FRAME, decode_answer, decode_request, refusal_message
from transports.framing import FrameError, read_frame
from transports.wire import agent_requests as signing
from transports.wire.codec import Domain, open_envelope, pack, unpack_strict
from transports.wire.coordinator_errors import Refused
from transports.wire.identity import NodeIdentity
from transports.wire.jobs import JobCancel, JobProgress, OutputChunk, open_cancel, open_progress
from transports.wire.jsontext import JsonError, parse_json
from transports.wire.offers import TaskOffer, open_offer, parse_offer
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.results import TaskResult, open_result
from transports.wire.sealed import Payload, SealKey, direct_form, open_direct_form, open_payload, seal_payload

Target = Callable[[bytes], None]

_IDENTITY = NodeIdentity(bytes(range(32)))
_INTAKE = Intake(IntakePolicy(), participating=lambda: True)
# A sealed offer and the runner's claim key: the sealed payload target opens what a granted claim carries.
_SEAL_KEY = SealKey.from_private_bytes(bytes(range(32, 64)))
_SEALED_PAYLOAD = Payload("print(sum(range(10)))", {"xs": [1, 2, 3]})
_SEALED_OFFER = (
    TaskOffer.create(_IDENTITY, language="python", code=_SEALED_PAYLOAD.code, input=_SEALED_PAYLOAD.input)
    .sealed_with(SealKey.from_private_bytes(bytes(range(64, 96))).public)
    .sign(_IDENTITY)
)
_SEALED_DIGEST = hashlib.sha256(_SEALED_OFFER).digest()


def offer(data: bytes) -> None:
    """The intake's stateless checks (what gossip's validator runs), and the full codec path."""
    _INTAKE.validate(data)
    try:
        open_offer(data)
    except Rejected:
        pass


def result(data: bytes) -> None:
    try:
        open_result(data)
    except Rejected:
        pass


def sealed_payload(data: bytes) -> None:
    """What a grant carries for a sealed offer, opened with the runner's claim key; and the opened plaintext's
    decoder, which the AEAD keeps random bytes from ever reaching."""
    terms = parse_offer(_SEALED_OFFER).offer.sealed
    assert terms is not None
    attempts = (
        lambda: open_payload(data, _SEALED_DIGEST, _SEAL_KEY, terms),
        lambda: Payload.decode(data),
        lambda: open_direct_form(data, max_size=len(data) + 1),
    )
    for attempt in attempts:
        try:
            attempt()
        except Rejected:
            pass


def control(data: bytes) -> None:
    """Claims, aborts, status requests, and every answer a peer can send back on a direct stream."""
    decode_request(data)
    for expected in ("grant", "ack", "result", "status"):
        decode_answer(data, expected)


class _Bytes:
    """A libp2p stream's `read` over fixed bytes, for the framing reader."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def read(self, n: int) -> bytes:
        chunk, self._data = self._data[:n], self._data[n:]
        return chunk


def frames(data: bytes) -> None:
    async def read_all() -> None:
        stream = _Bytes(data)
        for _ in range(4):
            try:
                await read_frame(stream, max_len=MAX_CONTROL_FRAME, timeout=5)
            except FrameError:
                return

    trio.run(read_all)


def heartbeat(data: bytes) -> None:
    try:
        value = unpack_strict(data, max_size=8 * 1024)
    except Rejected:
        return
    Heartbeat.parse(_IDENTITY.peer_id, value, 0.0)
    if isinstance(value, dict):
        Heartbeat.parse(str(value.get("peerId"))[:100], value, 0.0)


def envelope(data: bytes) -> None:
    for domain in (Domain.OFFER, Domain.RESULT):
        try:
            open_envelope(domain, data)
        except Rejected:
            pass


def coordinator_request(data: bytes) -> None:
    """What an agent sends the coordinator: the JSON body and the signature headers around it."""
    body, _, header_text = data.partition(b"\n--\n")
    try:
        _json_object(body, frozenset({"sandboxMode", "reason", "detail"}))
    except Refused:
        pass
    headers: dict[str, str] = {}
    for line in header_text.decode("utf-8", errors="replace").splitlines()[:16]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    try:
        signing.verify_request(headers, "POST", "/pull", body, now=1_800_000_000_000)
    except Refused:
        pass


def coordinator_answer(data: bytes) -> None:
    try:
        parse_pull_answer(data)
    except ValueError:
        pass


def json_text(data: bytes) -> None:
    try:
        parse_json(data)
    except JsonError:
        pass


def ble(data: bytes) -> None:
    """BLE reassembly (chunks cut by the input's first byte) and every decoder of what a BLE peer sends."""
    size = 8 + (data[0] % 240 if data else 0)
    reassembler = Reassembler(4096)
    for start in range(1, len(data), size):
        try:
            reassembler.feed(data[start : start + size])
        except BleFault:
            pass
    for decode in (PeerInfo.decode, Capabilities.decode, Answer.decode, Claim.decode_body, Refusal.decode_body):
        try:
            decode(data)
        except BleFault:
            pass


def jobs(data: bytes) -> None:
    """A cancel, a runner's progress, and an output chunk as a follower reads it off a stream."""
    for parse in (open_cancel, open_progress):
        try:
            parse(data)
        except Rejected:
            pass
    try:
        OutputChunk.from_wire(unpack_strict(data, max_size=64 * 1024))
    except Rejected:
        pass


TARGETS: dict[str, Target] = {
    "offer": offer,
    "result": result,
    "control": control,
    "frames": frames,
    "heartbeat": heartbeat,
    "envelope": envelope,
    "sealed_payload": sealed_payload,
    "coordinator_request": coordinator_request,
    "coordinator_answer": coordinator_answer,
    "json": json_text,
    "ble": ble,
    "jobs": jobs,
}


def _offers() -> list[bytes]:
    other = NodeIdentity(bytes(range(1, 33)))
    made = [
        TaskOffer.create(_IDENTITY, language="python", code="print(sum(range(10)))", input={"xs": [1, 2, 3]}),
        TaskOffer.create(other, language="javascript", code="console.log(1)", input=[None, True, 1.5, "x"]),
        TaskOffer.create(_IDENTITY, language="python", code="x" * 300, sandbox="host", reply_to=("/ip4/1.2.3.4",)),
    ]
    return [o.sign(_IDENTITY if o.offerer == _IDENTITY.public_key else other) for o in made] + [_SEALED_OFFER]


def _results(offers: list[bytes]) -> list[bytes]:
    done = ExecResult(ok=True, stdout="45\n", exit_code=0, duration_ms=12)
    failed = ExecResult(ok=False, stderr="boom", exit_code=1, duration_ms=3, error_kind=None)
    return [
        TaskResult(parse_offer(raw).offer.offer_id, hashlib.sha256(raw).digest(), _IDENTITY.public_key, r).sign(
            _IDENTITY
        )
        for raw, r in zip(offers, (done, failed, done), strict=False)
    ]


def seeds() -> dict[str, list[bytes]]:
    offers = _offers()
    results = _results(offers)
    controls = [
        pack({"type": "claim", "offerId": b"\x01" * 16}),
        pack({"type": "abort", "offerId": b"\x02" * 16}),
        pack({"type": "cancel", "cancel": JobCancel.create(_IDENTITY, b"\x02" * 16).sign(_IDENTITY)}),
        pack({"type": "refusal", "reason": "busy", "detail": "queue full"}),
        pack(refusal_message(Rejection(Reason.SANDBOX_REQUIRED, "asks for the host"))),  # with the seed's result
        pack({"type": "result", "result": results[0]}),
        pack({"type": "status", "heartbeat": {"peerId": _IDENTITY.peer_id, "sandboxMode": "docker"}}),
        pack({"type": "grant"}),
        pack({"type": "grant", "payload": b"\x00" * 64}),
        pack({"type": "claim", "offerId": b"\x01" * 16, "sealTo": b"\x09" * 32}),
    ]
    beat = pack(
        {"peerId": _IDENTITY.peer_id, "sandboxMode": "docker", "freeSlots": 2, "languages": ["python"], "addrs": []}
    )
    signed = signing.sign_request(_IDENTITY, "POST", "/pull", b'{"sandboxMode":"docker"}')
    header_text = "\n".join(f"{k}: {v}" for k, v in signed.items()).encode()
    ble_messages = [
        PeerInfo(_IDENTITY.peer_id, _IDENTITY.public_key).encode(),
        Capabilities(b"\x07" * 16).encode(),
        Answer(Kind.GRANT, True).encode(),
        Answer(Kind.RESULT_ACK, False, "nope").encode(),
    ]
    ble_seeds = [b"\x14" + b"".join(encode_frames(m, 20)) for m in ble_messages] + ble_messages
    return {
        "offer": offers,
        "result": results,
        "control": controls,
        "frames": [len(c).to_bytes(4, "big") + c for c in controls] + [b"\x00\x00\x10\x00"],
        "heartbeat": [beat, msgpack.packb({"peerId": 1})],
        "envelope": offers + results,
        "coordinator_request": [b'{"sandboxMode":"docker"}\n--\n' + header_text, b'{"reason":"busy"}'],
        "coordinator_answer": [
            json.dumps({"task": None}).encode(),
            json.dumps({"task": {"taskId": "ab" * 16, "offer": "AAEC"}}).encode(),
        ],
        "json": [b'{"a": [1, 2.5, "x", null, true]}', b"[[[]]]"],
        "ble": ble_seeds,
        "sealed_payload": [
            seal_payload(_SEALED_PAYLOAD, _SEALED_DIGEST, _SEAL_KEY.public),
            _SEALED_PAYLOAD.encode(),
            Payload("x", None).encode(),
            direct_form(_SEALED_OFFER, _SEALED_PAYLOAD),
        ],
        "jobs": [
            JobCancel.create(_IDENTITY, b"\x01" * 16).sign(_IDENTITY),
            JobProgress(b"\x01" * 16, _IDENTITY.public_key, 2, "queued", 3, 1).sign(_IDENTITY),
            pack(OutputChunk(0, "stdout", b"hello\n").to_wire()),
        ],
    }
