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

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

CONFIG_ENV = "EDGECODER_CONFIG"

SourceKind = Literal["flag", "env", "file", "default"]


class ConfigError(ValueError):
    """A setting that cannot be used: the message names the key, where the value came from, and what it must be."""


class Source(NamedTuple):
    kind: SourceKind
    where: str = ""  # the flag, the variable or the file

    def __str__(self) -> str:
        return f"{self.kind} {self.where}" if self.where else self.kind


# -- kinds: how a value is read from text (flags, variables) and from TOML, and what it must be -----------------


class Kind:
    """One kind of value. `describe` ends every refusal: 'must be <describe>'."""

    def describe(self) -> str:
        raise NotImplementedError

    def from_text(self, text: str) -> Any:
        """A flag's or a variable's text."""
        raise NotImplementedError

    def from_toml(self, value: Any) -> Any:
        """A TOML value, already typed by the parser; strings are accepted where text is the natural form."""
        if isinstance(value, str):
            return self.from_text(value)
        raise ValueError(f"{value!r} is a {_toml_type(value)}")


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "float", str: "string", list: "list", dict: "table"}.get(type(value), "value")


class IntRange(Kind):
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def describe(self) -> str:
        return f"a whole number from {self.low:,} to {self.high:,}".replace(",", "_")

    def check(self, value: int) -> int:
        if not self.low <= value <= self.high:
            raise ValueError(f"{value} is out of range")
        return value

    def from_text(self, text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number") from None
        return self.check(value)

    def from_toml(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            return _wrong(value)  # TOML has numbers: "4" in quotes is a mistake worth naming
        return self.check(value)


class FloatRange(Kind):
    def __init__(self, low: float, high: float, unit: str = "") -> None:
        self.low, self.high, self.unit = low, high, unit

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"a number from {self.low:g} to {self.high:g}{unit}"

    def check(self, value: float) -> float:
        if not math.isfinite(value) or not self.low <= value <= self.high:
            raise ValueError(f"{value:g} is out of range")
        return float(value)

    def from_text(self, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        return self.check(value)

    def from_toml(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _wrong(value)
        return self.check(float(value))


def _wrong(value: Any) -> Any:
    raise ValueError(f"{value!r} is a {_toml_type(value)}")


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class Bool(Kind):
    def describe(self) -> str:
        return "true or false (1/0, yes/no, on/off in a variable)"

    def from_text(self, text: str) -> bool:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a boolean")

    def from_toml(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        return _wrong(value)


class Auto(Kind):
    """true, false or "auto" (None: the node decides)."""

    def describe(self) -> str:
        return 'true, false or "auto"'

    def from_text(self, text: str) -> bool | None:
        if text.strip().lower() == "auto":
            return None
        return Bool().from_text(text)

    def from_toml(self, value: Any) -> bool | None:
        return value if isinstance(value, bool) else super().from_toml(value)


class Choice(Kind):
    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)

    def from_text(self, text: str) -> str:
        value = text.strip().lower()
        if value not in self.choices:
            raise ValueError(f"{text!r} is not a choice")
        return value


class Text(Kind):
    """A non-empty string, checked by `parse` when given (which raises ValueError with its own reason)."""

    def __init__(self, what: str, parse: Callable[[str], Any] | None = None) -> None:
        self.what, self.parse = what, parse

    def describe(self) -> str:
        return self.what

    def from_text(self, text: str) -> Any:
        value = text.strip()
        if not value:
            raise ValueError("it is empty")
        return self.parse(value) if self.parse is not None else value


class PathKind(Kind):
    def describe(self) -> str:
        return "a file system path"

    def from_text(self, text: str) -> Path:
        if not text.strip():
            raise ValueError("it is empty")
        return Path(text.strip()).expanduser()


class ListOf(Kind):
    """A list: a TOML array, repeated flags, or comma-separated text in a variable."""

    def __init__(self, item: Kind) -> None:
        self.item = item

    def describe(self) -> str:
        return f"a list, each {self.item.describe()}"

    def from_text(self, text: str) -> tuple[Any, ...]:
        return self.items([part for part in text.replace("\n", ",").split(",") if part.strip()])

    def items(self, values: Sequence[Any], *, toml: bool = False) -> tuple[Any, ...]:
        out = []
        for position, value in enumerate(values):
            try:
                out.append(self.item.from_toml(value) if toml else self.item.from_text(value))
            except ValueError as exc:
                raise ValueError(f"item {position + 1}: {exc}") from None
        return tuple(dict.fromkeys(out))  # repeated entries count once, in their first place

    def from_toml(self, value: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            return self.from_text(value)
        if not isinstance(value, list):
            return _wrong(value)
        return self.items(value, toml=True)


# -- the checks that need the network stack's parsers ------------------------------------------------------------


def _listen_addr(text: str) -> str:
    from transports.p2p import AddressError, parse_listen_addr

    try:
        parse_listen_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc).removeprefix("--listen ")) from None
    return text


def _announce_addr(text: str) -> str:
    from transports.p2p import AddressError, parse_announce_addr

    try:
        return parse_announce_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc).removeprefix("--announce ")) from None


def _peer_addr(text: str) -> str:
    from transports.p2p import AddressError, parse_peer_addr

    try:
        parse_peer_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc)) from None
    return text


