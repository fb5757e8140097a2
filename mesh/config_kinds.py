"""How a setting is declared and read: a `Setting` row (its key, kind, default, flag and variables), the kinds that
read a value from text (flags, variables) and from TOML and say what it must be, and the checks of addresses and
keys that need the network stack's parsers (imported only when a value of that kind is present).

The node's table is `mesh.config.SETTINGS`, the coordinator's `mesh.coordinator.settings.COORDINATOR_SETTINGS`;
both are read by `mesh.config_resolve` and turned into options by `mesh.cli_settings`. Like mesh/config.py, this
module imports nothing heavy and defines no dataclass: `edgecoder --help` builds its options from these rows.
"""

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

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
        if self.high == math.inf:
            return f"a number of at least {self.low:g}{unit}"
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


def listen_addr(text: str) -> str:
    from transports.operator_addrs import AddressError, parse_listen_addr

    try:
        parse_listen_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc).removeprefix("--listen ")) from None
    return text


def announce_addr(text: str) -> str:
    from transports.operator_addrs import AddressError, parse_announce_addr

    try:
        return parse_announce_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc).removeprefix("--announce ")) from None


def peer_addr(text: str) -> str:
    from transports.operator_addrs import AddressError, parse_peer_addr

    try:
        parse_peer_addr(text)
    except AddressError as exc:
        raise ValueError(str(exc)) from None
    return text


def peer_id_text(text: str) -> str:
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


def host_port_text(text: str) -> str:
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
