"""The result protocol's server side: a runner carries the signed result of a claimed offer back to its offerer."""

from __future__ import annotations

from typing import Any

from libp2p.abc import INetStream

from transports.direct.core import DirectCore
from transports.direct.messages import MAX_RESULT_FRAME, remote_peer

RESULT_PROTOCOL = "/edgecoder/result/1.0.0"


class ResultProtocol(DirectCore):
    async def _serve_result(self, stream: INetStream) -> None:
        raw = await self._read_request(stream, MAX_RESULT_FRAME)
        if raw is not None:
            await self._send_answer(stream, await self._decide_result(raw, remote_peer(stream)))

    async def _decide_result(self, raw: bytes, sender: str) -> dict[str, Any]:
        return await self._from_desk(self.desk.accept_result(raw, sender), "ack")
