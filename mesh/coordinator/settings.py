"""The coordinator service's settings: one `Setting` row each, as the node's are (mesh/config.py), so that
`edgecoder coordinator` builds its options from this table (mesh/cli_settings.py) and reads each value from its flag,
then its `EDGECODER_COORDINATOR_*` variable, then the default. docs/reference/config.md lists them.

Light, like mesh/config.py: `edgecoder --help` lists the coordinator group, which builds its options from these rows.
"""

import math

from mesh.config_kinds import FloatRange, IntRange, ListOf, PathKind, Setting, Text, host_port, peer_id_text


def _listen(text: str) -> str:
    try:
        host_port(text)
    except ValueError:
        raise ValueError(f"expected HOST:PORT, got {text!r}") from None
    return text


# The counts have no bound of their own: this one only keeps them within what SQLite and Python agree on.
MAX_COUNT = 2**31 - 1

COORDINATOR_SETTINGS: tuple[Setting, ...] = (
    Setting("coordinator.db", PathKind(), None, "SQLite state file (to serve).", "--db", unset="required to serve"),
    Setting(
        "coordinator.listen",
        Text("HOST:PORT", _listen),
        None,
        "HOST:PORT to serve on; port 0 picks a free one.",
        "--listen",
        unset="required to serve",
    ),
    Setting(
        "coordinator.key_file",
        PathKind(),
        None,
        "The coordinator's identity: /pull responses are signed with it, so agents can pin it (--coordinator-key).",
        "--key",
        unset="unsigned /pull responses",
    ),
    Setting(
        "coordinator.lease_s",
        FloatRange(0.1, math.inf, "s"),
        30.0,
        "Seconds of agent silence before its claims are requeued.",
        "--lease",
    ),
    Setting(
        "coordinator.heartbeat_s",
        FloatRange(0.05, math.inf, "s"),
        None,
        "Heartbeat interval agents are told to use.",
        "--heartbeat",
        unset="lease / 3",
    ),
    Setting(
        "coordinator.rate", FloatRange(0.001, math.inf, "requests/s"), 5.0, "Requests per second per agent.", "--rate"
    ),
    Setting("coordinator.burst", IntRange(1, MAX_COUNT), 20, "Token bucket size per agent.", "--burst"),
    Setting(
        "coordinator.max_lapses", IntRange(1, MAX_COUNT), 3, "Leases a task may lose before it fails.", "--max-lapses"
    ),
    Setting(
        "coordinator.offer_skew_s",
        FloatRange(0, math.inf, "s"),
        30.0,
        "Clock skew allowed when checking an offer's issuedAt and expiresAt.",
        "--offer-skew",
    ),
    Setting(
        "coordinator.retention_s",
        FloatRange(0, math.inf, "s"),
        24 * 3600.0,
        "Seconds a finished task stays readable before it is deleted.",
        "--retention",
    ),
    Setting(
        "coordinator.max_queued",
        IntRange(1, MAX_COUNT),
        10_000,
        "Unfinished tasks held in all; past it, enqueue answers 503 busy.",
        "--max-queued",
    ),
    Setting(
        "coordinator.max_queued_per_offerer",
        IntRange(1, MAX_COUNT),
        1_000,
        "Unfinished tasks held for one offerer.",
        "--max-queued-per-offerer",
    ),
    Setting(
        "coordinator.max_agents",
        IntRange(1, MAX_COUNT),
        10_000,
        "Agents known at once; long-silent agents without a claim are forgotten.",
        "--max-agents",
    ),
    Setting(
        "coordinator.trusted_offerers",
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", peer_id_text)),
        (),
        "Offerers whose tasks go first from the start; others earn it by being served.",
        "--trusted-offerer",
    ),
    Setting(
        "coordinator.established_after_s",
        FloatRange(0, math.inf, "s"),
        600.0,
        "Seconds over which an offerer's tasks must have been done here before its tasks go first.",
        "--established-after",
    ),
    Setting(
        "coordinator.fresh_share",
        FloatRange(0.01, 1.0, "of the queue"),
        0.5,
        "Part of --max-queued that offerers not yet established may hold, together.",
        "--fresh-share",
    ),
    Setting(
        "coordinator.fresh_offer_rate",
        FloatRange(0.001, math.inf, "offers/s"),
        20.0,
        "Offers a second from offerers not yet established, all of them together (a burst of five seconds' worth).",
        "--fresh-offer-rate",
    ),
    Setting(
        "coordinator.new_agent_rate",
        FloatRange(0.001, math.inf, "agents/s"),
        2.0,
        "New agents registered a second, all of them together (a burst of ten seconds' worth).",
        "--new-agent-rate",
    ),
    Setting(
        "coordinator.max_body_mib",
        FloatRange(1, math.inf, "MiB"),
        16.0,
        "MiB of request bodies held in memory at once; past it, 503 busy.",
        "--max-body-mib",
    ),
    Setting(
        "coordinator.max_queued_mib",
        FloatRange(1, math.inf, "MiB"),
        256.0,
        "MiB of offers in unfinished tasks; past it, enqueue answers 503 busy.",
        "--max-queued-mib",
    ),
)
