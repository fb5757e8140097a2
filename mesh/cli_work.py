"""`edgecoder offer` and `edgecoder exec`: send work to the mesh, or run it in this machine's sandbox."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from mesh.cli_common import (
    EXIT_REFUSED,
    OFFER_BLE_UNSUPPORTED,
    TIERS,
    BleUnavailable,
    InputError,
    ble_hci_option,
    code_option,
    emit,
    input_option,
    language_option,
    load_identity,
    memory_option,
    parse_input,
    read_code,
    run_command,
    sandbox_option,
    timeout_option,
)


@click.command()
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
    "--runtime",
    default=None,
    metavar="NAME",
    help="The runtime the run needs (docs/runtimes.md): python-science, or a name an operator declared "
    "[default: python, on every node].",
)
@click.option(
    "--runtime-digest",
    default=None,
    metavar="HEX",
    help="With --runtime: only a node whose runtime has exactly this package set (its digest, as `edgecoder "
    "doctor` and /status show it) may run it.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="With --to: print a line naming the offer, then the program's output as it comes, then the result.",
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
    runtime: str | None,
    runtime_digest: str | None,
    follow: bool,
    log_level: str,
) -> None:
    """Sign an offer, send it, and print the verified result (exit 0 only when ok)."""
    from executor.contract import Limits
    from mesh import logs
    from mesh.commands import OfferOptions, run_offer
    from transports.operator_addrs import AddressError, parse_peer_addr
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
    if runtime_digest is not None and runtime is None:
        raise click.UsageError("--runtime-digest pins a --runtime: give --runtime too")
    from transports.wire.needs import Needs

    try:
        needs = Needs(runtime, runtime_digest)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if follow and to is None:
        raise click.UsageError("--follow is for --to (live output rides a direct offer's stream)")
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
        needs=needs,
        replicas=replicas,
        follow=follow,
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
    if follow:  # whether the output shown above is what the runner signed
        shown["streamed"], shown["streamVerified"] = outcome.streamed, outcome.stream_verified
    emit(shown)
    sys.exit(0 if outcome.ok else 1)


@click.command(name="exec")
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
@click.option(
    "--runtime",
    default=None,
    metavar="NAME",
    help="The runtime to run in, one this machine's settings declare (executor.runtimes, docs/runtimes.md): "
    "python-science, or a name an operator declared [default: python].",
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
    runtime: str | None,
) -> None:
    """Run code as the local user (origin local: --sandbox host is allowed). Prints the result JSON."""
    import trio

    from executor.contract import Limits
    from executor.policy import ExecutorPolicy
    from mesh.commands import run_local

    if isolation is not None and sandbox == "host":
        raise click.UsageError("--isolation picks the container runtime; --sandbox host runs no container")
    if runtime is not None and sandbox == "host":
        raise click.UsageError("--runtime picks a sandbox image; --sandbox host runs no container")
    runtimes: tuple[Any, ...] = ()
    if runtime is not None:
        from mesh.config import ConfigError, node_settings, resolve

        try:  # the runtimes the operator declared (variables, then EDGECODER_CONFIG's file, then the defaults)
            declared = node_settings(resolve({})).executor_policy
        except (ConfigError, ValueError) as exc:
            raise InputError(str(exc)) from None
        if declared.runtime(runtime) is None:
            raise InputError(f"runtime {runtime!r} is not declared (declared: {', '.join(declared.runtime_names)})")
        runtimes = declared.runtimes
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
        runtime or "python",
        runtimes,
    )
    emit(result.to_json())
    sys.exit(0 if result.ok else 1)
