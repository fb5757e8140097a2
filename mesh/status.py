"""What a running node says about itself: `GET /status` and `/healthz`, and the recent-jobs log behind `jobs`.

`/status` is read by `edgecoder status`, `peers` and `jobs` (and by people with curl), so its field names are a
contract, camelCase like the rest of the node's JSON; docs/reference/status.md lists them. Everything in it is read
from the node's live state at request time: nothing here keeps a copy that could fall out of step, except the jobs
log, which is the only record of finished jobs the node has.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from transports.wire.peerid import ed25519_peer_id

if TYPE_CHECKING:
    from executor.contract import ExecResult, QueueReason
    from mesh.intake import Job
    from mesh.node import MeshNode

# How many finished jobs `/status` remembers, newest first.
JOB_HISTORY = 100


@dataclass(slots=True)
class JobRecord:
    """One offer a worker took: from the claim to the answer it sent."""

    offer_id: str
    offerer: str  # PeerID
    transport: str
    taken_at_ms: int
    state: str = "claiming"  # claiming, running, answered, cancelled, not-claimed, abandoned
    attempt: int = 1  # which try of its job the offer is (v3 offers; mesh/jobstate.py)
    ok: bool | None = None
    error_kind: str | None = None
    queue_reason: QueueReason | None = None
    duration_ms: int | None = None
    finished_at_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "offerId": self.offer_id,
            "offerer": self.offerer,
            "transport": self.transport,
            "state": self.state,
            "attempt": self.attempt,
            "takenAtMs": self.taken_at_ms,
            "finishedAtMs": self.finished_at_ms,
            "ok": self.ok,
            "errorKind": self.error_kind,
            "queueReason": None if self.queue_reason is None else str(self.queue_reason),
            "durationMs": self.duration_ms,
        }


@dataclass
class JobLog:
    """The jobs in a worker's hands now, and the last `history` that finished. Bounded: a worker holds one job."""

    history: int = JOB_HISTORY
    active: dict[int, JobRecord] = field(default_factory=dict)
    finished: collections.deque[JobRecord] = field(init=False)

    def __post_init__(self) -> None:
        self.finished = collections.deque(maxlen=self.history)

    def taken(self, job: Job) -> JobRecord:
        offer = job.received.offer
        record = JobRecord(
            offer_id=offer.offer_id.hex(),
            offerer=ed25519_peer_id(offer.offerer),
            transport=job.delivery.transport,
            taken_at_ms=time.time_ns() // 1_000_000,
            attempt=offer.attempt,
        )
        self.active[id(job)] = record
        return record

    def running(self, job: Job) -> None:
        record = self.active.get(id(job))
        if record is not None:
            record.state = "running"

    @staticmethod
    def answered(record: JobRecord, result: ExecResult) -> None:
        record.state = "answered"
        record.ok = result.ok
        record.error_kind = None if result.error_kind is None else str(result.error_kind)
        record.queue_reason = result.queue_reason
        record.duration_ms = result.duration_ms

    def done(self, job: Job, record: JobRecord, *, abandoned: bool = False) -> None:
        self.active.pop(id(job), None)
        if job.cancelled:  # stopped by its offerer's signed cancel (mesh/jobcancel.py): answered `aborted`
            record.state = "cancelled"
        elif record.state in ("claiming", "running"):
            record.state = "abandoned" if abandoned else "not-claimed"
        record.finished_at_ms = time.time_ns() // 1_000_000
        self.finished.appendleft(record)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.active.values()] + [r.to_json() for r in self.finished]


