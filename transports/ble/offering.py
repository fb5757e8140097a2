"""`edgecoder offer --ble-hci`: advertise one signed offer from an HCI radio until a verified result or the deadline.

The node that claims it signs its claim over the link's nonce, runs the offer, and writes the signed result back; the
peripheral (`OfferServer`) accepts it only from the key it granted. A grant that brings no result within its lease
lapses, and the offer stays open to the other nodes nearby until the deadline.

Refusals a node sends over BLE are unauthenticated hints. One ends the offer early only when the offerer can
confirm it from its own offer (`refusal_is_final`): a node that says "sandbox required" about an offer that does ask
for the host is right, whoever it is. Any other refusal is reported only if no result came by the deadline, so a
stranger nearby cannot make an offerer give up by lying (it could only jam the radio, which no protocol prevents).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
import trio

from transports.ble.offer_server import RefusalRecord, ServerLimits
from transports.ble.peripheral import PeripheralFaults
from transports.ble.radios import HasPeerIdentity, HciRadio, OfferingPeerHandle
from transports.ble.timing import PRESETS, offer_timing
from transports.wire.offers import TaskOffer
from transports.wire.reasons import Reason, Rejection
from transports.wire.results import TaskResult

log = structlog.get_logger("edgecoder.ble.offer")

# A grant lasts the offer's own run time plus this much for the claim, the queue and the result's way back.
GRANT_MARGIN_S = 30.0
PROGRESS_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class BleOfferOutcome:
    result: TaskResult | None = None
    refusal: Rejection | None = None


def refusal_is_final(refusal: RefusalRecord, offer: TaskOffer) -> bool:
    """A refusal the offerer can check against its own offer: every honest node says the same."""
    return refusal.reason == Reason.SANDBOX_REQUIRED and offer.sandbox != "docker"


def grant_lease_s(offer: TaskOffer) -> float:
    return offer.limits.timeout_ms / 1000 + GRANT_MARGIN_S


def warn_if_slow(raw: bytes) -> None:
    """Say when the offer is larger than a node on a Linux-default link can fetch within its transfer deadline."""
    from transports.ble.policy import ProximityPolicy

    linux = offer_timing(len(raw), 0, PRESETS["linux"])
    deadline = ProximityPolicy().transfer_timeout_s
    if linux.to_offer > deadline:
        log.warning(
            "offer may be too large for BLE",
            offer_bytes=len(raw),
            linux_default_link_s=round(linux.to_offer, 1),
            node_transfer_deadline_s=deadline,
            hint="see the offer size budget in docs/ble.md",
        )


async def offer_over_ble(
    radio: HciRadio,
    identity: HasPeerIdentity,
    offer: TaskOffer,
    raw: bytes,
    *,
    wait_s: float,
    faults: PeripheralFaults | None = None,
) -> BleOfferOutcome:
    warn_if_slow(raw)
    limits = ServerLimits(grant_lease_s=grant_lease_s(offer))
    peer = await radio.offer(identity, raw, limits=limits, faults=faults)
    log.info("advertising offer over BLE", offer=offer.offer_id.hex(), radio=radio.spec.text, bytes=len(raw))
    outcome: object = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_log_progress, peer)
        with trio.move_on_after(wait_s):
            outcome = await peer.wait_outcome(lambda refusal: refusal_is_final(refusal, offer))
        nursery.cancel_scope.cancel()
    if isinstance(outcome, TaskResult):
        log.info("verified result", offer=offer.offer_id.hex(), ok=outcome.result.ok)
        return BleOfferOutcome(result=outcome)
    if isinstance(outcome, RefusalRecord):
        return BleOfferOutcome(refusal=Rejection(Reason(outcome.reason), outcome.detail))
    return BleOfferOutcome(refusal=await _timed_out(peer, wait_s))


async def _timed_out(peer: OfferingPeerHandle, wait_s: float) -> Rejection:
    state = await peer.state()
    heard = [f"{r.reason} ({r.detail})" if r.detail else r.reason for r in state.refusals]
    parts = [f"no verified result within {wait_s:g} s", f"{state.links_served} node link(s)"]
    if state.lapsed:
        parts.append(f"grants lapsed without a result: {', '.join(state.lapsed)}")
    if heard:
        parts.append(f"nodes refused it: {'; '.join(heard[-3:])}")
    return Rejection(Reason.TIMEOUT, ", ".join(parts))


async def _log_progress(peer: OfferingPeerHandle) -> None:
    """What the offerer sees, on stderr: links, claims, refusals (the state is polled; it lives on asyncio)."""
    links = claims = refusals = 0
    while True:
        state = await peer.state()
        if state.links_served > links:
            links = state.links_served
            log.info("node connected", links=links)
        for claim in state.claims[claims:]:
            log.info("claim", claimant=claim.claimant, granted=claim.granted, detail=claim.detail)
        for refusal in state.refusals[refusals:]:
            log.info("node refused the offer", reason=refusal.reason, detail=refusal.detail)
        claims, refusals = len(state.claims), len(state.refusals)
        await trio.sleep(PROGRESS_POLL_S)
