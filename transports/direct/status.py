"""The status protocol's server side: this node's current heartbeat, asked for point to point."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore
from transports.direct.messages import MAX_CONTROL_FRAME

# A peer's current heartbeat, asked for point to point: an offerer that has not yet heard a claimant's flooded
# heartbeat asks it directly (over Noise, so the answer is authenticated) instead of waiting for the next one.
STATUS_PROTOCOL = "/edgecoder/status/1.0.0"


class StatusProtocol(DirectCore):
    async def _serve_status(self, stream: INetStream) -> None:
        if await self._read_request(stream, MAX_CONTROL_FRAME) is not None:
            await self._send_answer(stream, self._decide_status())

    def _decide_status(self) -> dict[str, Any]:
        assert self.status is not None
        return {"type": "status", "heartbeat": self.status()}
