"""The client side of the direct protocols: this node's requests to a peer, on the control stream when the peer
speaks it, else on a stream per exchange."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio

from transports.direct.abort import ABORT_PROTOCOL, ABORT_SEND_TIMEOUT
from transports.direct.cancel import CANCEL_PROTOCOL
from transports.direct.claim import CLAIM_PROTOCOL
from transports.direct.core import DirectCore
from transports.direct.messages import (
    ANSWER_FRAME_REASONS,
    MAX_CONTROL_FRAME,
    MAX_RESULT_FRAME,
    WRITE_TIMEOUT,
    DirectAnswer,
    checked_answer,
    close_stream,
    decode_answer,
)
from transports.direct.offer import OFFER_PROTOCOL
from transports.direct.presence import PRESENCE_PROTOCOL
from transports.direct.result import RESULT_PROTOCOL
from transports.direct.status import STATUS_PROTOCOL
from transports.framing import FrameError, read_frame, write_frame
from transports.p2p import DialError
from transports.wire.codec import pack, unpack_strict
from transports.wire.jobs import OutputChunk
from transports.wire.reasons import Reason, Rejected, Rejection

# Told of each live output chunk of a followed offer, in order, as it comes.
OutputFn = Callable[[OutputChunk], None]
# Output chunks one followed offer may stream: its two capped streams in 16 KiB chunks many times over. A runner
# that streams more (a stream that never ends) is refused `too_large`.
MAX_OUTPUT_FRAMES = 4096


def output_chunk(frame: bytes) -> OutputChunk | Rejection | None:
    """The frame as an output chunk; None when it is not one (the answer); `malformed` when it is a bad one."""
    try:
        value = unpack_strict(frame, max_size=MAX_RESULT_FRAME)
    except Rejected:
        return None  # decode_answer says why
    if not (isinstance(value, dict) and value.get("type") == "output"):
        return None
    try:
        return OutputChunk.from_wire(value)
    except Rejected as exc:
        return exc.rejection


class DirectClient(DirectCore):
    async def _exchange(
        self,
        peer: str,
        protocol: str,
        payload: bytes,
        expected: str,
        *,
        answer_timeout: float,
        max_answer: int,
        abort_frame: bytes | None = None,
        on_output: OutputFn | None = None,
    ) -> dict[str, Any] | Rejection:
        """Send one request frame and read one answer. A failed link is `unreachable`, never the peer's refusal.

        With `abort_frame`, a caller that stops waiting (its scope is cancelled: Ctrl-C, its own deadline) first
        sends that frame on the stream, so that the peer stops the work too.
        """
        try:
            peer_id = await self.host.ensure_connected(peer)
            stream = await self.host.open_stream(peer_id, protocol)
        except DialError as exc:
            return Rejection(Reason.UNREACHABLE, str(exc))
        try:
            try:
                with trio.fail_after(WRITE_TIMEOUT):
                    await write_frame(stream, payload)
            except (Exception, trio.TooSlowError) as exc:
                return Rejection(Reason.UNREACHABLE, f"could not send to {peer_id}: {type(exc).__name__}")
            deadline = trio.current_time() + answer_timeout
            for _ in range(MAX_OUTPUT_FRAMES + 1):
                try:
                    left = max(0.0, deadline - trio.current_time())
                    frame = await read_frame(stream, max_len=max_answer, timeout=left)
                except FrameError as exc:
                    return Rejection(ANSWER_FRAME_REASONS[exc.reason], f"answer from {peer_id}: {exc.detail}")
                except trio.Cancelled:
                    if abort_frame is not None:
                        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_SEND_TIMEOUT):
                            await write_frame(stream, abort_frame)
                    raise
                chunk = output_chunk(frame) if on_output is not None else None
                if chunk is None or on_output is None:
                    return decode_answer(frame, expected)
                if isinstance(chunk, Rejection):
                    return chunk
                on_output(chunk)
            return Rejection(Reason.TOO_LARGE, f"{peer_id} streamed over {MAX_OUTPUT_FRAMES} output chunks")
        finally:
            with trio.CancelScope(shield=True):
                await close_stream(stream)

    async def send_offer(
        self,
        maddr_or_peer: str,
        offer_raw: bytes,
        *,
        cancel: bytes | None = None,
        on_output: OutputFn | None = None,
    ) -> DirectAnswer:
        """Offer work directly to one peer and wait for its signed result (or its refusal). With `cancel` (the
        offer's signed cancel), a caller that stops waiting sends it instead of a bare abort: the runner then stops
        the run keeping its output, as for any cancel. With `on_output`, a followed offer's output chunks are handed
        to it as they come, before the result."""
        answer = await self._exchange(
            maddr_or_peer,
            OFFER_PROTOCOL,
            offer_raw,
            "result",
            # The executor's own deadline plus a margin for the round trip: the server times out first.
            answer_timeout=self.result_timeout + self.stall_timeout,
            max_answer=MAX_RESULT_FRAME,
            abort_frame=pack({"type": "abort"} if cancel is None else {"type": "cancel", "cancel": cancel}),
            on_output=on_output,
        )
        return self._result_answer(answer)

    @staticmethod
    def _result_answer(answer: dict[str, Any] | Rejection) -> DirectAnswer:
        if isinstance(answer, Rejection):
            return DirectAnswer(None, answer)
        result = answer.get("result")
        if not isinstance(result, bytes):
            return DirectAnswer(None, Rejection(Reason.MALFORMED, "result answer carries no bytes"))
        return DirectAnswer(result, None)

    async def send_cancel(self, maddr_or_peer: str, cancel_raw: bytes) -> DirectAnswer:
        """Send a signed cancel to the runner of the offer it names; the answer is the signed result the job ended
        with (cancelled, or finished before the cancel came), or the runner's refusal."""
        answer = await self._exchange(
            maddr_or_peer,
            CANCEL_PROTOCOL,
            cancel_raw,
            "result",
            answer_timeout=self.stall_timeout + WRITE_TIMEOUT,
            max_answer=MAX_RESULT_FRAME,
        )
        return self._result_answer(answer)

    async def _ask(
        self,
        peer: str,
        message: dict[str, Any],
        expected: str,
        *,
        legacy: tuple[str, bytes],
        answer_timeout: float,
        max_answer: int = MAX_CONTROL_FRAME,
    ) -> dict[str, Any] | Rejection:
        """One request and its answer: on our control stream to the peer, or, for a peer that does not speak it,
        on a stream of its own (`legacy`: that protocol and its request frame)."""
        answer = await self.control.request(peer, message, timeout=answer_timeout)
        if answer is None:
            protocol, payload = legacy
            return await self._exchange(
                peer, protocol, payload, expected, answer_timeout=answer_timeout, max_answer=max_answer
            )
        if isinstance(answer, Rejection):
            return answer
        return checked_answer(answer, expected)

    async def request_claim(self, peer: str, offer_id: bytes) -> Rejection | None:
        """Ask the offerer for the right to run `offer_id`, telling it our status (so it need not ask). None means
        granted."""
        request: dict[str, Any] = {"type": "claim", "offerId": offer_id}
        if self.status is not None:
            request["status"] = self.status()
        answer = await self._ask(
            peer, request, "grant", legacy=(CLAIM_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return answer if isinstance(answer, Rejection) else None

    async def request_sealed_claim(self, peer: str, offer_id: bytes, seal_to: bytes) -> Rejection | bytes:
        """Claim a sealed offer: the grant carries its payload sealed to `seal_to` (our X25519 key for this claim),
        returned still sealed; or the offerer's refusal. A grant without a payload is `malformed`."""
        request: dict[str, Any] = {"type": "claim", "offerId": offer_id, "sealTo": seal_to}
        if self.status is not None:
            request["status"] = self.status()
        answer = await self._ask(
            peer,
            request,
            "grant",
            legacy=(CLAIM_PROTOCOL, pack(request)),
            answer_timeout=self.stall_timeout,
            max_answer=MAX_RESULT_FRAME,
        )
        return _carried(answer, "payload", bytes, "the grant of a sealed offer carries no payload")

    async def send_sealed_result(self, peer: str, offer_id: bytes, sealed: bytes) -> Rejection | None:
        """Carry a sealed offer's result, sealed to the offer's key, back to the offerer. None means acknowledged."""
        request = {"type": "result", "offerId": offer_id, "sealed": sealed}
        answer = await self._ask(
            peer, request, "ack", legacy=(RESULT_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return answer if isinstance(answer, Rejection) else None

    async def request_status(self, peer: str) -> dict[str, Any] | Rejection:
        """A peer's current status, straight from the peer."""
        request = {"type": "status"}
        answer = await self._ask(
            peer, request, "status", legacy=(STATUS_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return _carried(answer, "heartbeat", dict, "status answer carries no heartbeat")

    async def push_status(self, peer: str, status: dict[str, Any]) -> Rejection | None:
        """Tell a neighbour our status (it changed, or it is time to refresh). None means acknowledged."""
        request = {"type": "presence", "status": status}
        answer = await self._ask(
            peer, request, "ack", legacy=(PRESENCE_PROTOCOL, pack(request)), answer_timeout=self.stall_timeout
        )
        return answer if isinstance(answer, Rejection) else None

    async def send_abort(self, peer: str, offer_id: bytes) -> Rejection | None:
        """Tell a claimant that this node, the offerer, no longer waits for `offer_id`. None means it stopped it."""
        request = {"type": "abort", "offerId": offer_id}
        answer = await self._ask(
            peer, request, "ack", legacy=(ABORT_PROTOCOL, pack(request)), answer_timeout=ABORT_SEND_TIMEOUT
        )
        return answer if isinstance(answer, Rejection) else None

    async def send_result(self, peer: str, result_raw: bytes) -> Rejection | None:
        """Carry a signed result back to the offerer. None means acknowledged."""
        answer = await self._ask(
            peer,
            {"type": "result", "result": result_raw},
            "ack",
            legacy=(RESULT_PROTOCOL, result_raw),
            answer_timeout=self.stall_timeout,
        )
        return answer if isinstance(answer, Rejection) else None


T = TypeVar("T")


def _carried(answer: dict[str, Any] | Rejection, key: str, kind: type[T], missing: str) -> T | Rejection:
    """The answer's `key` when it is a `kind`; the peer's refusal as it is; else `malformed`, saying `missing`."""
    if isinstance(answer, Rejection):
        return answer
    value = answer.get(key)
    return value if isinstance(value, kind) else Rejection(Reason.MALFORMED, missing)
