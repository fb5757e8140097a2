"""Direct request/response streams between two peers: offers addressed to us, claims and results to the offerer.

Each exchange is one stream carrying one request frame and one answer frame (see `transports.framing`). Answers
are canonical msgpack maps:

    {"type": "result", "result": <signed result bytes>}     offer stream, after the work ran
    {"type": "grant"}                                        claim stream
    {"type": "ack"}                                          result and abort streams
    {"type": "refusal", "reason": <Reason>, "detail": str}   any stream; a refusal the seed defines as a run
                                                             result also carries it, "result": {ok: false, ...}

A job is bound to the request that brought it. On an offer stream the offerer may send one more frame while it
waits, `{"type": "abort"}`; that frame, the stream's end or reset, or the result timeout cancel the job's scope
(`Delivery.scope`), and the cancel reaches the container. A gossip offerer that stops waiting sends
`{"type": "abort", "offerId": id}` on the abort protocol to each peer holding its claim; only the offerer itself
(the Noise-authenticated PeerID of the stream) can abort its offers.

Every server handler is bounded in time (a stalled peer costs at most `stall_timeout`, an admitted offer at most
`result_timeout`), answers with a typed refusal where the stream still allows it, and never raises into libp2p.

A refusal for invalid input (`INVALID_INPUT`: a frame over its cap, a malformed request, a bad signature) is also a
strike against the peer on the host's `PenaltyBox`; past its threshold the peer is banned and cut off (counted as
`invalid_frames`), and while the ban lasts its streams are reset unread (`peer_banned`) and its connections refused.
"""

from transports.direct.abort import ABORT_PROTOCOL, ABORT_SEND_TIMEOUT
from transports.direct.cancel import CANCEL_PROTOCOL
from transports.direct.claim import CLAIM_PROTOCOL
from transports.direct.core import AbortFn, CancelFn, OfferDesk, PresenceFn
from transports.direct.messages import (
    INVALID_INPUT,
    MAX_CONTROL_FRAME,
    MAX_RESULT_FRAME,
    WRITE_TIMEOUT,
    DirectAnswer,
    ReplyError,
    checked_answer,
    decode_answer,
    decode_request,
    refusal_message,
)
from transports.direct.offer import OFFER_PROTOCOL
from transports.direct.presence import PRESENCE_PROTOCOL
from transports.direct.result import RESULT_PROTOCOL
from transports.direct.status import STATUS_PROTOCOL
from transports.direct.transport import DirectTransport

__all__ = [
    "ABORT_PROTOCOL",
    "ABORT_SEND_TIMEOUT",
    "CANCEL_PROTOCOL",
    "CLAIM_PROTOCOL",
    "INVALID_INPUT",
    "MAX_CONTROL_FRAME",
    "MAX_RESULT_FRAME",
    "OFFER_PROTOCOL",
    "PRESENCE_PROTOCOL",
    "RESULT_PROTOCOL",
    "STATUS_PROTOCOL",
    "WRITE_TIMEOUT",
    "AbortFn",
    "CancelFn",
    "DirectAnswer",
    "DirectTransport",
    "OfferDesk",
    "PresenceFn",
    "ReplyError",
    "checked_answer",
    "decode_answer",
    "decode_request",
    "refusal_message",
]
