"""The abort protocol's server side: the offerer of a gossip offer tells its claimant that it stopped waiting."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore
from transports.direct.messages import refusal_message
from transports.wire.reasons import Reason, Rejection

# The offerer of a gossip offer tells its claimant that it stopped waiting.
ABORT_PROTOCOL = "/edgecoder/abort/1.0.0"
# An abort is one small frame, sent while the offerer is already giving up: it must not hold it for long.
ABORT_SEND_TIMEOUT = 1.0


class AbortProtocol(DirectCore):
    async def _serve_abort(self, stream: INetStream) -> None:
        await self._answer_request(stream, "abort", self._decide_abort)

    async def _decide_abort(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        offer_id = self._offer_id_of(request, "abort")
        if isinstance(offer_id, Rejection):
            return refusal_message(offer_id)
        assert self.abort is not None
        if self.abort(sender, offer_id):
            self.aborted += 1
            return {"type": "ack"}
        return refusal_message(Rejection(Reason.UNKNOWN_OFFER, "no pending offer of yours has that id here"))
