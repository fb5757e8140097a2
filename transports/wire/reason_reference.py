"""What each `Reason` means to a user: its cause, and what to do about it.

scripts/gen_reasons.py writes docs/reference/reasons.md from this table, `Reason` and the layer tables in
`transports.vocabulary`; tests/test_reasons.py checks that every code has its entry and that the committed page is
the generated one, so the page cannot drift from the code.
"""

from __future__ import annotations

from transports.wire.reasons import Reason

# reason -> (what causes it, what the user does about it)
REFERENCE: dict[Reason, tuple[str, str]] = {
    # Refusals carried on the wire.
    Reason.TOO_LARGE: (
        "A message, frame or HTTP body is over its cap (offers 256 KiB, results 512 KiB, a coordinator's JSON body "
        "4 KiB), found before it is read whole.",
        "Send less code or input. From a peer of yours, it is a bug or an attack: the peer is struck, then banned.",
    ),
    Reason.MALFORMED: (
        "Bytes that are not a message of the protocol: bad msgpack, a wrong shape, an unknown field, a bool where an "
        "int belongs, a stream closed mid-request, or an answer naming an unknown code.",
        "Check the encoder against docs/protocol.md and tests/vectors. Repeated by one peer, it bans the peer.",
    ),
    Reason.UNSUPPORTED_VERSION: (
        "A message of a protocol version this node does not take (docs/protocol.md lists the versions).",
        "Upgrade the older side; a node keeps accepting every version it ever sent.",
    ),
    Reason.BAD_SIGNATURE: (
        "The Ed25519 signature does not verify against the key the message names (an offer's offerer, a result's "
        "executor, a coordinator request's agent).",
        "Sign with the key you name; a message altered on the way is refused here too.",
    ),
    Reason.EXPIRED: (
        "The offer's `expiresAt` has passed (beyond the allowed clock skew, 30 s by default).",
        "Send it again with a fresh expiry; check the offerer's clock (NTP).",
    ),
    Reason.NOT_YET_VALID: (
        "The offer's `issuedAt` is ahead of this node's clock by more than the allowed skew.",
        "Fix the clock of the offerer or of the node (NTP).",
    ),
    Reason.TTL_TOO_LONG: (
        "The offer's lifetime (`expiresAt - issuedAt`) is longer than the node accepts (10 minutes by default).",
        "Give the offer a shorter `--wait-s` or expiry.",
    ),
    Reason.REPLAYED: (
        "This offer id from this offerer was already admitted here (the replay memory outlives a restart).",
        "Make a new offer (a new id) rather than re-sending the same signed bytes.",
    ),
    Reason.RATE_LIMITED: (
        "The offerer is over its rate (5 offers a second, bursts of 20, by default), or a coordinator client over its "
        "bucket, or a peer sent again before its `retryAfterMs` ran out.",
        "Wait `retryAfterMs` (or the HTTP `Retry-After`) before sending again; a script that re-sends at once is "
        "held off, then banned.",
    ),
    Reason.LANGUAGE_NOT_ALLOWED: (
        "The node's `intake.languages` does not list the offer's language.",
        "Offer to another node, or (its operator) add the language.",
    ),
    Reason.OFFERER_DENIED: (
        "The node's `intake.allow_offerers` or `intake.deny_offerers` exclude the offerer's key.",
        "Ask the operator to allow your PeerID, or offer to another node.",
    ),
    Reason.SANDBOX_REQUIRED: (
        "A remote offer asked to run on the host (`sandbox: host`). Refused at the intake before any claim; the "
        "offerer gets the seed's run result: `ok: false`, stderr `sandbox_required_for_remote_task`, no process.",
        "Run host code only on your own machine (`edgecoder exec --sandbox host`); remote work runs in Docker.",
    ),
    Reason.SANDBOX_UNAVAILABLE: (
        "The node cannot sandbox now (no Docker daemon or image, a failed canary, `sandbox_mode = none`), so it "
        "takes no remote work; a coordinator refuses `/pull` from an agent in mode `none`.",
        "Offer elsewhere (the result says `queueForCloud`). Operator: `edgecoder doctor` names the cause and fix.",
    ),
    Reason.WRONG_AUDIENCE: (
        "A v2 offer reached a node or a route its signed audience rules out: sent directly to another node, or a "
        "claimed offer sent on a direct stream.",
        "Send a direct offer to the node it names (`--to`); claimed offers go by gossip, BLE or a coordinator.",
    ),
    Reason.NOT_INVITED: (
        "A claimed offer invites only other nodes to claim it.",
        "Nothing: an invited node runs it. The offerer invites others if none takes it.",
    ),
    Reason.ISOLATION_INSUFFICIENT: (
        "The offer's `minIsolation` asks for a sandbox tier stronger than any this node runs (runc < gvisor).",
        "Offer to a node that runs that tier (`edgecoder peers` shows tiers), or lower `--min-isolation`.",
    ),
    Reason.RUNTIME_UNAVAILABLE: (
        "The offer's `runtime` is not built on this node (or not declared), or its `runtimeDigest` names another "
        "package set than this node's build of it (docs/runtimes.md). A run: the runtime is not declared here.",
        "Offer to a node that advertises the runtime (`edgecoder peers` shows runtimes); as the operator, declare it "
        "(executor.runtimes) and `edgecoder image build --runtime NAME`.",
    ),
    Reason.RESOURCES_INSUFFICIENT: (
        "The offer's `minResources` asks for more cores or memory than one run may have here, another architecture, "
        "or a GPU (no sandbox tier passes one through).",
        "Offer to a node that advertises them (`/status` shows resources), or ask for less.",
    ),
    Reason.BUSY: (
        "No room for the offer now: the intake queue, the offerer's share of it, the replay memory, the executor's "
        "waiting line, or a coordinator table at its cap.",
        "Send again after `retryAfterMs`, or to another node. Operator: raise `executor.concurrency` if the cores "
        "allow.",
    ),
    Reason.SHUTTING_DOWN: (
        "The node is stopping and takes no new work.",
        "Offer to another node, or again once it is back.",
    ),
    Reason.CLAIM_REFUSED: (
        "The offerer would not grant this node the claim: another runner holds it, or the node was not invited.",
        "Nothing: claims decide who runs a gossip or BLE offer, and only one runner may.",
    ),
    Reason.UNKNOWN_OFFER: (
        "A claim, result or abort names an offer this node has not issued, or has finished with.",
        "Nothing, usually: the offer ended first. Repeated, check the peer's clock and version.",
    ),
    Reason.WRONG_EXECUTOR: (
        "A result signed by a key other than the one the offer was granted to (or sent to).",
        "Treat the result as forged: it is dropped. Report the peer if it repeats.",
    ),
    Reason.TIMEOUT: (
        "Something did not finish in time: a run past its `timeoutMs` (exit 124, `queueForCloud`), a peer that "
        "stalled mid-frame, or no result before the offerer's wait ran out.",
        "For a run: raise `--timeout-ms` (at most 30 s) or make the code faster. For a peer: try another.",
    ),
    Reason.RESULTS_DISAGREE: (
        "An offer run by k replicas came back with results that differ (what the program did, not how long).",
        "The code is not deterministic, or a runner lies: rerun with other replicas and compare.",
    ),
    Reason.NOT_OFFERER: (
        "A cancel of a job signed by anyone but the offer's own offerer.",
        "Only the offerer can cancel its offer: sign the cancel with the key that signed the offer.",
    ),
    Reason.QUEUE_DEADLINE: (
        "The offer's `queueDeadlineMs` passed while it waited in a busy runner's queue, or before it arrived.",
        "Send it again with a later deadline, or to a node with room (`edgecoder peers`).",
    ),
    Reason.STALE_ATTEMPT: (
        "An event (a claim, a result) for an attempt of a job that is no longer its current one.",
        "Nothing: the job moved on to another attempt; the runner's late answer is dropped.",
    ),
    Reason.JOB_FINISHED: (
        "An event for a job that has already ended (succeeded, failed, cancelled or expired, or out of attempts).",
        "Nothing: the job's outcome is final. Offer it again as a new job to run it again.",
    ),
    Reason.PAYLOAD_MISMATCH: (
        "A sealed offer's payload did not open for this claim, or its code or input is not what the offer's signed "
        "digests and sizes name; nothing runs.",
        "Offerer: seal the payload of the offer you signed, to the claimant's key. Repeated by one offerer, it is "
        "an attack on the runner's time.",
    ),
    Reason.UNREACHABLE: (
        "Nobody answered: the peer could not be dialled, or the link dropped before an answer (not a refusal).",
        "Check the address and that the node runs (`edgecoder peers`); gossip tries the offerer's other addresses.",
    ),
    # A run's result.
    Reason.OUTSIDE_SUBSET: (
        "The code uses a construct outside the subset the policy allows (named with its line); nothing was started.",
        "Remove the construct, or run locally with `--no-subset`; `queueForCloud` says the cloud may run it.",
    ),
    Reason.MEMORY_EXCEEDED: (
        "The run was killed for using more memory than its limit (`State.OOMKilled`, exit 137); errorKind "
        "`memory-exceeded`.",
        "Raise `--memory-mb` (at most 512) or use less memory; `queueForCloud` is set.",
    ),
    Reason.SANDBOX_VIOLATION: (
        "errorKind `sandbox-violation`: the run was refused or stopped at the sandbox (a host request from afar, a "
        "construct outside the subset, no tier strong enough, or no sandbox at all).",
        "See the queueReason beside it for which.",
    ),
    Reason.EXECUTION_FAILED: (
        "errorKind `execution-failed`: the program exited non-zero, or the request was invalid (code or input over "
        "its size, an unknown language).",
        "Read stderr and exitCode: it is the program's own failure.",
    ),
    Reason.ABORTED: (
        "The run did not finish: the offerer stopped waiting, the node shut down, or the executor was busy (queue "
        "reason `busy`).",
        "Send it again, to this node later or to another.",
    ),
    Reason.NODE_ERROR: (
        "The node failed while handling the offer: a bug in the node, not in the program.",
        "Send it again elsewhere, and report it with the node's log.",
    ),
    # A frame on a stream.
    Reason.CLOSED: (
        "A stream ended or was reset in the middle of a frame.",
        "Nothing: the request is refused `malformed`, or an answer counts as `unreachable`.",
    ),
    # The connection defences.
    Reason.SOURCE_CONCURRENCY: (
        "Too many live connections from one source address (one /64 for IPv6); the socket is closed at accept.",
        "Use fewer connections per address; one connection carries every stream.",
    ),
    Reason.SOURCE_RATE: (
        "New connections from one source address faster than its token bucket refills.",
        "Reconnect with backoff.",
    ),
    Reason.PENDING_FULL: (
        "The node's handshakes in progress were full; the oldest was dropped.",
        "Try again; if it persists the node is under a handshake flood.",
    ),
    Reason.GATED: (
        "The operator's connection gate (deny or allow list) refused the address.",
        "Ask the operator.",
    ),
    Reason.HANDSHAKE_TIMEOUT: (
        "A socket did not finish multistream, Noise and yamux within the handshake timeout (3 s).",
        "Check the link's latency; an idle socket is closed by design.",
    ),
    Reason.HANDSHAKE_FAILED: (
        "No common protocol, a bad Noise handshake, or a socket closed mid-way (an mplex-only peer, for one).",
        "Speak Noise and yamux (docs/transports.md).",
    ),
    Reason.CONNECTION_LIMIT: (
        "libp2p's resource manager: established connections are at their cap (inbound, total or per peer).",
        "Close connections you do not use; try again later.",
    ),
    Reason.PEER_RATE: (
        "New connections from one PeerID faster than its token bucket refills.",
        "Reconnect with backoff; keep one connection open instead.",
    ),
    Reason.WINDOW_VIOLATION: (
        "A peer sent yamux data past the receive window; the session is closed.",
        "Fix the peer's yamux implementation: it must respect flow control.",
    ),
    Reason.STREAM_CAP: (
        "More inbound streams open on one connection than allowed; the new one is reset.",
        "Open fewer streams at once (the control protocol carries requests on one).",
    ),
    Reason.INVALID_GOSSIP: (
        "A peer's gossip score fell below the graylist threshold for forwarding invalid messages: banned, cut off.",
        "Fix what the peer forwards; the ban lasts 10 minutes.",
    ),
    Reason.INVALID_FRAMES: (
        "Too many invalid direct-stream frames from one peer (too large, malformed, badly signed): banned, cut off.",
        "Fix the peer's encoder; the ban lasts 10 minutes.",
    ),
    Reason.PEER_BANNED: (
        "A connection or stream from a banned peer, refused until its ban ends.",
        "Wait out the ban (10 minutes), and fix what earned it.",
    ),
    Reason.RETRY_TOO_SOON: (
        "An offer sent before the peer's `retryAfterMs` from a `busy` or `rate_limited` refusal ran out; refused "
        "unread, as `rate_limited`.",
        "Honour `retryAfterMs`.",
    ),
    Reason.RETRY_IGNORED: (
        "Too many offers sent too soon (46 in a burst): the peer is banned and disconnected.",
        "Honour `retryAfterMs`; the ban lasts 10 minutes.",
    ),
    # A BLE session.
    Reason.MALFORMED_FRAME: (
        "A BLE frame or message out of place: shorter than its header, a message out of turn, or an answer of "
        "the wrong kind.",
        "Move closer or retry; repeated, the peer's firmware is at fault. Reported as `malformed`.",
    ),
    Reason.OUT_OF_ORDER_CHUNK: (
        "A BLE chunk is missing, or chunks arrived reordered.",
        "Retry: the session is retried cleanly. Reported as `malformed`.",
    ),
    Reason.DUPLICATE_CHUNK: (
        "A BLE chunk, or a whole message, arrived twice.",
        "Retry. Reported as `malformed`.",
    ),
    Reason.DIGEST_MISMATCH: (
        "A BLE message's BLAKE2b digest does not match: a corrupted byte.",
        "Retry, closer or with less interference. Reported as `malformed`.",
    ),
    Reason.OVERRUN: (
        "More BLE bytes than the message's declared length.",
        "Retry; repeated, the peer is at fault. Reported as `malformed`.",
    ),
    Reason.BAD_PEER_INFO: (
        "A BLE peer's identity, capabilities or a message field are unreadable or malformed.",
        "Upgrade the peer. Reported as `malformed`.",
    ),
    Reason.NO_SERVICE: (
        "The BLE peer does not offer the edgecoder GATT service.",
        "Nothing: it is not an edgecoder node. Reported as `malformed`.",
    ),
    Reason.DISCONNECTED: (
        "The BLE link dropped mid-session.",
        "Move closer; the session reconnects a bounded number of times. Reported as `unreachable`.",
    ),
    Reason.CONNECT_FAILED: (
        "A BLE connection could not be made after its attempts and backoff.",
        "Check the radio (`hciconfig`), range and the peer's advertising. Reported as `unreachable`.",
    ),
    Reason.RESULT_REFUSED: (
        "The offering side refused a result sent over BLE (not granted, or it does not verify).",
        "Nothing on the runner's side: only the granted claimant's verified result counts. Reported as `malformed`.",
    ),
    # The coordinator's HTTP refusals.
    Reason.UNSIGNED: (
        "A coordinator request without its signature headers.",
        "Sign requests with the agent's key (`edgecoder` does; docs/coordinator.md for other clients).",
    ),
    Reason.SKEWED: (
        "A coordinator request whose timestamp is more than 120 s from the coordinator's clock.",
        "Fix the agent's clock (NTP).",
    ),
    Reason.REPLAYED_NONCE: (
        "A coordinator request reusing a nonce within 300 s.",
        "Use a fresh nonce per request; a replay of someone's request is refused by design.",
    ),
    Reason.UNKNOWN_AGENT: (
        "A coordinator request from an agent that never registered.",
        "Register first (`POST /agents`; a node does it at start).",
    ),
    Reason.UNKNOWN_TASK: (
        "No such task at the coordinator, or not yours to read.",
        "Check the task id (the offer id in lowercase hex) and the key you sign with.",
    ),
    Reason.NOT_CLAIMED: (
        "A result or release for a task not currently claimed: queued, done, or its lease lapsed.",
        "Nothing: the task went back to the queue; pull again.",
    ),
    Reason.CLAIMED_BY_OTHER: (
        "A result or release for a task another agent holds.",
        "Nothing: only the claimant's result counts.",
    ),
    Reason.DUPLICATE_TASK: (
        "An offer id already enqueued at the coordinator, restart or not.",
        "Make a new offer (a new id).",
    ),
    Reason.RESULT_MISMATCH: (
        "A result naming another offer id or offer digest than its task.",
        "Send the result of the task you claimed.",
    ),
    Reason.NOT_FOUND: (
        "No such coordinator endpoint.",
        "Check the URL and the coordinator's version (docs/coordinator.md lists the endpoints).",
    ),
    Reason.INTERNAL: (
        "The coordinator failed while handling the request; its log has the traceback.",
        "Try again; report it with the coordinator's log.",
    ),
}
