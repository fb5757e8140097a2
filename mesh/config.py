"""The node's settings: flags, then `EDGECODER_*` variables, then `edgecoder.toml`, then the defaults.

Every operator setting is one `Setting` row in `SETTINGS`: its key in the file (`section.name`), its environment
variable, its flag, its kind and its default. The `node` and `config show` commands build their options from the
same rows, so a setting cannot exist in one place and not another, and `docs/config.md` lists them all.

A value is checked where it is read and refused with the key, where it came from and what it must be: never clamped.
Relative paths in a file are relative to the file's directory, so a unit file can point at `/etc/edgecoder/...`.

The file is found through `--config PATH` or `EDGECODER_CONFIG`; without either no file is read. Nothing reads
`.env` files: under systemd, `EnvironmentFile=` does that job, and everywhere else the TOML file does.

This module imports nothing heavy at module level, and defines no dataclass (each costs a millisecond to create, and
`edgecoder --help` builds its options from this table); checks that need libp2p (multiaddrs, PeerIDs) import it
when a value of that kind is present.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from mesh.config_kinds import (
    Auto,
    Bool,
    Choice,
    ConfigError,
    FloatRange,
    IntRange,
    ListOf,
    PathKind,
    Setting,
    Source,
    Text,
    announce_addr,
    coordinator_url,
    host_port,
    host_port_text,
    listen_addr,
    peer_addr,
    peer_id_text,
    public_key_text,
)
from mesh.config_resolve import CONFIG_ENV, Resolved, resolve_table

# Where the settings machinery lives now; importers of mesh.config keep their names.
__all__ = [
    "BY_KEY",
    "CONFIG_ENV",
    "SETTINGS",
    "Auto",
    "Bool",
    "Choice",
    "ConfigError",
    "FloatRange",
    "IntRange",
    "ListOf",
    "NodeSettings",
    "PathKind",
    "Resolved",
    "Setting",
    "Source",
    "Text",
    "coordinator_url",
    "host_port",
    "node_settings",
    "public_key_text",
    "resolve",
    "shown",
]


def _languages() -> tuple[str, ...]:
    from executor.contract import LANGUAGES

    return tuple(LANGUAGES)


SWARM = "Takes effect once the swarm work of issue 12 lands"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "node.key",
        PathKind(),
        None,
        "The node's key file (`edgecoder keygen`); required.",
        "--key",
        unset="required by `node`",
    ),
    Setting(
        "node.listen",
        ListOf(Text("/ip4/ADDR/tcp/PORT or /ip6/ADDR/tcp/PORT", listen_addr)),
        ("/ip4/127.0.0.1/tcp/0",),
        "Addresses to listen on.",
        "--listen",
    ),
    Setting(
        "node.announce",
        ListOf(Text("a multiaddr", announce_addr)),
        (),
        "Addresses to announce instead of the listen addresses.",
        "--announce",
        pending=SWARM,
    ),
    Setting(
        "node.bootstrap",
        ListOf(Text("/ip4/ADDR/tcp/PORT/p2p/PEERID", peer_addr)),
        (),
        "Peers to join the swarm through; dialled at start and kept connected.",
        "--bootstrap",
    ),
    Setting(
        "node.mdns",
        Auto(),
        None,
        "mDNS on the LAN; auto: on when listening beyond loopback.",
        "--mdns/--no-mdns",
        pending=SWARM,
        unset="auto",
    ),
    Setting(
        "node.relay_service",
        Bool(),
        False,
        "Serve as a circuit relay v2 for other peers.",
        "--relay-service",
        pending=SWARM,
    ),
    Setting(
        "node.state_dir",
        PathKind(),
        None,
        "Lock and replay journal; default $XDG_STATE_HOME/edgecoder or ~/.local/state/edgecoder.",
        "--state-dir",
        unset="$XDG_STATE_HOME/edgecoder or ~/.local/state/edgecoder",
    ),
    Setting(
        "node.heartbeat_interval_s",
        FloatRange(1, 300, "seconds"),
        30.0,
        "Seconds between status refreshes to each neighbour; changes are pushed at once (docs/operator.md).",
        "--heartbeat-interval",
    ),
    Setting(
        "node.sandbox_mode",
        Choice(("docker", "none")),
        "docker",
        "docker: remote work runs only in the sandbox; none: take no remote work at all.",
        "--sandbox-mode",
        env=("EDGECODER_SANDBOX_MODE", "SANDBOX_MODE"),
    ),
    Setting("node.ble", Bool(), False, "Also take offers from nearby BLE peers (BlueZ through bleak).", "--ble"),
    Setting(
        "node.ble_hci",
        Text("an HCI spec: usb:0, hci-socket:0, serial:/dev/ttyACM0"),
        None,
        "BLE through bumble on this HCI transport (docs/ble.md).",
        "--ble-hci",
        unset="no HCI radio",
    ),
    Setting(
        "executor.isolation",
        Choice(("runc", "gvisor", "runc,gvisor")),
        "runc",
        "The isolation tiers offered: runc (hardened Docker), gvisor (Docker with runsc: a second kernel between "
        "the program and the host's), or runc,gvisor (each run on the weakest that meets its minimum).",
        "--isolation",
    ),
    Setting(
        "executor.concurrency", IntRange(1, 64), 2, "Sandbox runs at once (the executor's slots).", "--concurrency"
    ),
    Setting("executor.pool_size", IntRange(0, 64), 2, "Warm containers kept ready.", "--pool-size"),
    Setting(
        "executor.image", Text("a Docker image tag"), "edgecoder-sandbox:bookworm", "The sandbox image.", "--image"
    ),
    Setting(
        "executor.runtimes",
        ListOf(Text("NAME (python, python-science) or NAME=DEBIAN-PACKAGE ...", lambda t: _runtime(t))),
        ("python", "python-science"),
        "The runtimes offered (docs/runtimes.md): python is the image above; python-science adds numpy, scipy, "
        "pandas, scikit-learn, sympy and networkx; NAME=PKG PKG ... declares one of Debian packages.",
        "--runtime",
    ),
    Setting(
        "executor.seccomp_profile",
        PathKind(),
        None,
        "A seccomp profile (JSON) for every sandbox container, instead of the shipped one.",
        "--seccomp-profile",
        env=("EDGECODER_SECCOMP_PROFILE", "SANDBOX_SECCOMP_PROFILE"),
        unset="the shipped profile, executor/seccomp.json (Docker's default, tightened)",
    ),
    Setting(
        "executor.subset_check",
        Bool(),
        True,
        "The subset check on remote offers (hygiene, not a boundary).",
        "--subset-check/--no-subset-check",
    ),
    Setting(
        "limits.max_timeout_ms",
        IntRange(1, 3_600_000),
        30_000,
        "The longest run an offer may ask for, in ms.",
        "--max-timeout-ms",
    ),
    Setting(
        "limits.max_memory_mb",
        IntRange(32, 65_536),
        512,
        "The most memory an offer may ask for, in MiB.",
        "--max-memory-mb",
    ),
    Setting(
        "limits.max_cpus",
        FloatRange(0.01, 256, "CPUs"),
        1.0,
        "The most CPU an offer may ask for, in CPUs.",
        "--max-cpus",
    ),
    Setting(
        "intake.queue_size", IntRange(1, 100_000), 32, "Admitted offers waiting for a slot, in all.", "--queue-size"
    ),
    Setting(
        "intake.queue_per_offerer",
        IntRange(1, 100_000),
        None,
        "Offers one offerer may have unfinished here (queued or running); default twice executor.concurrency.",
        "--queue-per-offerer",
        unset="twice executor.concurrency",
    ),
    Setting(
        "intake.rate_per_offerer",
        FloatRange(0.01, 10_000, "offers/s"),
        5.0,
        "Offers a second one offerer may send, sustained.",
        "--rate-per-offerer",
    ),
    Setting(
        "intake.burst_per_offerer",
        FloatRange(1, 100_000, "offers"),
        20.0,
        "Offers one offerer may send at once.",
        "--burst-per-offerer",
    ),
    Setting(
        "intake.languages",
        ListOf(Text("python or javascript", lambda t: _language(t))),
        None,
        "Languages this node runs; default all.",
        "--language",
        unset="every language",
    ),
    Setting(
        "intake.allow_offerers",
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", peer_id_text)),
        None,
        "Take work only from these PeerIDs; default anyone.",
        "--allow-offerer",
        unset="anyone not denied",
    ),
    Setting(
        "intake.trusted_offerers",
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", peer_id_text)),
        (),
        "Offerers served as established from their first offer, beside those this node has served before.",
        "--trusted-offerer",
    ),
    Setting(
        "intake.fresh_share",
        FloatRange(0.01, 1.0, "of the queue and workers"),
        0.5,
        "The part of the queue and of the workers that offerers this node has never served may take, together.",
        "--fresh-share",
    ),
    Setting(
        "intake.established_after_s",
        FloatRange(0, 30 * 24 * 3600, "s"),
        600.0,
        "An offerer this node has served over this long is established: it keeps its share when new keys flood.",
        "--established-after",
    ),
    Setting(
        "intake.deny_offerers",
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", peer_id_text)),
        (),
        "Never take work from these PeerIDs (wins over the allow list).",
        "--deny-offerer",
    ),
    Setting(
        "metrics.bind",
        Text("HOST:PORT", host_port_text),
        None,
        "Serve /metrics, /status and /healthz here; port 0 picks one. Default: not served.",
        "--metrics",
        unset="not served",
    ),
    Setting(
        "log.level", Choice(("debug", "info", "warning", "error")), "info", "The lowest level logged.", "--log-level"
    ),
    Setting(
        "log.format",
        Choice(("console", "json")),
        "console",
        "console (for people) or json (one object a line).",
        "--log-format",
    ),
    Setting(
        "coordinator.url",
        Text("an http(s) URL", coordinator_url),
        None,
        "Also pull work from the coordinator at this URL.",
        "--coordinator",
        unset="no coordinator",
    ),
    Setting(
        "coordinator.key",
        Text("64 hex digits or a PeerID", public_key_text),
        None,
        "Pin the coordinator: its /pull answers must be signed by this key.",
        "--coordinator-key",
        unset="not pinned",
    ),
)

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def _runtime(text: str) -> str:
    """The declaration's text, once it parses (node_settings makes the runtimes)."""
    from executor.runtimes import parse_runtime

    parse_runtime(text)
    return text.strip()


