"""Known-answer vectors: a fixed key and message give fixed bytes and a fixed signature.

They live in tests/vectors/*.json so that a port in another language can check itself against them. Regenerate them
only on a deliberate protocol change: `python -m tests.test_vectors --write`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import msgpack

from executor.contract import ErrorKind, ExecResult, Limits, QueueReason
from transports.direct import checked_answer, refusal_message
from transports.wire.codec import Domain, pack, unpack_strict
from transports.wire.identity import NodeIdentity
from transports.wire.jobs import JobCancel, JobProgress, OutputChunk, StreamDigest, open_cancel, open_progress
from transports.wire.needs import Needs, Resources
from transports.wire.offers import Audience, TaskOffer, open_offer
from transports.wire.reasons import Reason, Rejection
from transports.wire.results import TaskResult, open_result
from transports.wire.sealed import SealKey

VECTORS = Path(__file__).parent / "vectors"
OFFERER_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")  # RFC 8032 test 1
EXECUTOR_SEED = bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")  # RFC 8032 test 2
ISSUED = 1_800_000_000_000
# The offerer's ephemeral X25519 key of the sealed vector: RFC 7748 section 6.1's Alice.
OFFER_SEAL_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")


def build() -> dict[str, dict[str, Any]]:
    offerer, executor = NodeIdentity(OFFERER_SEED), NodeIdentity(EXECUTOR_SEED)
    offer = TaskOffer(
        offer_id=bytes(range(16)),
        offerer=offerer.public_key,
        issued_at_ms=ISSUED,
        expires_at_ms=ISSUED + 60_000,
        language="python",
        code="import json, sys\nprint(sum(json.load(sys.stdin)['xs']))\n",
        input={"xs": [1, 2, 3]},
        limits=Limits(timeout_ms=2_000, memory_mb=64, cpus=0.5),
        sandbox="docker",
        reply_to=("/ip4/127.0.0.1/tcp/4001/p2p/" + offerer.peer_id,),
        # Version 1 has no audience and no minimum tier; nodes still take it.
        audience=None,
        version=1,
    )
    offer_wire = offer.sign(offerer)
    # Version 2: sent directly to the executor's node; and claimed by two invitees only, on gVisor or stronger.
    direct_v2 = dataclasses.replace(offer, version=2, audience=Audience.direct(executor.peer_id))
    invited_v2 = dataclasses.replace(
        offer,
        version=2,
        offer_id=bytes(range(16, 32)),
        audience=Audience.claimed([executor.peer_id, offerer.peer_id]),
        min_isolation="gvisor",
    )
    # Version 3: the second attempt of a job, queued up to 30 s by a busy runner, its output followed.
    v3 = dataclasses.replace(
        offer,
        version=3,
        offer_id=bytes(range(32, 48)),
        audience=Audience.direct(executor.peer_id),
        attempt=2,
        queue_deadline_ms=ISSUED + 30_000,
        follow=True,
    )
    v3_wire = v3.sign(offerer)
    # Version 3 sealed: offer-v1's work claimed by anyone, its code and input replaced by their digests and sizes and
    # the offerer's X25519 key (tests/test_sealed.py has the payload sealed for it).
    sealed_v3 = dataclasses.replace(
        offer, version=3, offer_id=bytes(range(48, 64)), audience=Audience.claimed()
    ).sealed_with(SealKey.from_private_bytes(OFFER_SEAL_PRIVATE).public)
    # Version 3 with needs: the python-science runtime pinned to one package set, 2 cores, 1 GiB, x86_64, claimed.
    v3_runtime = dataclasses.replace(
        offer,
        version=3,
        offer_id=bytes(range(48, 64)),
        audience=Audience.claimed(),
        needs=Needs("python-science", "ab" * 32, Resources(cores=2, memory_mb=1024, arch="x86_64")),
    )
    streamed = TaskResult(
        offer_id=v3.offer_id,
        offer_digest=open_offer(v3_wire, now=ISSUED).digest,
        executor=executor.public_key,
        result=ExecResult(ok=True, stdout="6\n", exit_code=0, duration_ms=41),
        completed_at_ms=ISSUED + 1_000,
        attempt=2,
        stream_digest=bytes(range(32)),
        stream_dropped=0,
        version=2,
    )
    result = TaskResult(
        offer_id=offer.offer_id,
        offer_digest=open_offer(offer_wire, now=ISSUED).digest,
        executor=executor.public_key,
        result=ExecResult(ok=True, stdout="6\n", exit_code=0, duration_ms=41),
        completed_at_ms=ISSUED + 1_000,
        version=1,
    )
    failed = TaskResult(
        offer_id=offer.offer_id,
        offer_digest=result.offer_digest,
        executor=executor.public_key,
        result=ExecResult(
            ok=False,
            stderr="",
            exit_code=124,
            duration_ms=2_001,
            queue_for_cloud=True,
            queue_reason=QueueReason.TIMEOUT,
            error_kind=ErrorKind.TIMEOUT,
        ),
        completed_at_ms=ISSUED + 3_000,
        version=1,
    )

    def vector(domain: bytes, seed: bytes, wire: bytes) -> dict[str, Any]:
        body, signature = msgpack.unpackb(wire)
        return {
            "domain": domain.decode(),
            "seed": seed.hex(),
            "publicKey": NodeIdentity(seed).public_key.hex(),
            "peerId": NodeIdentity(seed).peer_id,
            "body": body.hex(),
            "signedMessage": (domain + b"\x00" + body).hex(),
            "signature": signature.hex(),
            "wire": wire.hex(),
        }

    # Issue 23's job messages: the offerer's cancel of the v3 offer, and its runner's word that it is queued second.
    cancel = JobCancel(v3.offer_id, offerer.public_key, ISSUED + 500)
    progress = JobProgress(v3.offer_id, executor.public_key, attempt=2, state="queued", position=2, at_ms=ISSUED + 20)
    return {
        "cancel-v1": vector(Domain.CANCEL, OFFERER_SEED, cancel.sign(offerer)),
        "progress-queued-v1": vector(Domain.PROGRESS, EXECUTOR_SEED, progress.sign(executor)),
        "offer-v1": vector(Domain.OFFER, OFFERER_SEED, offer_wire),
        "offer-v2-direct": vector(Domain.OFFER, OFFERER_SEED, direct_v2.sign(offerer)),
        "offer-v2-invited-gvisor": vector(Domain.OFFER, OFFERER_SEED, invited_v2.sign(offerer)),
        "offer-v3-followed-retry": vector(Domain.OFFER, OFFERER_SEED, v3_wire),
        "offer-v3-sealed": vector(Domain.OFFER, OFFERER_SEED, sealed_v3.sign(offerer)),
        "offer-v3-runtime": vector(Domain.OFFER, OFFERER_SEED, v3_runtime.sign(offerer)),
        "result-v1": vector(Domain.RESULT, EXECUTOR_SEED, result.sign(executor)),
        "result-v2-streamed": vector(Domain.RESULT, EXECUTOR_SEED, streamed.sign(executor)),
        "result-timeout-v1": vector(Domain.RESULT, EXECUTOR_SEED, failed.sign(executor)),
    }


def test_vectors_match_the_committed_files() -> None:
    for name, expected in build().items():
        committed = json.loads((VECTORS / f"{name}.json").read_text())
        assert committed == expected, f"{name} changed: a protocol change needs new vectors and a new version"


def test_committed_vectors_decode_and_verify() -> None:
    offer = json.loads((VECTORS / "offer-v1.json").read_text())
    opened_v1 = open_offer(bytes.fromhex(offer["wire"]), now=ISSUED).offer
    assert opened_v1.offerer.hex() == offer["publicKey"]
    assert opened_v1.version == 1 and opened_v1.audience is None and opened_v1.min_isolation is None
    executor_peer = NodeIdentity(EXECUTOR_SEED).peer_id
    direct = open_offer(bytes.fromhex(json.loads((VECTORS / "offer-v2-direct.json").read_text())["wire"]), now=ISSUED)
    assert direct.offer.version == 2 and direct.offer.audience == Audience.direct(executor_peer)
    invited = json.loads((VECTORS / "offer-v2-invited-gvisor.json").read_text())
    v2 = open_offer(bytes.fromhex(invited["wire"]), now=ISSUED).offer
    assert v2.audience is not None and v2.audience.invited[0] == executor_peer
    assert v2.min_isolation == "gvisor"
    sealed = open_offer(bytes.fromhex(json.loads((VECTORS / "offer-v3-sealed.json").read_text())["wire"]), now=ISSUED)
    assert sealed.offer.sealed is not None and sealed.offer.code == "" and sealed.offer.input is None
    assert sealed.offer.sealed == opened_v1.payload.terms(SealKey.from_private_bytes(OFFER_SEAL_PRIVATE).public)
    for name in ("result-v1", "result-timeout-v1"):
        result = json.loads((VECTORS / f"{name}.json").read_text())
        opened = open_result(bytes.fromhex(result["wire"]), expect_executor=bytes.fromhex(result["publicKey"]))
        assert opened.offer_id.hex() == "000102030405060708090a0b0c0d0e0f"
        assert opened.version == 1 and opened.attempt == 1 and opened.stream_digest is None
    v3 = open_offer(
        bytes.fromhex(json.loads((VECTORS / "offer-v3-followed-retry.json").read_text())["wire"]), now=ISSUED
    )
    assert v3.offer.version == 3 and v3.offer.attempt == 2 and v3.offer.follow
    assert v3.offer.queue_deadline_ms == ISSUED + 30_000
    assert v3.offer.needs == Needs()  # a v3 offer that needs nothing carries none of the needs' fields
    runtime = open_offer(bytes.fromhex(json.loads((VECTORS / "offer-v3-runtime.json").read_text())["wire"]), now=ISSUED)
    assert runtime.offer.needs.runtime == "python-science" and runtime.offer.needs.runtime_digest == "ab" * 32
    assert runtime.offer.needs.resources == Resources(cores=2, memory_mb=1024, arch="x86_64")
    streamed = json.loads((VECTORS / "result-v2-streamed.json").read_text())
    opened = open_result(bytes.fromhex(streamed["wire"]), expect_executor=bytes.fromhex(streamed["publicKey"]))
    assert opened.version == 2 and opened.attempt == 2 and opened.stream_digest == bytes(range(32))


CHUNKS = (OutputChunk(0, "stdout", b"hello\n"), OutputChunk(1, "stderr", b"warn\n"), OutputChunk(2, "stdout", b"6\n"))


def stream_vector() -> dict[str, Any]:
    """Output chunks as framed on the wire, and the streamDigest a v2 result signs for them."""
    digest = StreamDigest()
    for chunk in CHUNKS:
        digest.update(chunk)
    final = digest.digest()
    assert final is not None
    return {"chunks": [msgpack.packb(c.to_wire()).hex() for c in CHUNKS], "streamDigest": final.hex()}


def test_stream_digest_vector() -> None:
    committed = json.loads((VECTORS / "output-stream.json").read_text())
    assert committed == stream_vector()
    assert [OutputChunk.from_wire(msgpack.unpackb(bytes.fromhex(c))) for c in committed["chunks"]] == list(CHUNKS)


def test_job_message_vectors_decode_and_verify() -> None:
    cancel = json.loads((VECTORS / "cancel-v1.json").read_text())
    opened = open_cancel(bytes.fromhex(cancel["wire"]))
    assert opened.offerer.hex() == cancel["publicKey"] and opened.offer_id == bytes(range(32, 48))
    progress = json.loads((VECTORS / "progress-queued-v1.json").read_text())
    step = open_progress(bytes.fromhex(progress["wire"]), expect_executor=bytes.fromhex(progress["publicKey"]))
    assert (step.state, step.position, step.attempt) == ("queued", 2, 2)


def refusal_vector() -> dict[str, Any]:
    """The offer stream's answer to a remote host request: the refusal with the seed's run result beside its code,
    as the canonical msgpack map a node writes (length-prefixed, see transports.framing)."""
    message = refusal_message(Rejection(Reason.SANDBOX_REQUIRED, "the offer asks for the host"))
    return {"answer": message, "wire": pack(message).hex()}


def test_refusal_vector() -> None:
    committed = json.loads((VECTORS / "refusal-sandbox-required.json").read_text())
    assert committed == refusal_vector()
    answer = checked_answer(unpack_strict(bytes.fromhex(committed["wire"]), max_size=8192), "result")
    assert isinstance(answer, Rejection) and answer.reason is Reason.SANDBOX_REQUIRED
    assert answer.result is not None and answer.result.to_json() == committed["answer"]["result"]


def test_rfc8032_public_keys() -> None:
    """Our seeds are RFC 8032's test keys, so the public keys are known answers too."""
    assert NodeIdentity(OFFERER_SEED).public_key.hex() == (
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    )


if __name__ == "__main__" and "--write" in sys.argv:
    for name, vector in build().items():
        (VECTORS / f"{name}.json").write_text(json.dumps(vector, indent=2) + "\n")
        print("wrote", VECTORS / f"{name}.json")
    (VECTORS / "output-stream.json").write_text(json.dumps(stream_vector(), indent=2) + "\n")
    print("wrote", VECTORS / "output-stream.json")
    (VECTORS / "refusal-sandbox-required.json").write_text(json.dumps(refusal_vector(), indent=2) + "\n")
    print("wrote", VECTORS / "refusal-sandbox-required.json")
