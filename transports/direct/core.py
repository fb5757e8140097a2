"""The state and the helpers every protocol handler of the direct transport shares (transports.direct.transport
assembles the handlers, one class per protocol, over this one)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol, runtime_checkable

import trio
from libp2p.abc import INetStream

from transports.base import OfferSink
from transports.control import ControlChannels
from transports.direct.messages import (
    INVALID_INPUT,
    MAX_CONTROL_FRAME,
    MAX_RESULT_FRAME,
    REQUEST_FRAME_REASONS,
    decode_request,
    refusal_message,
    remote_peer,
    write_message,
)
from transports.framing import FrameError, read_frame
from transports.hardening.holdoff import BusyHoldoff
from transports.hardening.refusals import Refusal
from transports.p2p import P2PHost
from transports.wire.offers import OFFER_ID_SIZE
from transports.wire.reasons import Reason, Rejection

# Asked whether a peer's offer with this id is pending here; True when one was cancelled.
AbortFn = Callable[[str, bytes], bool]
# Given a signed cancel and its sender: the signed result the job ended with, or why the cancel is refused.
CancelFn = Callable[[bytes, str], Awaitable["bytes | Rejection"]]
# Told of a status a neighbour pushed: (its PeerID, the status).
PresenceFn = Callable[[str, dict[str, Any]], object]


class OfferDesk(Protocol):
    """The offerer's side of claims and results. Implemented by `mesh.claims`."""

    async def grant_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None = None
    ) -> Rejection | None:
        """None grants the claim. `status` is the claimant's own, sent with its request."""
        ...

    async def accept_result(self, raw: bytes, sender: str) -> Rejection | None:
        """None acknowledges the result."""
        ...


@runtime_checkable
class SealedOfferDesk(OfferDesk, Protocol):
    """A desk that also takes claims on sealed offers (`transports.wire.sealed`). Implemented by `mesh.claims`; a
    node whose desk does not refuses sealed claims and sealed results as `malformed`."""

    async def grant_sealed_claim(
        self, offer_id: bytes, claimant: str, status: dict[str, Any] | None, seal_to: bytes
    ) -> Rejection | bytes:
        """The grant of a sealed offer's claim: its payload sealed to `seal_to` (the claimant's key for this claim)."""
        ...

    async def accept_sealed_result(self, offer_id: bytes, sealed: bytes, sender: str) -> Rejection | None:
        """A sealed offer's result, sealed to the offer's key. None acknowledges it."""
        ...


@dataclass(eq=False)
class DirectCore:
    host: P2PHost
    desk: OfferDesk
    _: KW_ONLY
    max_frame: int = 256 * 1024 + 1024
    stall_timeout: float = 10.0
    result_timeout: float = 120.0
    status: Callable[[], dict[str, Any]] | None = None
    abort: AbortFn | None = None
    presence: PresenceFn | None = None
    # Peers refused for want of room, until their retry hint runs out (transports.hardening.holdoff).
    holdoff: BusyHoldoff = field(default_factory=BusyHoldoff)
    cancel: CancelFn | None = None
    sink: OfferSink | None = field(default=None, init=False)  # set by run(): offers are refused until then
    # Refusals we sent, by reason, and handlers currently running (tests prove a stalled one is freed).
    refused: Counter[str] = field(default_factory=Counter, init=False)
    active_handlers: int = field(default=0, init=False)
    # Peers with an exchange in progress here, by PeerID: the connection manager does not trim them.
    exchanges: Counter[str] = field(default_factory=Counter, init=False)
    aborted: int = field(default=0, init=False)  # jobs cancelled because their offerer stopped waiting
    cancels_taken: int = field(default=0, init=False)  # signed cancels that stopped a job (or got its finished result)
    # Our requests to each peer, on one long-lived stream per peer (transports.control). Used while `run` runs;
    # the client methods fall back to a stream per exchange otherwise.
    control: ControlChannels = field(init=False)
    use_control: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        # A grant for a sealed offer carries its payload: answers get a result's room.
        self.control = ControlChannels(self.host, max_answer=MAX_RESULT_FRAME, frame_timeout=self.stall_timeout)

    async def _refuse(self, stream: INetStream, rejection: Rejection) -> None:
        self.refused[str(rejection.reason)] += 1
        await write_message(stream, refusal_message(rejection))
        await self._strike_if_invalid(remote_peer(stream), rejection)

    async def _strike_if_invalid(self, peer: str, rejection: Rejection) -> None:
        if rejection.reason in INVALID_INPUT and self.host.penalties.strike(peer):
            await self.host.cut_off(peer, Refusal.INVALID_FRAMES)

    async def _read_request(self, stream: INetStream, max_len: int) -> bytes | None:
        try:
            return await read_frame(stream, max_len=max_len, timeout=self.stall_timeout)
        except FrameError as exc:
            await self._refuse(stream, Rejection(REQUEST_FRAME_REASONS[exc.reason], exc.detail))
            return None

    async def _read_control(self, stream: INetStream, kind: str) -> dict[str, Any] | None:
        """A `{type: kind, ...}` request map, or None once a refusal has been sent."""
        frame = await self._read_request(stream, MAX_CONTROL_FRAME)
        if frame is None:
            return None
        request = decode_request(frame)
        if isinstance(request, Rejection):
            await self._refuse(stream, request)
            return None
        return request

    async def _answer_request(
        self, stream: INetStream, kind: str, decide: Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]]
    ) -> None:
        """A `kind` request on a stream of its own, answered with `decide(request, sender)`."""
        request = await self._read_control(stream, kind)
        if request is not None:
            await self._send_answer(stream, await decide(request, remote_peer(stream)))

    async def _send_answer(self, stream: INetStream, answer: dict[str, Any]) -> None:
        if answer.get("type") == "refusal":
            self.refused[str(answer.get("reason"))] += 1
        await write_message(stream, answer)

    def _exchange_ended(self, peer: str) -> None:
        self.exchanges[peer] -= 1
        if self.exchanges[peer] <= 0:
            del self.exchanges[peer]

    def peers_in_flight(self) -> set[str]:
        """Peers with an offer, claim, result or status exchange in progress on this node's side."""
        return set(self.exchanges)

    @staticmethod
    def _offer_id_of(request: dict[str, Any], kind: str) -> bytes | Rejection:
        offer_id = request.get("offerId") if request.get("type") == kind else None
        if not isinstance(offer_id, bytes) or len(offer_id) != OFFER_ID_SIZE:
            return Rejection(Reason.MALFORMED, f"expected {{type: {kind}, offerId: 16 bytes}}")
        return offer_id

    async def _from_desk(self, decision: Awaitable[Rejection | bytes | None], ok: str) -> dict[str, Any]:
        """The desk's decision as an answer: bytes are a sealed offer's payload, carried by the grant."""
        # The desk is local and should answer at once; the bound keeps a slow one from pinning the stream.
        with trio.move_on_after(self.stall_timeout):
            decided = await decision
            if isinstance(decided, Rejection):
                return refusal_message(decided)
            return {"type": ok} if decided is None else {"type": ok, "payload": decided}
        return refusal_message(Rejection(Reason.TIMEOUT, "the offerer did not decide in time"))
