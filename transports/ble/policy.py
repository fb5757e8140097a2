"""What the node accepts from the radio: proximity, how many peers and sessions, and how long it waits."""

from __future__ import annotations

from dataclasses import dataclass

from transports.ble.protocol import DEFAULT_MAX_OFFER_BYTES


@dataclass(frozen=True, slots=True)
class ProximityPolicy:
    # Advertisers weaker than this are too far away to be "nearby" and are never contacted.
    min_rssi: int = -75
    # At most this many distinct peers are contacted per `peer_window_s`: a flood of advertisers (or one radio
    # rotating random addresses) costs a bounded amount of work.
    max_peers: int = 8
    peer_window_s: float = 60.0
    # Sessions (connections) open at once.
    max_sessions: int = 2
    # A peer is not contacted again this soon after a session with it, whatever the outcome.
    retry_after_s: float = 30.0
    connect_timeout_s: float = 10.0
    # Connection set-up is where BLE fails most in the field (bleak users report 30-40% failed connects): each
    # session tries up to `connect_attempts` times, sleeping a random time in [0, min(cap, base * 2^n)] between tries
    # ("full jitter", so that several nodes that lost the same peer do not retry in step).
    connect_attempts: int = 3
    connect_backoff_s: float = 0.25
    connect_backoff_cap_s: float = 2.0
    # A reply whose link drops reconnects to the same peer (with the retries above), claims again (the offering
    # side re-grants its grant holder) and sends the result again, at most this many times.
    reply_reconnects: int = 2
    # No chunk, read or answer for this long: the peer has stalled.
    idle_timeout_s: float = 5.0
    # Whole-offer download deadline, however steadily chunks trickle in.
    transfer_timeout_s: float = 60.0
    claim_timeout_s: float = 10.0
    # How long a granted session stays connected waiting for the node to reply with the result.
    result_timeout_s: float = 900.0
    max_offer_bytes: int = DEFAULT_MAX_OFFER_BYTES
    # `OfferSink.participating` has no change notification, so the transport looks at it this often.
    participation_poll_s: float = 0.25