def _peer_id(text: str) -> str:
    """A PeerID that embeds an Ed25519 key: only those can sign offers, so only those can be allowed or denied."""
    from transports.wire.identity import public_key_of_peer_id

    public_key_of_peer_id(text)  # raises ValueError naming what is wrong
    return text


def public_key_text(text: str) -> bytes:
    """A coordinator's public key: 64 hex digits (its ready line's `publicKey`) or its PeerID."""
    value = text.strip()
    if len(value) == 64:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    if value.startswith("12D3KooW"):
        from transports.wire.identity import public_key_of_peer_id

        return public_key_of_peer_id(value)
    raise ValueError(f"{value[:80]!r} is neither 64 hex digits nor an Ed25519 PeerID (12D3KooW...)")


def host_port(text: str) -> tuple[str, int]:
    """HOST:PORT ([v6]:PORT for IPv6); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT with a port from 0 to 65535")
    return host, int(port)


def _host_port_text(text: str) -> str:
    host_port(text)
    return text


def coordinator_url(text: str) -> str:
    """An http(s) URL with a host and nothing after the path: checked at start, so a typo is not found hours later."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises ValueError for a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError(f"{text!r} names no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r} has a query or fragment; give the coordinator's base URL")
    if port == 0:
        raise ValueError(f"{text!r} has port 0")
    return text.rstrip("/")


# -- the settings ----------------------------------------------------------------------------------------------


