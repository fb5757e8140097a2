"""What every `edgecoder` command shares: exit codes, one-line errors, reading keys, code and input, printing JSON,
and the options several commands take. Light, like mesh/cli.py: click and our own small modules only."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from transports.wire.identity import NodeIdentity


# executor.contract's LANGUAGES and SANDBOXES, written out: importing the contract costs `--help` its dataclasses
# (tests/test_cli_startup.py checks the two stay equal).
LANGUAGES = ("python", "javascript")
SANDBOXES = ("docker", "host")
# executor.backends.TIERS, written out for the same reason.
TIERS = ("runc", "gvisor")

EXIT_REFUSED = 3  # a typed refusal, as opposed to 1 (the run failed) and 2 (usage or bad input)
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it
DEFAULT_STATUS_ADDR = "127.0.0.1:9464"


E = TypeVar("E", bound=BaseException)


def cause_of(exc: BaseException, kinds: tuple[type[E], ...]) -> E | None:
    """The first exception of `kinds` in `exc` or, through Trio's nurseries, anywhere in its exception groups."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = cause_of(inner, kinds)
            if found is not None:
                return found
    return None


class InputError(click.ClickException):
    """Bad input from the user (an address, a file, a value): one line saying what and how to fix it, exit 2."""

    exit_code = 2


class BleUnavailable(click.ClickException):
    """A BLE radio that cannot be used here: its reason and fix, exit 2, before `ready`."""

    exit_code = 2


def ble_hci_spec(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Checks the text of --ble-hci at parse time (exit 2); the radio itself is checked when it is opened."""
    if value is None:
        return None
    from transports.ble.hci import BleSetupError, HciSpec

    try:
        return HciSpec.parse(value).text
    except BleSetupError as exc:
        raise click.BadParameter(str(exc)) from None


# Failures that surface only once a command runs, by the module that defines them: each is bad input (exit 2).
# Looked up in sys.modules, so that checking for them imports nothing a command did not already import.
_INPUT_ERRORS = (
    ("transports.operator_addrs", "AddressError"),
    ("mesh.state", "StateDirError"),
    ("mesh.commands", "OfferTooLarge"),
    ("mesh.metrics_server", "MetricsBindError"),
)


def _loaded(pairs: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    found = []
    for module, name in pairs:
        loaded = sys.modules.get(module)
        if loaded is not None:
            found.append(getattr(loaded, name))
    return tuple(found)


def run_command(afn: Any, options: Any) -> Any:
    """`trio.run(afn, options)`, with the typed failures that surface only once the command runs turned into their
    one-line answers: a busy port, a running twin or a bad address (exit 2), a BLE radio that cannot be used
    (exit 2), an offer too large to send (exit 2), and Ctrl-C (exit 130). Trio may wrap them in exception groups."""
    import trio

    try:
        return trio.run(afn, options)
    except Exception as exc:
        interrupted = _loaded((("mesh.commands", "Interrupted"),))
        if interrupted and cause_of(exc, interrupted) is not None:
            click.echo("interrupted: the node was told to stop the run", err=True)
            sys.exit(EXIT_INTERRUPTED)
        hci = sys.modules.get("transports.ble.hci")  # imported only by BLE commands, so only they can raise it
        if hci is not None and (ble := cause_of(exc, (hci.BleSetupError,))) is not None:
            raise BleUnavailable(f"BLE: {ble}") from None
        cause = cause_of(exc, _loaded(_INPUT_ERRORS))
        if cause is None:
            raise
        raise InputError(str(cause)) from None


ble_hci_option = click.option(
    "--ble-hci",
    "ble_hci",
    default=None,
    metavar="SPEC",
    callback=ble_hci_spec,
    help="BLE through bumble's host stack on this HCI transport: usb:0, hci-socket:0, serial:/dev/ttyACM0, "
    "tcp-client:HOST:PORT (see docs/ble.md).",
)
# Why offering through the OS stack is refused (docs/ble.md, "Offering from a laptop").
OFFER_BLE_UNSUPPORTED = (
    "BLE: `offer --ble` (a GATT server through the OS Bluetooth stack) is not supported. An offering peer keeps a "
    "claim "
    "nonce, framing and a grant per node link, and bless, the GATT-server library for BlueZ, CoreBluetooth and WinRT, "
    "does not say which central wrote (write_request_func(characteristic, value)) and notifies every subscriber at "
    "once (update_value); this machine also has no Bluetooth at all. Fix: offer through bumble with --ble-hci: "
    "hci-socket:0 for a Linux laptop's own controller, usb:0 for a USB dongle on any OS."
)


def load_identity(path: Path) -> NodeIdentity:
    """A key file problem is a message and exit code 2, never a traceback."""
    from transports.wire.identity import KeyFileError, NodeIdentity

    try:
        return NodeIdentity.load(path)
    except KeyFileError as exc:
        raise click.UsageError(str(exc)) from None


def emit(obj: dict[str, Any]) -> None:
    click.echo(json.dumps(obj, separators=(",", ":")))
    sys.stdout.flush()


def parse_input(text: str | None) -> Any:
    """`--input`: JSON the program reads on stdin, as deep as an offer may carry (and never a crash)."""
    if text is None:
        return None
    from transports.wire.codec import MAX_DEPTH, check_json_data
    from transports.wire.jsontext import JsonError, parse_json
    from transports.wire.reasons import Rejected

    try:
        value = parse_json(text, max_depth=MAX_DEPTH + 1)
        check_json_data(value, "--input")
    except JsonError as exc:
        raise click.BadParameter(f"--input is not JSON an offer can carry: {exc}") from None
    except Rejected as exc:
        raise click.BadParameter(exc.rejection.detail) from None
    return value


def read_code(path: Path, max_bytes: int) -> str:
    """The program text, its size checked before a byte is read: a 100 MB file is refused at once."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}") from None
    if size > max_bytes:
        raise click.BadParameter(f"{path} is {size:,} bytes; the limit is {max_bytes:,}")
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # the file may have grown since the stat
        if len(data) > max_bytes:
            raise click.BadParameter(f"{path} is more than {max_bytes:,} bytes")
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror}") from None


language_option = click.option("--language", type=click.Choice(LANGUAGES), required=True)
code_option = click.option("--code-file", type=click.Path(dir_okay=False, path_type=Path), required=True)
input_option = click.option("--input", "input_json", default=None, help="JSON data for the program's stdin.")
timeout_option = click.option("--timeout-ms", type=click.IntRange(1), default=5_000, show_default=True)
memory_option = click.option("--memory-mb", type=click.IntRange(1), default=128, show_default=True)
sandbox_option = click.option("--sandbox", type=click.Choice(SANDBOXES), default="docker", show_default=True)
config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=True, path_type=Path),
    default=None,
    metavar="PATH",
    help="Read settings from this edgecoder.toml (also EDGECODER_CONFIG). Flags win over variables, variables over "
    "the file.",
)
