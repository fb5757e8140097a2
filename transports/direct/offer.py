"""The offer protocol's server side: an offer addressed to this node, admitted by the intake, answered with its
signed result on the stream it came in on; the offerer's abort frame or its leaving cancels the job."""

from __future__ import annotations

import math
from dataclasses import replace

import trio
from libp2p.abc import INetStream

from transports.base import Admitted, Delivery
from transports.direct.core import DirectCore
from transports.direct.messages import (
    MAX_CONTROL_FRAME,
    ReplyError,
    decode_request,
    refusal_message,
    remote_peer,
    write_message,
)
from transports.framing import FrameError, read_frame
from transports.hardening.refusals import Refusal
from transports.wire.jobs import OutputChunk
from transports.wire.offers import parse_offer
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.sealed import Payload, is_direct_form, open_direct_form

OFFER_PROTOCOL = "/edgecoder/offer/1.0.0"
# Refusals for want of room: the peer is told when to try again, and held off until then.
NO_ROOM = frozenset({Reason.BUSY, Reason.RATE_LIMITED})
# Cancel frames an offer stream reads before it stops listening (a storm of refused ones costs no more).
MAX_CANCEL_FRAMES = 8


class _OfferExchange:
    """One admitted offer waiting for its result: `reply` writes it on the stream the offer came in on."""

    def __init__(self, stream: INetStream) -> None:
        self.stream = stream
        self.lock = trio.Lock()  # the reply and the timeout refusal must not interleave on the stream
        # Set once the result is written (or failed to be): only then may the handler close the stream.
        self.answered = trio.Event()
        self.replied = False
        self.expired = False

    async def reply(self, result: bytes) -> None:
        async with self.lock:
            if self.replied:
                raise ReplyError("this offer was answered already")
            if self.expired:
                raise ReplyError("the offerer's stream timed out before the result was ready")
            self.replied = True
            try:
                written = await write_message(self.stream, {"type": "result", "result": result})
            finally:
                self.answered.set()
            if not written:
                raise ReplyError("the offerer's stream closed before the result could be written")

    async def send_chunk(self, chunk: OutputChunk) -> bool:
        """Live output for a following offerer, before the result on the same stream; False once the stream no
        longer takes it (answered, timed out, or the offerer stopped reading)."""
        async with self.lock:
            if self.replied or self.expired:
                return False
            return await write_message(self.stream, chunk.to_wire())

    async def expire(self) -> bool:
        """Refuse with `timeout` unless the result got there first; True when we refused."""
        async with self.lock:
            self.expired = True
            if self.replied:
                return False
            await write_message(self.stream, refusal_message(Rejection(Reason.TIMEOUT, "no result in time")))
            return True


def _open_direct_form(frame: bytes, max_size: int) -> tuple[bytes, Payload] | Rejection:
    """The offer and its payload, checked against the offer's signed digests (`payload_mismatch`); the offer's own
    checks are the intake's, as for any offer."""
    try:
        raw, payload = open_direct_form(frame, max_size=max_size)
        terms = parse_offer(raw).offer.sealed
        if terms is None:
            raise Rejected(Reason.MALFORMED, "direct offer: a payload comes only with a sealed offer")
        payload.check(terms)
    except Rejected as rejected:
        return rejected.rejection
    return raw, payload


