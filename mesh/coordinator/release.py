"""What becomes of a task whose claiming node refused the offer (its intake returned a `Rejection`).

- The offer itself is bad (no node would take it): the task fails, keeping the node's reason.
- The node's own policy refused it (another node may well accept): the task is requeued, but never handed to that
  agent again.
- The node was momentarily unable (busy, rate limited, sandbox gone): the task is requeued for anyone, that agent
  included; the agent backs off before it pulls again.
"""

from __future__ import annotations

from typing import Literal

from transports.wire.reasons import BAD_OFFER, Reason

Disposition = Literal["failed", "requeue_elsewhere", "requeue"]

# It asked to run on the host: every node refuses that for remote work, as it refuses a bad offer.
_OFFER_IS_BAD = BAD_OFFER | {Reason.SANDBOX_REQUIRED}
_AGENT_POLICY = frozenset({Reason.LANGUAGE_NOT_ALLOWED, Reason.OFFERER_DENIED, Reason.REPLAYED})


def disposition_of(reason: Reason) -> Disposition:
    if reason in _OFFER_IS_BAD:
        return "failed"
    if reason in _AGENT_POLICY:
        return "requeue_elsewhere"
    return "requeue"
