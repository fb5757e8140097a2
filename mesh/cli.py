"""`edgecoder`: the command line, the contract that users and tests rely on.

stdout carries only machine-readable lines (the `ready` event, a result as one JSON object); logs go to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import trio

from executor.contract import LANGUAGES, SANDBOXES, Limits
from mesh.coordinator.cli import coordinator
from mesh.identity import KeyFileError, NodeIdentity

EXIT_REFUSED = 3  # a typed refusal, as opposed to 1 (the run failed) and 2 (usage or a bad key file)


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


def run_with_ble(afn: Any, options: Any) -> Any:
    from transports.ble.hci import BleSetupError

    try:
        return trio.run(afn, options)
    except BleSetupError as exc:
        raise BleUnavailable(f"BLE: {exc}") from None


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
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--input is not JSON: {exc}") from None


def read_code(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}") from None


language_option = click.option("--language", type=click.Choice(LANGUAGES), required=True)
code_option = click.option("--code-file", type=click.Path(dir_okay=False, path_type=Path), required=True)
input_option = click.option("--input", "input_json", default=None, help="JSON data for the program's stdin.")
timeout_option = click.option("--timeout-ms", type=click.IntRange(1), default=5_000, show_default=True)
memory_option = click.option("--memory-mb", type=click.IntRange(1), default=128, show_default=True)
sandbox_option = click.option("--sandbox", type=click.Choice(SANDBOXES), default="docker", show_default=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A mesh node that runs strangers' signed task offers, only ever inside a hardened Docker sandbox."""


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
@click.option("--peer", "peers", multiple=True, help="A multiaddr to connect to at start (repeatable).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None)
@click.option("--log-json", is_flag=True, help="Structured logs as JSON lines on stderr.")
@click.option("--coordinator", default=None, help="Pull work from a coordinator at this URL too.")
@click.option("--ble", is_flag=True, help="Also take offers from nearby BLE peers (BlueZ through bleak).")
@ble_hci_option
@click.option("--ble-sim", is_flag=True, help="BLE on a simulated radio in this process (implies --ble).")
def node(
    key: Path,
    listen: tuple[str, ...],
    peers: tuple[str, ...],
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

    logs.configure(json_lines=log_json)
    identity = load_identity(key)
    try:
        mode = sandbox_mode_from_env()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if ble_hci is not None and ble_sim:
        raise click.UsageError("--ble-hci and --ble-sim name two different radios: give one of them")
    options = NodeOptions(identity, list(listen), list(peers), mode, metrics_port, coordinator, ble, ble_sim, ble_hci)
    run_with_ble(run_node, options)


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
@click.option("--wait-s", type=float, default=30.0, show_default=True, help="How long to wait for the result.")
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

    if ble_os:
        raise BleUnavailable(OFFER_BLE_UNSUPPORTED)
    if [to is not None, gossip, ble_hci is not None].count(True) != 1:
        raise click.UsageError("give exactly one of --to MULTIADDR, --gossip --peer MULTIADDR or --ble-hci SPEC")
    if ble_link_model is not None and ble_hci is None:
        raise click.UsageError("--ble-link-model paces a --ble-hci radio: give --ble-hci too")
    if gossip and not peers:
        raise click.UsageError("--gossip needs at least one --peer")
    logs.configure()
    options = OfferOptions(
        identity=load_identity(key),
        to=to,
        peers=list(peers),
        language=language,
        code=read_code(code_file),
        input=parse_input(input_json),
        limits=Limits(timeout_ms=timeout_ms, memory_mb=memory_mb),
        sandbox=sandbox,
        wait_s=wait_s,
        ble_hci=ble_hci,
        ble_link_model=ble_link_model,
    )
    outcome = run_with_ble(run_offer, options)
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
    from mesh.commands import run_local

    result = trio.run(
        run_local,
        language,
        read_code(code_file),
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
    main()
