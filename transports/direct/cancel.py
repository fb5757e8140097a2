"""The cancel protocol's server side: a signed cancel (transports/wire/jobs.py) on a stream of its own, answered
with the signed result the job ended with (cancelled, or finished before the cancel came) or a typed refusal
(`not_offerer`, `unknown_offer`, a bad signature). The same cancel may also come as a frame on the offer stream
(`{"type": "cancel", "cancel": bytes}`), where the job's result itself is the answer."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.abc import INetStream

from transports.direct.core import DirectCore
from transports.direct.messages import MAX_CONTROL_FRAME, refusal_message, remote_peer
from transports.wire.reasons import Reason, Rejection

CANCEL_PROTOCOL = "/edgecoder/cancel/1.0.0"


class CancelProtocol(DirectCore):
    async def _serve_cancel(self, stream: INetStream) -> None:
        raw = await self._read_request(stream, MAX_CONTROL_FRAME)
        if raw is not None:
            await self._send_answer(stream, await self._decide_cancel(raw, remote_peer(stream)))

    async def _decide_cancel(self, raw: bytes, sender: str) -> dict[str, Any]:
        assert self.cancel is not None
        # A run stops within the executor's kill grace; the bound keeps a cancel from pinning the stream anyway.
        with trio.move_on_after(self.stall_timeout):
            outcome = await self.cancel(raw, sender)
            if isinstance(outcome, Rejection):
                await self._strike_if_invalid(sender, outcome)  # a forged or garbled cancel is invalid input
                return refusal_message(outcome)
            self.cancels_taken += 1
            return {"type": "result", "result": outcome}
        return refusal_message(Rejection(Reason.TIMEOUT, "the job did not stop in time"))
