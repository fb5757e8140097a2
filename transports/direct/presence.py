"""The presence protocol's server side: a neighbour pushes its status when it changes (transports.presence)."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore
from transports.direct.messages import refusal_message, remote_peer
from transports.wire.reasons import Reason, Rejection

# A node's status pushed to a neighbour when it changes (transports.presence); answered with an ack.
PRESENCE_PROTOCOL = "/edgecoder/presence/1.0.0"


class PresenceProtocol(DirectCore):
    async def _serve_presence(self, stream: INetStream) -> None:
        request = await self._read_control(stream, "presence")
        if request is not None:
            await self._send_answer(stream, self._decide_presence(request, remote_peer(stream)))

    def _decide_presence(self, request: dict[str, Any], sender: str) -> dict[str, Any]:
        status = request.get("status") if request.get("type") == "presence" else None
        if not isinstance(status, dict):
            return refusal_message(Rejection(Reason.MALFORMED, "expected {type: presence, status: map}"))
        assert self.presence is not None
        self.presence(sender, status)  # a status naming another peer than the sender is ignored by the directory
        return {"type": "ack"}