class OfferProtocol(DirectCore):
    async def _serve_offer(self, stream: INetStream) -> None:
        peer = remote_peer(stream)
        raw = await self._read_request(stream, self.max_frame)
        if raw is None:
            return
        if self.holdoff.remaining(peer) > 0:  # read all the same, so that the peer's write completes and it hears why
            await self._refuse_early(stream, peer)
            return
        sink = self.sink
        if sink is None:
            await self._refuse(stream, Rejection(Reason.SHUTTING_DOWN, "this node is not serving offers"))
            return
        if not sink.participating:
            await self._refuse(stream, Rejection(Reason.SANDBOX_UNAVAILABLE, "this node is not taking offers"))
            return
        payload: Payload | None = None
        if is_direct_form(raw):  # a sealed offer and its payload: the same path as a granted gossip claim's
            opened = _open_direct_form(raw, self.max_frame)
            if isinstance(opened, Rejection):
                await self._refuse(stream, opened)
                return
            raw, payload = opened
        exchange = _OfferExchange(stream)
        delivery = Delivery(
            raw,
            "direct",
            sender=peer,
            reply=exchange.reply,
            direct=True,
            payload=payload,
            stream=exchange.send_chunk,
        )
        verdict = await sink.deliver(delivery)
        if not isinstance(verdict, Admitted):
            if verdict.reason in NO_ROOM:
                self.holdoff.hold(peer)
                verdict = replace(verdict, retry_after_ms=self.holdoff.retry_after_ms)
            await self._refuse(stream, verdict)
            return
        async with trio.open_nursery() as nursery:
            # The offerer's side of the stream: an abort frame, or its end, means nobody waits for this job now
            # (the watcher then cancels the job and this whole wait).
            nursery.start_soon(self._watch_offerer, stream, delivery.scope, nursery.cancel_scope)
            with trio.move_on_after(self.result_timeout) as timer:
                await exchange.answered.wait()
            nursery.cancel_scope.cancel()
        if timer.cancelled_caught:
            delivery.scope.cancel()  # nobody will read a result after the timeout: stop the run
            if await exchange.expire():
                self.refused[str(Reason.TIMEOUT)] += 1

    async def _watch_offerer(self, stream: INetStream, job: trio.CancelScope, waiting: trio.CancelScope) -> None:
        """Until the answer: an abort frame or the stream's end stops the job unanswered; a signed cancel frame stops
        it and the job's own (aborted) result is the answer. A refused cancel is counted, and the job goes on."""
        for _ in range(MAX_CANCEL_FRAMES):
            try:
                frame = await read_frame(stream, max_len=MAX_CONTROL_FRAME, timeout=math.inf)
            except FrameError:
                frame = None  # closed or reset: the offerer went away
            if frame is not None:
                request = decode_request(frame)
                if isinstance(request, dict) and request.get("type") == "cancel" and self.cancel is not None:
                    raw = request.get("cancel")
                    if isinstance(raw, bytes):
                        await self._cancel_on_stream(raw, remote_peer(stream))
                    continue
                if not (isinstance(request, dict) and request.get("type") == "abort"):
                    return  # anything else on an offer stream is noise; the job goes on
            self.aborted += 1
            job.cancel()
            waiting.cancel()
            return

    async def _cancel_on_stream(self, raw: bytes, sender: str) -> None:
        assert self.cancel is not None
        outcome = await self.cancel(raw, sender)
        if isinstance(outcome, Rejection):
            self.refused[str(outcome.reason)] += 1
            await self._strike_if_invalid(sender, outcome)
        else:
            self.cancels_taken += 1

    # The one-exchange protocols: one request frame, one answer, on a stream of its own. Each decision is shared

    async def _refuse_early(self, stream: INetStream, peer: str) -> None:
        """An offer from a peer still inside its hold-off: refused unparsed and unverified, and a fraction of a
        strike."""
        self.host.refusals(Refusal.RETRY_TOO_SOON)
        rejection = Rejection(
            Reason.RATE_LIMITED,
            f"this peer was refused for want of room and sent again within {self.holdoff.retry_after_ms} ms; "
            "wait retryAfterMs before the next offer",
            retry_after_ms=max(1, math.ceil(self.holdoff.remaining(peer) * 1000)),
        )
        self.refused[str(rejection.reason)] += 1
        await write_message(stream, refusal_message(rejection))
        if self.host.penalties.strike(peer, self.holdoff.limits.strike_weight):
            await self.host.cut_off(peer, Refusal.RETRY_IGNORED)
