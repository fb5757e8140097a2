"""The claim protocol's server side: a runner asks this node, the offerer, for the right to run one of its offers."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore, SealedOfferDesk
from transports.direct.messages import refusal_message
from transports.wire.reasons import Reason, Rejection

CLAIM_PROTOCOL = "/edgecoder/claim/1.0.0"


class ClaimProtocol(DirectCore):
    async def _serve_claim(self, stream: INetStream) -> None:
        await self._answer_request(stream, "claim", self._decide_claim)

    async def _decide_claim(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        offer_id = self._offer_id_of(request, "claim")
        if isinstance(offer_id, Rejection):
            return refusal_message(offer_id)
        status, seal_to = request.get("status"), request.get("sealTo")
        status = status if isinstance(status, dict) else None
        if seal_to is None:
            return await self._from_desk(self.desk.grant_claim(offer_id, sender, status), "grant")
        if not isinstance(seal_to, bytes) or not isinstance(self.desk, SealedOfferDesk):
            why = "sealTo must be bytes" if isinstance(self.desk, SealedOfferDesk) else "no sealed offers here"
            return refusal_message(Rejection(Reason.MALFORMED, why))
        return await self._from_desk(self.desk.grant_sealed_claim(offer_id, sender, status, seal_to), "grant")
