"""`edgecoder`: the command line, the contract that users and tests rely on.

stdout carries only machine-readable lines (the `ready` event, a result as one JSON object) or, for the inspection
commands, what the person asked to see; logs go to stderr.

Start-up is part of the interface: `edgecoder --help` and `keygen` must answer in a few tens of milliseconds, so
this module imports only click and light modules of our own. Trio, structlog, libp2p, Docker, Starlette, Hypercorn
and httpx are imported inside the commands that use them (benchmarks/bench_startup.py measures it, and
tests/test_cli_startup.py pins which modules a bare import pulls in).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mesh.config import SETTINGS, Auto, Bool, ConfigError, ListOf, Setting

if TYPE_CHECKING:
    from mesh.config import Resolved
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
    ("transports.p2p", "AddressError"),
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


_debug = os.environ.get("EDGECODER_DEBUG") == "1"


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    _debug = _debug or value


# Commands built on first use: name -> (module, attribute).
LAZY_COMMANDS = {"coordinator": ("mesh.coordinator.cli", "coordinator")}


class Commands(click.Group):
    """The `edgecoder` group. `coordinator` (a group of its own, with a dozen options) is built only when it is asked
    for or listed (by --help, and by the docs' CLI reference): `keygen` and `node` need not pay for it."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module, name = LAZY_COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_set_debug,
    help="Show the traceback of an unexpected error (also EDGECODER_DEBUG=1).",
)
def main() -> None:
    """A mesh node that runs strangers' signed task offers, only ever inside a hardened Docker sandbox."""


