"""`edgecoder status`, `peers` and `jobs`: what a running node says on its /status."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from mesh.cli_common import DEFAULT_STATUS_ADDR, InputError, config_option, emit
from mesh.config_kinds import ConfigError


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


def _show(
    metrics: str | None,
    config_file: Path | None,
    as_json: bool,
    pick: Callable[[dict[str, Any]], dict[str, Any]],
    text: Callable[[dict[str, Any]], str],
) -> None:
    """The node's /status: `pick`'s part of it as JSON, or `text` of it for people."""
    report = fetch_status(metrics, config_file)
    if as_json:
        emit(pick(report))
    else:
        click.echo(text(report))


@click.command()
@_inspect
def status(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """What a running node is doing: its PeerID, addresses, sandbox, runs, queue, peers and jobs."""
    from mesh.inspect import format_status

    _show(metrics, config_file, as_json, lambda report: report, format_status)


@click.command()
@_inspect
def peers(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """The peers a running node is connected to, or hears heartbeats from."""
    from mesh.inspect import format_peers

    _show(
        metrics,
        config_file,
        as_json,
        lambda report: {"peerId": report["peerId"], "peers": report.get("peers", [])},
        format_peers,
    )


@click.command()
@_inspect
def jobs(metrics: str | None, config_file: Path | None, as_json: bool) -> None:
    """The offers a running node is working on, and the last ones it answered."""
    from mesh.inspect import format_jobs

    _show(
        metrics,
        config_file,
        as_json,
        lambda report: {
            "peerId": report["peerId"],
            "queueDepth": report.get("queueDepth"),
            "jobs": report.get("jobs", []),
        },
        format_jobs,
    )