def _language(text: str) -> str:
    value = text.strip().lower()
    if value not in _languages():
        raise ValueError(f"{text!r} is not one of {', '.join(_languages())}")
    return value


def resolve(
    flags: Mapping[str, Any] | None = None,
    *,
    config: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """The node's effective settings (`resolve_table` over `SETTINGS`, checked together). Raises `ConfigError`."""
    return resolve_table(SETTINGS, flags, config=config, environ=environ, check=_check_together)


def _check_together(values: Mapping[str, Any], sources: Mapping[str, Source]) -> None:
    lane, queue = values["intake.queue_per_offerer"], values["intake.queue_size"]
    if lane is not None and lane > queue:
        raise ConfigError(
            f"intake.queue_per_offerer = {lane} (from {sources['intake.queue_per_offerer']}) is more than "
            f"intake.queue_size = {queue} (from {sources['intake.queue_size']}); it must be 1 to {queue}"
        )
    if values["intake.languages"] == ():
        raise ConfigError(f"intake.languages (from {sources['intake.languages']}) is empty; list at least one")


# -- what the settings become -----------------------------------------------------------------------------------


class NodeSettings(NamedTuple):
    """The resolved settings as the node's own types: policies, key sets and addresses."""

    key: Path | None
    listen: tuple[str, ...]
    announce: tuple[str, ...]
    bootstrap: tuple[str, ...]
    mdns: bool | None
    relay_service: bool
    state_dir: Path | None
    heartbeat_interval_s: float
    sandbox_mode: str
    ble: bool
    ble_hci: str | None
    isolation: str
    executor_policy: Any  # executor.policy.ExecutorPolicy
    intake_policy: Any  # mesh.intake.IntakePolicy
    metrics_bind: tuple[str, int] | None
    log_level: str
    log_format: str
    coordinator_url: str | None
    coordinator_key: bytes | None
    resolved: Resolved


def node_settings(resolved: Resolved) -> NodeSettings:
    """Builds the policies. PeerIDs become the public keys the intake compares against."""
    from dataclasses import replace

    from executor.contract import Limits
    from executor.policy import ExecutorPolicy
    from mesh.intake import IntakePolicy
    from transports.wire.identity import public_key_of_peer_id

    v = resolved.values
    from executor.backends import parse_tiers
    from executor.policy import MIN_CPUS
    from executor.runtimes import DEFAULT_RUNTIME, parse_runtime
    from executor.seccomp import PROFILE_PATH

    policy = ExecutorPolicy(
        # The smallest pool limits any ceilings admit, replaced below by the defaults forced into the ceilings.
        pool_limits=Limits(timeout_ms=1, memory_mb=32, cpus=MIN_CPUS),
        image=v["executor.image"],
        max_timeout_ms=v["limits.max_timeout_ms"],
        max_memory_mb=v["limits.max_memory_mb"],
        max_cpus=v["limits.max_cpus"],
        subset_check=v["executor.subset_check"],
        seccomp_profile=str(PROFILE_PATH if v["executor.seccomp_profile"] is None else v["executor.seccomp_profile"]),
        max_concurrent=v["executor.concurrency"],
        pool_size=v["executor.pool_size"],
        isolation=parse_tiers(v["executor.isolation"]),
        runtimes=tuple(r for r in map(parse_runtime, v["executor.runtimes"]) if r.name != DEFAULT_RUNTIME),
    )
    # The warm pool's containers are made with default limits, forced into the operator's ceilings.
    policy = replace(policy, pool_limits=policy.clamp(Limits()))
    allow = v["intake.allow_offerers"]
    languages = v["intake.languages"]
    intake = IntakePolicy(
        languages=frozenset(languages if languages is not None else _languages()),
        allow_offerers=None if allow is None else frozenset(public_key_of_peer_id(p) for p in allow),
        deny_offerers=frozenset(public_key_of_peer_id(p) for p in v["intake.deny_offerers"]),
        rate_per_offerer=v["intake.rate_per_offerer"],
        burst_per_offerer=v["intake.burst_per_offerer"],
        queue_size=v["intake.queue_size"],
        queue_per_offerer=v["intake.queue_per_offerer"],
        trusted_offerers=frozenset(public_key_of_peer_id(p) for p in v["intake.trusted_offerers"]),
        fresh_share=v["intake.fresh_share"],
        established_after_s=v["intake.established_after_s"],
    )
    return NodeSettings(
        key=v["node.key"],
        listen=tuple(v["node.listen"]),
        announce=tuple(v["node.announce"]),
        bootstrap=tuple(v["node.bootstrap"]),
        mdns=v["node.mdns"],
        relay_service=v["node.relay_service"],
        state_dir=v["node.state_dir"],
        heartbeat_interval_s=v["node.heartbeat_interval_s"],
        sandbox_mode=v["node.sandbox_mode"],
        ble=v["node.ble"],
        ble_hci=v["node.ble_hci"],
        isolation=v["executor.isolation"],
        executor_policy=policy,
        intake_policy=intake,
        metrics_bind=None if v["metrics.bind"] is None else host_port(v["metrics.bind"]),
        log_level=v["log.level"],
        log_format=v["log.format"],
        coordinator_url=v["coordinator.url"],
        coordinator_key=v["coordinator.key"],
        resolved=resolved,
    )


def shown(value: Any) -> Any:
    """A value as `config show` prints it (JSON-friendly): paths as text, keys as hex, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return [shown(v) for v in value]
    return value