def run(argv: list[str] | None = None) -> None:
    """The `edgecoder` entry point: every failure is one line and an exit code, never a traceback (unless --debug).

    Exit codes: 0 ok, 1 the run failed (or an unexpected error), 2 usage or bad input, 3 a typed refusal,
    130 interrupted (Ctrl-C).
    """
    try:
        code = main.main(args=argv, prog_name="edgecoder", standalone_mode=False)
    except click.UsageError as exc:
        # One line, like every other refusal: click's usage block would push the reason off a small terminal.
        where = exc.ctx.command_path if exc.ctx is not None else "edgecoder"
        message = " ".join(exc.format_message().split())  # click lays some messages out over several lines
        click.echo(f"Error: {message} (see: {where} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if _debug:
            raise
        # What went wrong, not the nursery it went wrong in: Trio wraps a task's failure in exception groups.
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        what = " ".join(f"{type(leaf).__name__}: {leaf}".split())
        click.echo(f"edgecoder: unexpected error: {what} (run with --debug for details)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


@main.command()
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the 32-byte Ed25519 seed (mode 0600).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing key file.")
def keygen(out: Path, force: bool) -> None:
    """Write a new node identity and print its PeerID."""
    from transports.wire.identity import KeyFileError, NodeIdentity
    from transports.wire.peerid import ed25519_peer_id

    identity = NodeIdentity.generate()
    try:
        identity.save(out, force=force)
    except KeyFileError as exc:
        raise InputError(str(exc)) from None
    click.echo(ed25519_peer_id(identity.public_key))


# -- settings as options ---------------------------------------------------------------------------------------


def _param_name(setting: Setting) -> str:
    return "setting__" + setting.key.replace(".", "__")


def _option_help(setting: Setting) -> str:
    text = setting.help
    if setting.pending:
        text += f" {setting.pending}."
    return f"{text} [{setting.key}, {setting.env_names[0]}]"


def _metavar(setting: Setting) -> str:
    from mesh.config import Choice, FloatRange, IntRange, PathKind

    kind = setting.kind.item if isinstance(setting.kind, ListOf) else setting.kind
    named = {
        "node.state_dir": "DIR",
        "metrics.bind": "HOST:PORT",
        "coordinator.url": "URL",
        "coordinator.key": "KEY",
        "executor.image": "TAG",
    }
    if setting.key in named:
        return named[setting.key]
    if isinstance(kind, Choice):
        return "[" + "|".join(kind.choices) + "]"
    if isinstance(kind, IntRange):
        return "N"
    if isinstance(kind, FloatRange):
        return "X"
    if isinstance(kind, PathKind):
        return "PATH"
    if setting.key in ("intake.allow_offerers", "intake.deny_offerers", "intake.trusted_offerers"):
        return "PEERID"
    if setting.key == "intake.languages":
        return "LANGUAGE"
    if setting.key == "node.ble_hci":
        return "SPEC"
    return "MULTIADDR"


def _setting_option(setting: Setting) -> Any:
    assert setting.flag is not None
    name = _param_name(setting)
    flags = setting.flag.split("/")
    help_text = _option_help(setting)
    if isinstance(setting.kind, Auto | Bool) and len(flags) == 2:
        return click.option(setting.flag, name, default=None, help=help_text)
    if isinstance(setting.kind, Bool):
        return click.option(flags[0], name, is_flag=True, default=False, help=help_text)
    decls = [flags[0], "--peer"] if setting.key == "node.bootstrap" else [flags[0]]
    if isinstance(setting.kind, ListOf):
        return click.option(*decls, name, multiple=True, metavar=_metavar(setting), help=help_text + " Repeatable.")
    return click.option(*decls, name, default=None, metavar=_metavar(setting), help=help_text)


def setting_options(fn: Any) -> Any:
    """Every setting that has a flag, as an option; `--metrics-port N` and `--log-json` are shorthands."""
    fn = click.option(
        "--log-json", "log_json", is_flag=True, help="Shorthand for --log-format json (structured logs on stderr)."
    )(fn)
    fn = click.option(
        "--metrics-port",
        "metrics_port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Shorthand for --metrics 127.0.0.1:PORT; 0 picks a free port (the ready line gives it).",
    )(fn)
    for setting in reversed(SETTINGS):
        if setting.flag is not None:
            fn = _setting_option(setting)(fn)
    return config_option(fn)


def resolve_settings(ctx: click.Context, params: dict[str, Any]) -> Resolved:
    """Flags the user typed (not click's defaults), then the environment, the file and the defaults."""
    from click.core import ParameterSource

    from mesh.config import resolve

    flags: dict[str, tuple[Any, str]] = {}
    for setting in SETTINGS:
        if setting.flag is None:
            continue
        name = _param_name(setting)
        if ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            continue
        value = params[name]
        if isinstance(value, tuple) and not value:
            continue
        flags[setting.key] = (value, _flag_shown(setting, value))
    if params.get("metrics_port") is not None:
        if "metrics.bind" in flags:
            raise click.UsageError("--metrics and --metrics-port name the same setting: give one of them")
        flags["metrics.bind"] = (f"127.0.0.1:{params['metrics_port']}", "--metrics-port")
    if params.get("log_json"):
        flags["log.format"] = ("json", "--log-json")
    try:
        return resolve(flags, config=params.get("config_file"))
    except ConfigError as exc:
        raise InputError(str(exc)) from None


def _flag_shown(setting: Setting, value: Any) -> str:
    assert setting.flag is not None
    flags = setting.flag.split("/")
    if isinstance(setting.kind, Auto | Bool) and len(flags) == 2:
        return flags[0] if value else flags[1]
    return flags[0]


@main.command(context_settings={"show_default": False})
@setting_options
@click.option("--ble-sim", is_flag=True, help="BLE on a simulated radio in this process (implies --ble).")
@click.pass_context
def node(ctx: click.Context, ble_sim: bool, **params: Any) -> None:
    """Run a node. Its first stdout line is the `ready` event as JSON.

    Every setting can also come from EDGECODER_* variables or edgecoder.toml (`edgecoder config show` prints what
    is in effect and where each value came from)."""
    from mesh import logs
    from mesh.config import node_settings
    from mesh.state import default_state_root

    resolved = resolve_settings(ctx, params)
    try:
        settings = node_settings(resolved)
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    logs.configure(json_lines=settings.log_format == "json", level_name=settings.log_level)
    if settings.key is None:
        raise InputError(
            "no key file: give --key PATH (or EDGECODER_KEY, or key in [node] of edgecoder.toml); "
            "make one with: edgecoder keygen --out node.key"
        )
    if settings.ble_hci is not None:
        from transports.ble.hci import BleSetupError, HciSpec

        try:
            HciSpec.parse(settings.ble_hci)
        except BleSetupError as exc:
            raise InputError(f"node.ble_hci from {resolved.sources['node.ble_hci']}: {exc}") from None
        if ble_sim:
            raise click.UsageError("--ble-hci and --ble-sim name two different radios: give one of them")
    if settings.key.is_dir():
        raise InputError(
            f"node.key from {resolved.sources['node.key']}: {settings.key} is a directory; give the key file "
            "(make one with: edgecoder keygen --out node.key)"
        )
    identity = load_identity(settings.key)
    from mesh.commands import NodeOptions, run_node

    options = NodeOptions(
        identity=identity,
        settings=settings,
        ble_sim=ble_sim,
        state_root=settings.state_dir or default_state_root(),
    )
    run_command(run_node, options)


@main.group()
def config() -> None:
    """The node's settings: edgecoder.toml, EDGECODER_* variables and flags."""


@config.command("show")
@setting_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_context
def config_show(ctx: click.Context, as_json: bool, **params: Any) -> None:
    """Print the effective settings and where each came from (flag, env, file or default).

    Takes the same options as `edgecoder node`, so `edgecoder config show --concurrency 4` shows what that node
    would run with. Values are checked as the node checks them: a bad one is refused the same way."""
    from mesh.config import node_settings, shown

    resolved = resolve_settings(ctx, params)
    try:
        node_settings(resolved)
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    rows = resolved.rows()
    if as_json:
        emit(
            {
                "file": None if resolved.file is None else str(resolved.file),
                "settings": [
                    {"key": key, "value": shown(value), "source": source.kind, "from": source.where}
                    for key, value, source in rows
                ],
            }
        )
        return
    click.echo(f"config file: {resolved.file or 'none (give --config PATH or EDGECODER_CONFIG)'}")
    from mesh.config import BY_KEY

    texts = [json.dumps(shown(value)) if value is not None else f"({BY_KEY[key].unset})" for key, value, _ in rows]
    width = max(len(key) for key, _, _ in rows) + 2
    value_width = min(60, max(len(t) for t in texts))
    for (key, _, source), text in zip(rows, texts, strict=True):  # a value wider than its column still gets a gap
        click.echo(f"{key:<{width}}{text:<{value_width}}  {source}")


# -- inspection: status, peers, jobs ---------------------------------------------------------------------------


def _status_address(metrics: str | None, config_file: Path | None) -> str:
    if metrics is not None:
        return metrics
    from mesh.config import resolve

    try:
        bind = resolve({}, config=config_file)["metrics.bind"]
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    return bind or DEFAULT_STATUS_ADDR


def fetch_status(metrics: str | None, config_file: Path | None) -> dict[str, Any]:
    """The node's /status, or a one-line reason no node answered (exit 1)."""
    import urllib.error
    import urllib.request

    from mesh.config import host_port

    address = _status_address(metrics, config_file)
    try:
        host, port = host_port(address)
    except ValueError as exc:
        raise InputError(f"--metrics: {exc}") from None
    if port == 0:
        raise InputError(
            f"metrics.bind is {address}: port 0 is picked at start; give --metrics HOST:PORT with the port "
            "from the node's ready line (metricsPort)"
        )
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/status"
    hint = "is `edgecoder node` running with --metrics-port (metrics.bind)? Give its address with --metrics HOST:PORT"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read(4 << 20)
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{url} answered {exc.code}: not an edgecoder node's status; {hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(f"no node answers at {url} ({reason}); {hint}") from None
    try:
        status = json.loads(body)
    except ValueError:
        raise click.ClickException(f"{url} did not answer JSON: not an edgecoder node's status; {hint}") from None
    if not isinstance(status, dict) or "peerId" not in status:
        raise click.ClickException(f"{url} answered JSON without a peerId: not an edgecoder node's status")
    return status


inspect_options = [
    click.option(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help=f"Where the node serves /status [default: metrics.bind from the config, else {DEFAULT_STATUS_ADDR}].",
    ),
    config_option,
    click.option("--json", "as_json", is_flag=True, help="The JSON as the node served it."),
]


def _inspect(fn: Any) -> Any:
    for option in reversed(inspect_options):
        fn = option(fn)
    return fn


@main.command()
@_inspect
def status(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """What a running node is doing: its PeerID, addresses, sandbox, runs, queue, peers and jobs."""
    from mesh.inspect import format_status

    report = fetch_status(metrics, config_file)
    if as_json:
        emit(report)
    else:
        click.echo(format_status(report))


@main.command()
@_inspect
def peers(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """The peers a running node is connected to, or hears heartbeats from."""
    from mesh.inspect import format_peers

    report = fetch_status(metrics, config_file)
    if as_json:
        emit({"peerId": report["peerId"], "peers": report.get("peers", [])})
    else:
        click.echo(format_peers(report))


@main.command()
@_inspect
def jobs(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """The offers a running node is working on, and the last ones it answered."""
    from mesh.inspect import format_jobs

    report = fetch_status(metrics, config_file)
    if as_json:
        emit({"peerId": report["peerId"], "queueDepth": report.get("queueDepth"), "jobs": report.get("jobs", [])})
    else:
        click.echo(format_jobs(report))


# -- work ------------------------------------------------------------------------------------------------------


@main.command()
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--to", "to", default=None, help="Send directly to the node at this multiaddr.")
@click.option("--gossip", is_flag=True, help="Publish on the offers topic; one node claims and runs it.")
@click.option("--peer", "peers", multiple=True, help="With --gossip: a mesh node to connect to (repeatable).")
@ble_hci_option
@click.option("--ble", "ble_os", is_flag=True, help="Offer through the OS Bluetooth stack: not supported (exit 2).")
@click.option(
    "--ble-link-model",
    type=click.Choice(["ios", "android", "linux"]),
    default=None,
    help="With --ble-hci on virtual controllers: pace the radio as this platform's link would (docs/ble.md).",
)
@language_option
@code_option
@input_option
@timeout_option
@memory_option
@sandbox_option
@click.option("--wait-s", type=click.FloatRange(0.1, 3600), default=30.0, show_default=True, help="How long to wait.")
@click.option(
    "--replicas",
    type=click.IntRange(1, 4),
    default=1,
    show_default=True,
    help="With --gossip: this many distinct runners each run it; the result counts only if they all agree.",
)
@click.option(
    "--min-isolation",
    type=click.Choice(["runc", "gvisor"]),
    default=None,
    help="Run only on a node whose sandbox is at least this tier (gvisor: a user-space kernel in between).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Logs on stderr; info shows each connect (a BLE link, say) while the offer waits.",
)
def offer(
    key: Path,
    to: str | None,
    gossip: bool,
    peers: tuple[str, ...],
    ble_hci: str | None,
    ble_os: bool,
    ble_link_model: str | None,
    language: str,
    code_file: Path,
    input_json: str | None,
    timeout_ms: int,
    memory_mb: int,
    sandbox: str,
    wait_s: float,
    replicas: int,
    min_isolation: str | None,
    log_level: str,
) -> None:
    """Sign an offer, send it, and print the verified result (exit 0 only when ok)."""
    from executor.contract import Limits
    from mesh import logs
    from mesh.commands import OfferOptions, run_offer
    from transports.p2p import AddressError, parse_peer_addr
    from transports.wire.offers import MAX_CODE_CHARS

    if ble_os:
        raise BleUnavailable(OFFER_BLE_UNSUPPORTED)
    if [to is not None, gossip, ble_hci is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --to MULTIADDR, --gossip --peer MULTIADDR or --ble-hci SPEC")
    if ble_link_model is not None and ble_hci is None:
        raise click.UsageError("--ble-link-model paces a --ble-hci radio: give --ble-hci too")
    if gossip and not peers:
        raise click.UsageError("--gossip needs at least one --peer")
    if peers and not gossip:
        raise click.UsageError("--peer is for --gossip (with --to, the address already names the node)")
    if replicas > 1 and not gossip:
        raise click.UsageError("--replicas is for --gossip (a direct offer names one node)")
    identity = load_identity(key)
    try:
        for addr in [*peers, *([to] if to else [])]:
            parse_peer_addr(addr)
    except AddressError as exc:
        raise InputError(str(exc)) from None
    code = read_code(code_file, MAX_CODE_CHARS * 4)
    if len(code) > MAX_CODE_CHARS:
        raise InputError(f"{code_file} holds {len(code):,} characters; an offer carries at most {MAX_CODE_CHARS:,}")
    logs.configure(level_name=log_level)  # by default the offer's progress is its result line; connects are noise
    options = OfferOptions(
        identity=identity,
        to=to,
        peers=list(peers),
        language=language,
        code=code,
        input=parse_input(input_json),
        limits=Limits(timeout_ms=timeout_ms, memory_mb=memory_mb),
        sandbox=sandbox,
        wait_s=wait_s,
        ble_hci=ble_hci,
        ble_link_model=ble_link_model,
        min_isolation=min_isolation,
        replicas=replicas,
    )
    outcome = run_command(run_offer, options)
    if outcome.refusal is not None:
        # A refusal the seed defines as a run result (a host request, no sandbox, no room) prints that result too.
        shape = outcome.refusal.result.to_json() if outcome.refusal.result is not None else {"ok": False}
        refused: dict[str, Any] = {**shape, "refusal": str(outcome.refusal.reason), "detail": outcome.refusal.detail}
        if outcome.refusal.retry_after_ms is not None:  # refused for want of room: when the node will look again
            refused["retryAfterMs"] = outcome.refusal.retry_after_ms
        emit(refused)
        sys.exit(EXIT_REFUSED)
    assert outcome.result is not None
    from transports.wire.peerid import ed25519_peer_id

    shown = {**outcome.result.to_json(), "executorPeerId": ed25519_peer_id(outcome.result.executor)}
    if replicas > 1:
        shown["replicaPeerIds"] = [ed25519_peer_id(r.executor) for r in outcome.replicas]
    emit(shown)
    sys.exit(0 if outcome.ok else 1)


@main.command(name="exec")
@code_option
@language_option
@sandbox_option
@timeout_option
@memory_option
@input_option
@click.option("--no-subset", is_flag=True, help="Skip the subset check (hygiene; the container is the boundary).")
@click.option(
    "--isolation",
    type=click.Choice(TIERS),
    default=None,
    help="The container runtime of the run: runc (hardened Docker) or gvisor (Docker with runsc) "
    "[default: EDGECODER_ISOLATION, else runc].",
)
def exec_(
    code_file: Path,
    language: str,
    sandbox: str,
    timeout_ms: int,
    memory_mb: int,
    input_json: str | None,
    no_subset: bool,
    isolation: str | None,
) -> None:
    """Run code as the local user (origin local: --sandbox host is allowed). Prints the result JSON."""
    import trio

    from executor.contract import Limits
    from executor.policy import ExecutorPolicy
    from mesh.commands import run_local

    if isolation is not None and sandbox == "host":
        raise click.UsageError("--isolation picks the container runtime; --sandbox host runs no container")
    try:
        policy = ExecutorPolicy.from_env()
    except ValueError as exc:  # EDGECODER_ISOLATION (or another variable) names nothing the executor knows
        raise InputError(str(exc)) from None
    result = trio.run(
        run_local,
        language,
        read_code(code_file, policy.max_code_bytes),
        parse_input(input_json),
        Limits(timeout_ms=timeout_ms, memory_mb=memory_mb),
        sandbox,
        not no_subset,
        isolation,
    )
    emit(result.to_json())
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@config_option
def doctor(as_json: bool, config_file: Path | None) -> None:
    """Say whether this machine can sandbox, and why not. Exits non-zero when it cannot.

    It checks the settings a node would run with (EDGECODER_* variables, --config or EDGECODER_CONFIG): its sandbox
    mode, image, seccomp profile and isolation tiers. It prints the Docker, runc and runsc versions, the cgroup
    version, userns-remap, the seccomp profile, a canary per tier, and each failure or warning with its fix."""
    import trio

    from mesh.commands import run_doctor
    from mesh.config import node_settings, resolve

    try:  # the settings a node would run with: variables, then the file, then the defaults
        settings = node_settings(resolve({}, config=config_file))
    except (ConfigError, ValueError) as exc:
        raise InputError(str(exc)) from None
    from mesh import logs

    logs.configure(level=40)  # the report says what the executor's warnings would: once, with the fix
    report = trio.run(run_doctor, settings)
    if as_json:
        emit(report)
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "info"}
        for check in report["checks"]:
            click.echo(f"[{marks.get(check.get('level', ''), 'FAIL')}] {check['name']}: {check['detail']}")
            if check.get("fix") and check.get("level") in ("warn", "fail"):
                click.echo(f"       fix: {check['fix']}")
        click.echo("this node can sandbox" if report["ok"] else "this node CANNOT sandbox: it will refuse remote work")
    sys.exit(0 if report["ok"] else 1)


@main.group()
def image() -> None:
    """The sandbox image."""


@image.command("build")
@click.option("--tag", default=None, help="Image tag (default: $EDGECODER_IMAGE or edgecoder-sandbox:bookworm).")
@click.option("--if-missing", is_flag=True, help="Do nothing when the image exists with user 65534.")
@click.option("--rebuild", is_flag=True, help="Ignore the cached root file system and run debootstrap again.")
def image_build(tag: str | None, if_missing: bool, rebuild: bool) -> None:
    """Build the sandbox image from Debian packages (no registry needed)."""
    from executor.images import SANDBOX_USER, ImageError, build_image, image_user
    from executor.policy import ExecutorPolicy

    tag = tag or ExecutorPolicy.from_env().image
    try:
        if if_missing and image_user(tag) == SANDBOX_USER:
            click.echo(f"image {tag} is present (user {SANDBOX_USER})")
            return
        build_image(tag, progress=lambda line: click.echo(f"  {line}"), rebuild=rebuild)
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.option("--nodes", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--ble/--no-ble", default=True, show_default=True, help="Include an offer from a simulated BLE peer.")
def demo(nodes: int, ble: bool) -> None:
    """A local demo mesh that runs real signed offers in Docker, and shows what a sandbox-less node refuses."""
    import trio

    from mesh import logs
    from mesh.demo import run_demo

    logs.configure(level=40)
    sys.exit(trio.run(run_demo, nodes, ble))


if __name__ == "__main__":
    run()