def node_status(node: MeshNode) -> dict[str, Any]:
    """The node's state, as `/status` serves it."""
    stats = node.executor.stats() if node.executor is not None else None
    heard = {h.peer_id: h for h in node.peers.fresh()}
    now = time.monotonic()
    peers = []
    connected = set()
    for conn in node.p2p.connections():
        connected.add(conn.peer_id)
        beat = heard.get(conn.peer_id)
        peers.append(
            {
                "peerId": conn.peer_id,
                "connected": True,
                "direction": conn.direction,
                "relayed": conn.relayed,
                "connectionAddrs": list(conn.addrs),
                "addrs": list(beat.addrs) if beat else [],
                "sandboxMode": beat.sandbox_mode if beat else None,
                "freeSlots": beat.free_slots if beat else None,
                "isolation": list(beat.isolation) if beat else [],
                "runtimes": runtimes_of(beat),
                "heartbeatAgeS": round(now - beat.seen_at, 1) if beat else None,
            }
        )
    for peer_id, beat in heard.items():  # statuses not from a neighbour: an answer to the claim desk, or a former one
        if peer_id in connected:
            continue
        peers.append(
            {
                "peerId": peer_id,
                "connected": False,
                "direction": None,
                "relayed": None,
                "connectionAddrs": [],
                "addrs": list(beat.addrs),
                "sandboxMode": beat.sandbox_mode,
                "freeSlots": beat.free_slots,
                "isolation": list(beat.isolation),
                "runtimes": runtimes_of(beat),
                "heartbeatAgeS": round(now - beat.seen_at, 1),
            }
        )
    healthy, reason = health(node)
    return {
        "peerId": node.peer_id,
        "addrs": node.addrs,
        "sandboxMode": node.gate.reported_mode,
        "isolation": ",".join(node.executor.offered_tiers) if node.executor is not None else None,
        "isolationTiers": sorted(node.isolation_tiers()),
        # The runtimes built here, each with its digest and whole package list, and what one run may have
        # (docs/runtimes.md); heartbeats carry the digests only.
        "runtimes": [info.to_json() for info in (node.executor.built_runtimes.values() if node.executor else ())],
        "resources": caps.to_json()["resources"] if (caps := node.capabilities()) is not None else None,
        "participating": healthy,
        "gate": {
            "ok": node.gate.status.ok,
            "reason": node.gate.status.reason,
            "detail": node.gate.status.detail,
            # Each offered tier's last check and canary (executor/canary.py), withdrawn or not.
            "tiers": {tier: status.to_json() for tier, status in node.gate.tier_status.items()},
        },
        "warnings": warnings(node),
        "reason": reason,
        "runsInFlight": stats.runs_in_flight if stats else 0,
        "maxConcurrent": stats.max_concurrent if stats else 0,
        "poolReady": stats.pool_ready if stats else 0,
        "queueDepth": node.intake.queue_depth,
        "queueSize": node.intake.policy.queue_size,
        # The two classes of mesh/standing.py: what fresh offerers hold of their share, and who is established.
        "queueFresh": len(node.intake.jobs.classes.fresh),
        "freshPlaces": node.intake.policy.fresh_places(),
        "establishedOfferers": len(node.intake.standing),
        "peers": peers,
        # Runners one hop away, as the neighbours report them: whom this node could invite to claim its offers.
        "runnersNear": [{**n.to_wire(), "via": n.via} for n in node.peers.near(exclude=(node.peer_id,))],
        "jobs": node.job_log.to_json(),
        "offersAdmitted": dict(node.intake.admitted),
        "offersRejected": {f"{t}/{r}": n for (t, r), n in node.intake.rejected.items()},
    }


def runtimes_of(beat: Any) -> list[dict[str, str]] | None:
    """A peer's advertised runtimes (name and digest); None when it advertises none (a node from before them)."""
    if beat is None or beat.capabilities is None:
        return None
    return [{"name": n, "digest": d} for n, d in sorted(beat.capabilities.runtimes.items())]


# gVisor on ptrace isolates as well as on systrap, at about 2.25x the cost per syscall (docs/executor.md).
PTRACE_WARNING = (
    "gvisor runs on the ptrace platform (read from the runtime by its canary): about 2.25x the cost per syscall of "
    "systrap; install runsc from bookworm-backports and register it with --platform=systrap (scripts/setup.sh)"
)


def warnings(node: MeshNode) -> list[str]:
    """What the operator should act on although the node works: today, an advertised gVisor tier on ptrace."""
    gvisor = node.gate.tier_status.get("gvisor")
    return [PTRACE_WARNING] if gvisor is not None and gvisor.ok and gvisor.platform == "ptrace" else []


def health(node: MeshNode) -> tuple[bool, str]:
    """(takes part, why): the sandbox gate admits remote work and the node is not shutting down."""
    if node.intake.jobs.closed:
        return False, "shutting_down"
    if not node.gate.participating:
        return False, node.gate.status.reason
    return True, "ready"
