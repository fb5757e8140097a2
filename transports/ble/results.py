"""The offering side's default result check, through the mesh codec.

A result is accepted only if its signature verifies, it is signed by the claimant the peripheral granted (the PeerID
in the claim names the key), and it answers the offer this peripheral advertised.
"""

from __future__ import annotations

from transports.ble.protocol import offer_digest
from transports.wire.identity import public_key_of_peer_id
from transports.wire.reasons import Reason, Rejected
from transports.wire.results import TaskResult, open_result


def verify_with_mesh_codec(raw: bytes, claimant_peer_id: str, offer: bytes) -> TaskResult:
    result = open_result(raw, expect_executor=public_key_of_peer_id(claimant_peer_id))
    if result.offer_digest != offer_digest(offer):
        raise Rejected(Reason.UNKNOWN_OFFER, "result answers a different offer")
    return result
