"""Hypothesis strategies shared by the codec and intake tests."""

from __future__ import annotations

from hypothesis import strategies as st

from executor.contract import ErrorKind, ExecResult, Limits, QueueReason
from transports.wire.identity import NodeIdentity
from transports.wire.offers import ISOLATION_TIERS, MAX_ATTEMPTS, MAX_INVITEES, Audience, TaskOffer
from transports.wire.peerid import ed25519_peer_id

NOW = 1_800_000_000_000  # a fixed clock for the tests: 2027-01-15

OFFERER = NodeIdentity(bytes(range(32)))

json_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

limits = st.builds(
    Limits,
    timeout_ms=st.integers(1, 600_000),
    memory_mb=st.integers(1, 4096),
    cpus=st.integers(1, 8000).map(lambda m: m / 1000),
)


peer_ids = st.binary(min_size=32, max_size=32).map(ed25519_peer_id)
audiences = st.builds(Audience.direct, peer_ids) | st.builds(
    Audience.claimed, st.lists(peer_ids, max_size=MAX_INVITEES, unique=True)
)


@st.composite
def offers(draw: st.DrawFn, offerer: NodeIdentity = OFFERER) -> TaskOffer:
    """Version 1, 2 and 3 offers: v2 with any audience and minimum tier, v3 with any attempt, queue deadline within
    the offer's lifetime, and follow flag."""
    issued = draw(st.integers(NOW - 60_000, NOW + 1_000))
    version = draw(st.sampled_from([1, 2, 3]))
    expires = issued + draw(st.integers(61_000, 600_000))
    v3 = version >= 3
    return TaskOffer(
        offer_id=draw(st.binary(min_size=16, max_size=16)),
        offerer=offerer.public_key,
        issued_at_ms=issued,
        expires_at_ms=expires,
        language=draw(st.sampled_from(["python", "javascript"])),
        code=draw(st.text(max_size=200)),
        input=draw(json_data),
        limits=draw(limits),
        sandbox=draw(st.sampled_from(["docker", "host"])),
        reply_to=tuple(draw(st.lists(st.text(max_size=40), max_size=3))),
        version=version,
        audience=None if version == 1 else draw(audiences),
        min_isolation=None if version == 1 else draw(st.none() | st.sampled_from(ISOLATION_TIERS)),
        attempt=draw(st.integers(1, MAX_ATTEMPTS)) if v3 else 1,
        queue_deadline_ms=draw(st.none() | st.integers(issued + 1, expires)) if v3 else None,
        follow=draw(st.booleans()) if v3 else False,
    )


exec_results = st.builds(
    ExecResult,
    ok=st.booleans(),
    stdout=st.text(max_size=100),
    stderr=st.text(max_size=100),
    exit_code=st.none() | st.integers(-(2**31), 2**31),
    duration_ms=st.integers(0, 10**7),
    queue_for_cloud=st.booleans(),
    queue_reason=st.none() | st.sampled_from(list(QueueReason)),
    error_kind=st.none() | st.sampled_from(list(ErrorKind)),
    stdout_truncated=st.booleans(),
    stderr_truncated=st.booleans(),
)