class Setting(NamedTuple):
    key: str  # `section.name` in edgecoder.toml
    kind: Kind
    default: Any
    help: str
    flag: str | None = None  # the node's option, when it has one
    env: tuple[str, ...] = ()  # overrides the derived `EDGECODER_<NAME>`; the first is the documented one
    pending: str = ""  # "" when the setting takes effect today; else what it waits for
    unset: str = "unset"  # what an unset value (None) means, for `config show` and the docs

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    @property
    def env_names(self) -> tuple[str, ...]:
        if self.env:
            return self.env
        prefix = "" if self.section in ("node", "executor", "intake", "limits") else f"{self.section}_"
        return (f"EDGECODER_{prefix}{self.name}".upper(),)


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
        ListOf(Text("/ip4/ADDR/tcp/PORT or /ip6/ADDR/tcp/PORT", _listen_addr)),
        ("/ip4/127.0.0.1/tcp/0",),
        "Addresses to listen on.",
        "--listen",
    ),
    Setting(
        "node.announce",
        ListOf(Text("a multiaddr", _announce_addr)),
        (),
        "Addresses to announce instead of the listen addresses.",
        "--announce",
        pending=SWARM,
    ),
    Setting(
        "node.bootstrap",
        ListOf(Text("/ip4/ADDR/tcp/PORT/p2p/PEERID", _peer_addr)),
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
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", _peer_id)),
        None,
        "Take work only from these PeerIDs; default anyone.",
        "--allow-offerer",
        unset="anyone not denied",
    ),
    Setting(
        "intake.trusted_offerers",
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", _peer_id)),
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
        ListOf(Text("an Ed25519 PeerID (12D3KooW...)", _peer_id)),
        (),
        "Never take work from these PeerIDs (wins over the allow list).",
        "--deny-offerer",
    ),
    Setting(
        "metrics.bind",
        Text("HOST:PORT", _host_port_text),
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


def _language(text: str) -> str:
    value = text.strip().lower()
    if value not in _languages():
        raise ValueError(f"{text!r} is not one of {', '.join(_languages())}")
    return value


# -- resolution ------------------------------------------------------------------------------------------------


class Resolved:
    """Every setting's effective value and where it came from."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, Source], file: Path | None = None) -> None:
        self.values, self.sources, self.file = values, sources, file

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def rows(self) -> list[tuple[str, Any, Source]]:
        return [(s.key, self.values[s.key], self.sources[s.key]) for s in SETTINGS]


def _refusal(setting: Setting, source: Source, reason: str) -> ConfigError:
    return ConfigError(f"{setting.key} from {source}: {reason}; it must be {setting.kind.describe()}")


def read_file(path: Path, named_by: Source | None = None) -> dict[str, tuple[Any, Source]]:
    """The file's settings as raw TOML values, by key. Unknown keys are refused, with the nearest known one."""
    import tomllib

    source = Source("file", str(path))
    where = f"config file {path}" + (f" (from {named_by})" if named_by is not None else "")
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist: fix --config or {CONFIG_ENV}") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory: give the path of edgecoder.toml") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    found: dict[str, tuple[Any, Source]] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: {section!r} must be a [section]; keys go inside one, e.g. [node] listen = [...]"
            )
        for name, value in table.items():
            key = f"{section}.{name}"
            if key not in BY_KEY:
                import difflib

                near = difflib.get_close_matches(key, BY_KEY, n=1)
                hint = f"; did you mean {near[0]}?" if near else "; see `edgecoder config show` for every key"
                raise ConfigError(f"{path}: unknown setting {key}{hint}")
            found[key] = (value, source)
    return found


def config_path(flag: Path | None, environ: Mapping[str, str]) -> tuple[Path | None, Source | None]:
    if flag is not None:
        return flag, Source("flag", "--config")
    text = environ.get(CONFIG_ENV, "").strip()
    if text:
        return Path(text).expanduser(), Source("env", CONFIG_ENV)
    return None, None


def resolve(
    flags: Mapping[str, Any] | None = None,
    *,
    config: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """The effective settings. `flags` maps keys to values the command line gave (already the kind's value, or text
    to parse); keys it lacks fall through to the environment, the file and the defaults. Raises `ConfigError`."""
    env = os.environ if environ is None else environ
    flags = flags or {}
    path, named_by = config_path(config, env)
    in_file = read_file(path, named_by) if path is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for setting in SETTINGS:
        value, source = _one(setting, flags, env, in_file)
        if isinstance(value, Path) and source.kind == "file" and path is not None and not value.is_absolute():
            value = path.parent / value
        values[setting.key] = value
        sources[setting.key] = source
    _check_together(values, sources)
    return Resolved(values, sources, path)


def _one(
    setting: Setting, flags: Mapping[str, Any], env: Mapping[str, str], in_file: Mapping[str, tuple[Any, Source]]
) -> tuple[Any, Source]:
    if setting.key in flags:
        value, where = flags[setting.key]
        source = Source("flag", where)
        try:
            if isinstance(value, str):
                value = setting.kind.from_text(value)
            elif isinstance(value, tuple | list) and isinstance(setting.kind, ListOf):
                value = setting.kind.items(list(value))
        except ValueError as exc:
            raise _refusal(setting, source, str(exc)) from None
        return value, source
    for name in setting.env_names:
        text = env.get(name)
        if text is not None and text.strip():
            source = Source("env", name)
            try:
                return setting.kind.from_text(text), source
            except ValueError as exc:
                raise _refusal(setting, source, str(exc)) from None
    if setting.key in in_file:
        raw, source = in_file[setting.key]
        try:
            return setting.kind.from_toml(raw), source
        except ValueError as exc:
            raise _refusal(setting, source, str(exc)) from None
    return setting.default, Source("default")


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
