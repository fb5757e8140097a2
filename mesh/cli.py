"""`edgecoder`: the command line, the contract that users and tests rely on.

stdout carries only machine-readable lines (the `ready` event, a result as one JSON object); logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TypeVar

import click
import trio

from executor.contract import LANGUAGES, SANDBOXES, Limits
from mesh.coordinator.cli import coordinator
from mesh.identity import KeyFileError, NodeIdentity

EXIT_REFUSED = 3  # a typed refusal, as opposed to 1 (the run failed) and 2 (usage or a bad key file)
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


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


def run_command(afn: Any, options: Any) -> Any:
    """`trio.run(afn, options)`, with the typed failures that surface only once the command runs turned into their
    one-line answers: a busy port, a running twin or a bad address (exit 2), a BLE radio that cannot be used
    (exit 2), an offer too large to send (exit 2), and Ctrl-C (exit 130). Trio may wrap them in exception groups."""
    from mesh.commands import Interrupted, OfferTooLarge
    from mesh.state import StateDirError
    from transports.p2p import AddressError

    try:
        return trio.run(afn, options)
    except Exception as exc:
        if cause_of(exc, (Interrupted,)) is not None:
            click.echo("interrupted: the node was told to stop the run", err=True)
            sys.exit(EXIT_INTERRUPTED)
        hci = sys.modules.get("transports.ble.hci")  # imported only by BLE commands, so only they can raise it
        if hci is not None and (ble := cause_of(exc, (hci.BleSetupError,))) is not None:
            raise BleUnavailable(f"BLE: {ble}") from None
        cause = cause_of(exc, (AddressError, StateDirError, OfferTooLarge))
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
    from mesh.codec import MAX_DEPTH, check_json_data
    from mesh.jsontext import JsonError, parse_json
    from mesh.reasons import Rejected

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


_debug = os.environ.get("EDGECODER_DEBUG") == "1"


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _debug
    _debug = _debug or value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if _debug:
            raise
        click.echo(f"edgecoder: unexpected error: {type(exc).__name__}: {exc} (run with --debug for details)", err=True)
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
    identity = NodeIdentity.generate()
    try:
        identity.save(out, force=force)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(identity.peer_id)


@main.command()
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--listen", multiple=True, default=["/ip4/127.0.0.1/tcp/0"], show_default=True)
@click.option(
    "--bootstrap",
    "--peer",
    "bootstrap",
    multiple=True,
    help="A peer to join the swarm through: /ip4/ADDR/tcp/PORT/p2p/PEERID (repeatable; kept connected).",
)
@click.option(
    "--announce",
    multiple=True,
    help="An address to tell peers instead of the listen addresses: /ip4/ADDR/tcp/PORT or /dns4/NAME/tcp/PORT "
    "(repeatable; a NAT's port mapping, a DNS name).",
)
@click.option("--no-mdns", is_flag=True, help="Do not look for peers on the LAN (mDNS is on for non-loopback listens).")
@click.option("--relay-service", is_flag=True, help="Relay circuits for peers behind NAT (bounded).")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the node keeps its lock and replay journal [default: $EDGECODER_STATE_DIR, ~/.local/state/edgecoder].",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None)
@click.option("--log-json", is_flag=True, help="Structured logs as JSON lines on stderr.")
@click.option("--coordinator", default=None, help="Pull work from a coordinator at this URL too.")
@click.option("--ble", is_flag=True, help="Also take offers from nearby BLE peers (BlueZ through bleak).")
@ble_hci_option
@click.option("--ble-sim", is_flag=True, help="BLE on a simulated radio in this process (implies --ble).")
def node(
    key: Path,
    listen: tuple[str, ...],
    bootstrap: tuple[str, ...],
    announce: tuple[str, ...],
    no_mdns: bool,
    relay_service: bool,
    state_dir: Path | None,
    metrics_port: int | None,
    log_json: bool,
    coordinator: str | None,
    ble: bool,
    ble_hci: str | None,
    ble_sim: bool,
) -> None:
    """Run a node. Its first stdout line is the `ready` event as JSON."""
    from mesh import logs
    from mesh.commands import NodeOptions, run_node
    from mesh.gate import sandbox_mode_from_env
    from mesh.state import default_state_root
    from transports.p2p import AddressError, parse_announce_addr, parse_listen_addr, parse_peer_addr

    logs.configure(json_lines=log_json)
    identity = load_identity(key)
    try:
        mode = sandbox_mode_from_env()
        for addr in listen:
            parse_listen_addr(addr)
        for addr in bootstrap:
            parse_peer_addr(addr)
        for addr in announce:
            parse_announce_addr(addr)
    except (ValueError, AddressError) as exc:
        raise InputError(str(exc)) from None
    if ble_hci is not None and ble_sim:
        raise click.UsageError("--ble-hci and --ble-sim name two different radios: give one of them")
    options = NodeOptions(
        identity,
        list(listen),
        list(bootstrap),
        mode,
        metrics_port,
        coordinator,
        ble,
        ble_sim,
        ble_hci,
        state_root=state_dir or default_state_root(),
        announce=list(announce),
        mdns=False if no_mdns else None,
        relay_service=relay_service,
    )
    run_command(run_node, options)


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
) -> None:
    """Sign an offer, send it, and print the verified result (exit 0 only when ok)."""
    from mesh import logs
    from mesh.commands import OfferOptions, run_offer
    from mesh.offers import MAX_CODE_CHARS
    from transports.p2p import AddressError, parse_peer_addr

    if ble_os:
        raise BleUnavailable(OFFER_BLE_UNSUPPORTED)
    if [to is not None, gossip, ble_hci is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --to MULTIADDR, --gossip --peer MULTIADDR or --ble-hci SPEC")
    if ble_link_model is not None and ble_hci is None:
        raise click.UsageError("--ble-link-model paces a --ble-hci radio: give --ble-hci too")
    if gossip and not peers:
        raise click.UsageError("--gossip needs at least one --peer")
    identity = load_identity(key)
    try:
        for addr in [*peers, *([to] if to else [])]:
            parse_peer_addr(addr)
    except AddressError as exc:
        raise InputError(str(exc)) from None
    code = read_code(code_file, MAX_CODE_CHARS * 4)
    if len(code) > MAX_CODE_CHARS:
        raise InputError(f"{code_file} holds {len(code):,} characters; an offer carries at most {MAX_CODE_CHARS:,}")
    logs.configure()
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
    )
    outcome = run_command(run_offer, options)
    if outcome.refusal is not None:
        emit({"ok": False, "refusal": str(outcome.refusal.reason), "detail": outcome.refusal.detail})
        sys.exit(EXIT_REFUSED)
    assert outcome.result is not None
    emit(outcome.result.to_json())
    sys.exit(0 if outcome.ok else 1)


@main.command(name="exec")
@code_option
@language_option
@sandbox_option
@timeout_option
@memory_option
@input_option
@click.option("--no-subset", is_flag=True, help="Skip the subset check (hygiene; the container is the boundary).")
def exec_(
    code_file: Path,
    language: str,
    sandbox: str,
    timeout_ms: int,
    memory_mb: int,
    input_json: str | None,
    no_subset: bool,
) -> None:
    """Run code as the local user (origin local: --sandbox host is allowed). Prints the result JSON."""
    from executor.policy import ExecutorPolicy
    from mesh.commands import run_local

    result = trio.run(
        run_local,
        language,
        read_code(code_file, ExecutorPolicy().max_code_bytes),
        parse_input(input_json),
        Limits(timeout_ms=timeout_ms, memory_mb=memory_mb),
        sandbox,
        not no_subset,
    )
    emit(result.to_json())
    sys.exit(0 if result.ok else 1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def doctor(as_json: bool) -> None:
    """Say whether this machine can sandbox, and why not. Exits non-zero when it cannot."""
    from mesh.commands import run_doctor

    report = trio.run(run_doctor)
    if as_json:
        emit(report)
    else:
        for check in report["checks"]:
            mark = "ok  " if check["ok"] else "FAIL"
            click.echo(f"[{mark}] {check['name']}: {check['detail']}")
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
    from mesh import logs
    from mesh.demo import run_demo

    logs.configure(level=40)
    sys.exit(trio.run(run_demo, nodes, ble))


main.add_command(coordinator)

if __name__ == "__main__":
    run()
