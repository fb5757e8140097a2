"""What every direct protocol shares: the frame bounds, the answer and request maps, and writing to a stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
from libp2p.abc import INetStream

from transports.framing import FrameFault, write_frame
from transports.wire.codec import pack, unpack_strict
from transports.wire.offers import MAX_RESULT_BYTES
from transports.wire.reasons import Reason, Rejected, Rejection, wire_refusal
from transports.wire.results import parse_run_result

# A signed result plus the answer map around it.
MAX_RESULT_FRAME = MAX_RESULT_BYTES + 1024
# A claim request or any answer other than a result: a type, an id, a reason and a short detail; a status with its
# addresses and the runners it reports.
MAX_CONTROL_FRAME = 8 * 1024
# Bounds a write to a peer that stopped reading (its yamux window is full).
WRITE_TIMEOUT = 5.0
# A retry hint from a peer is believed up to an hour.
MAX_RETRY_AFTER_MS = 3_600_000

# A request that ends mid-frame is not a message; an answer that never arrives whole is a failed link.
REQUEST_FRAME_REASONS = {
    FrameFault.TOO_LARGE: Reason.TOO_LARGE,
    FrameFault.TIMEOUT: Reason.TIMEOUT,
    FrameFault.CLOSED: Reason.MALFORMED,
}
ANSWER_FRAME_REASONS = {
    FrameFault.TOO_LARGE: Reason.TOO_LARGE,
    FrameFault.TIMEOUT: Reason.TIMEOUT,
    # The stream closed or was reset before the answer: nobody answered, which is not the peer refusing. Gossip
    # then goes on to the offerer's other addresses.
    FrameFault.CLOSED: Reason.UNREACHABLE,
}
# Refusals that say the peer sent something invalid, whatever our policy and clock: each is a strike against it.
INVALID_INPUT = frozenset({Reason.TOO_LARGE, Reason.MALFORMED, Reason.BAD_SIGNATURE})


@dataclass(frozen=True, slots=True)
class DirectAnswer:
    result: bytes | None
    refusal: Rejection | None


class ReplyError(Exception):
    """The result could not be written back: the offer stream timed out, closed, or was answered already."""


def refusal_message(rejection: Rejection) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "refusal", "reason": str(rejection.reason), "detail": rejection.detail[:512]}
    if rejection.retry_after_ms is not None:
        message["retryAfterMs"] = rejection.retry_after_ms  # when this peer's next offer is looked at
    if rejection.result is not None:  # the seed's run result of this refusal (RUN_RESULT_REFUSALS), beside its code
        message["result"] = rejection.result.to_json()
    return message


def decode_answer(frame: bytes, expected: str) -> dict[str, Any] | Rejection:
    """The answer map of type `expected`, or the peer's refusal, or `malformed` for anything else."""
    try:
        answer = unpack_strict(frame, max_size=MAX_RESULT_FRAME)
    except Rejected as exc:
        return Rejection(Reason.MALFORMED, f"answer: {exc.rejection.detail}")
    return checked_answer(answer, expected)


def checked_answer(answer: Any, expected: str) -> dict[str, Any] | Rejection:
    """An answer map (decoded) of type `expected`, or the peer's refusal, or `malformed` for anything else."""
    if not isinstance(answer, dict):
        return Rejection(Reason.MALFORMED, "answer is not a map")
    kind = answer.get("type")
    if kind == "refusal":
        reason, detail, retry = answer.get("reason"), answer.get("detail", ""), answer.get("retryAfterMs")
        retry_ok = isinstance(retry, int) and not isinstance(retry, bool) and 0 < retry <= MAX_RETRY_AFTER_MS
        code = wire_refusal(reason)
        if code is None:
            return Rejection(Reason.MALFORMED, f"peer refused with an unknown reason {str(reason)[:64]!r}")
        try:
            # A peer before the seed's run results sends none: the Rejection then derives it from the code.
            result = None if answer.get("result") is None else parse_run_result(answer["result"])
        except Rejected as exc:
            return exc.rejection
        return Rejection(code, detail if isinstance(detail, str) else "", retry if retry_ok else None, result)
    if kind != expected:
        return Rejection(Reason.MALFORMED, f"expected a {expected!r} answer, got {str(kind)[:32]!r}")
    return answer


def decode_request(frame: bytes) -> dict[str, Any] | Rejection:
    """A control request map, or `malformed`."""
    try:
        request = unpack_strict(frame, max_size=MAX_CONTROL_FRAME)
    except Rejected as exc:
        return exc.rejection
    if not isinstance(request, dict):
        return Rejection(Reason.MALFORMED, "request is not a map")
    return request


def remote_peer(stream: INetStream) -> str:
    return str(stream.muxed_conn.peer_id.to_base58())


async def write_message(stream: INetStream, message: dict[str, Any]) -> bool:
    """Write one answer; False when the stream no longer takes writes (the peer left, or stopped reading)."""
    try:
        with trio.fail_after(WRITE_TIMEOUT):
            await write_frame(stream, pack(message))
    except (Exception, trio.TooSlowError):
        return False
    return True


async def close_stream(stream: INetStream) -> None:
    with trio.move_on_after(WRITE_TIMEOUT):
        try:
            await stream.close()
        except Exception:  # already reset by the peer: nothing left to close
            await stream.reset()
