"""The direct transport: every protocol's server side (one class each, in this package) and the client, over one
state (`DirectCore`), served by `run` and shared with the control stream (`_dispatch`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import INetStream

from transports.base import OfferSink
from transports.control import CONTROL_PROTOCOL, buffered, serve_control
from transports.direct.abort import ABORT_PROTOCOL, AbortProtocol
from transports.direct.cancel import CANCEL_PROTOCOL, CancelProtocol
from transports.direct.claim import CLAIM_PROTOCOL, ClaimProtocol
from transports.direct.client import DirectClient
from transports.direct.messages import (
    MAX_CONTROL_FRAME,
    MAX_RESULT_FRAME,
    WRITE_TIMEOUT,
    close_stream,
    refusal_message,
    remote_peer,
)
from transports.direct.offer import OFFER_PROTOCOL, OfferProtocol
from transports.direct.presence import PRESENCE_PROTOCOL, PresenceProtocol
from transports.direct.result import RESULT_PROTOCOL, ResultProtocol
from transports.direct.status import STATUS_PROTOCOL, StatusProtocol
from transports.hardening.refusals import Refusal
from transports.wire.reasons import Reason, Rejection

log = logging.getLogger("transports.direct")


class DirectTransport(
    OfferProtocol,
    ClaimProtocol,
    ResultProtocol,
    StatusProtocol,
    PresenceProtocol,
    AbortProtocol,
    CancelProtocol,
    DirectClient,
):
    name = "direct"

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the direct protocols until cancelled; the client methods work whether or not this runs."""
        handlers = {
            OFFER_PROTOCOL: self._serve_offer,
            CLAIM_PROTOCOL: self._serve_claim,
            RESULT_PROTOCOL: self._serve_result,
        }
        if self.status is not None:
            handlers[STATUS_PROTOCOL] = self._serve_status
        if self.abort is not None:
            handlers[ABORT_PROTOCOL] = self._serve_abort
        if self.presence is not None:
            handlers[PRESENCE_PROTOCOL] = self._serve_presence
        if self.cancel is not None:
            handlers[CANCEL_PROTOCOL] = self._serve_cancel
        handlers[CONTROL_PROTOCOL] = self._serve_control
        self.sink = sink
        for protocol, serve in handlers.items():
            self.host.set_handler(protocol, self._guarded(serve))
        try:
            async with trio.open_nursery() as nursery:
                if self.use_control:
                    await nursery.start(self.control.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            for protocol in handlers:
                self.host.remove_handler(protocol)
            self.sink = None

    def _guarded(self, serve: Callable[[INetStream], Awaitable[None]]) -> Callable[[INetStream], Awaitable[None]]:
        """Whatever happens in `serve`, libp2p sees a handler that returns, and the stream is closed."""

        async def handler(stream: INetStream) -> None:
            if self.host.banned(remote_peer(stream)):
                self.host.refusals(Refusal.PEER_BANNED)
                with trio.move_on_after(WRITE_TIMEOUT):
                    await stream.reset()
                return
            peer = remote_peer(stream)
            self.active_handlers += 1
            long_lived = serve == self._serve_control  # counted per request instead (`_dispatch`)
            if not long_lived:
                self.exchanges[peer] += 1
            try:
                await serve(stream)
            except Exception:
                log.exception("direct stream handler failed; resetting the stream")
                with trio.move_on_after(WRITE_TIMEOUT):
                    await stream.reset()
            finally:
                self.active_handlers -= 1
                if not long_lived:
                    self._exchange_ended(peer)
                await close_stream(stream)

        return handler

    async def _serve_control(self, stream: INetStream) -> None:
        await serve_control(
            buffered(stream, self.host.tuning),
            self._dispatch,
            max_request=lambda kind: MAX_RESULT_FRAME if kind == "result" else MAX_CONTROL_FRAME,
            max_frame=MAX_RESULT_FRAME,
            frame_timeout=self.stall_timeout,
            on_invalid=lambda why: self._control_refused(stream, why),
        )

    async def _control_refused(self, stream: INetStream, rejection: Rejection) -> None:
        self.refused[str(rejection.reason)] += 1
        await self._strike_if_invalid(remote_peer(stream), rejection)

    async def _dispatch(self, kind: str, request: dict[str, Any], sender: str) -> dict[str, Any]:
        self.exchanges[sender] += 1
        try:
            return await self._decide(kind, request, sender)
        finally:
            self._exchange_ended(sender)

    async def _decide(self, kind: str, request: dict[str, Any], sender: str) -> dict[str, Any]:
        if kind == "claim":
            answer = await self._decide_claim(request, sender)
        elif kind == "result" and "sealed" in request:
            answer = await self._decide_sealed_result(request, sender)
        elif kind == "result":
            raw = request.get("result")
            answer = (
                await self._decide_result(raw, sender)
                if isinstance(raw, bytes)
                else refusal_message(Rejection(Reason.MALFORMED, "expected {type: result, result: bytes}"))
            )
        elif kind == "status" and self.status is not None:
            answer = self._decide_status()
        elif kind == "presence" and self.presence is not None:
            answer = self._decide_presence(request, sender)
        elif kind == "abort" and self.abort is not None:
            answer = await self._decide_abort(request, sender)
        else:
            answer = refusal_message(Rejection(Reason.MALFORMED, f"no such request here: {kind[:32]!r}"))
        if answer.get("type") == "refusal":
            self.refused[str(answer.get("reason"))] += 1
        return answer
