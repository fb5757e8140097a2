"""The result protocol's server side: a runner carries the signed result of a claimed offer back to its offerer."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore, SealedOfferDesk
from transports.direct.messages import MAX_RESULT_FRAME, refusal_message, remote_peer
from transports.wire.codec import unpack_strict
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.sealed import is_direct_form

RESULT_PROTOCOL = "/edgecoder/result/1.0.0"


class ResultProtocol(DirectCore):
    async def _serve_result(self, stream: INetStream) -> None:
        raw = await self._read_request(stream, MAX_RESULT_FRAME)
        if raw is None:
            return
        if is_direct_form(raw):  # a sealed result's request map; a signed result is an array
            try:
                request = unpack_strict(raw, max_size=MAX_RESULT_FRAME)
            except Rejected as exc:
                await self._refuse(stream, exc.rejection)
                return
            answer = await self._decide_sealed_result(request if isinstance(request, dict) else {}, remote_peer(stream))
        else:
            answer = await self._decide_result(raw, remote_peer(stream))
        await self._send_answer(stream, answer)

    async def _decide_result(self, raw: bytes, sender: str) -> dict[str, Any]:
        return await self._from_desk(self.desk.accept_result(raw, sender), "ack")

    async def _decide_sealed_result(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        """`{type: result, offerId, sealed}`: a sealed offer's result, sealed to the offer's key."""
        offer_id, sealed = self._offer_id_of(request, "result"), request.get("sealed")
        if isinstance(offer_id, Rejection):
            return refusal_message(offer_id)
        if not isinstance(sealed, bytes):
            return refusal_message(Rejection(Reason.MALFORMED, "expected {type: result, offerId, sealed: bytes}"))
        if not isinstance(self.desk, SealedOfferDesk):
            return refusal_message(Rejection(Reason.MALFORMED, "no sealed offers here"))
        return await self._from_desk(self.desk.accept_sealed_result(offer_id, sealed, sender), "ack")
