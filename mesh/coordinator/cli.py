"""`edgecoder coordinator`: serve the coordinator until SIGTERM or Ctrl-C.

The integrator registers `coordinator` (a click command) on the `edgecoder` group; `python -m mesh.coordinator`
runs the same command on its own.
"""

from __future__ import annotations

import json
import signal
from functools import partial
from pathlib import Path

import click
import trio

from mesh.coordinator.app import Settings
from mesh.coordinator.server import run_coordinator
from mesh.identity import KeyFileError, NodeIdentity
from mesh.logs import configure as configure_logs


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


async def _serve_until_signalled(db: Path, host: str, port: int, settings: Settings, key: NodeIdentity | None) -> None:
    async with trio.open_nursery() as nursery:
        # The receiver is open before the ready line, so a test's SIGTERM right after it is never missed.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            url = await nursery.start(partial(run_coordinator, db, host, port, settings, identity=key))
            ready = {"event": "ready", "url": url}
            if key is not None:
                ready["publicKey"] = key.public_key.hex()
            print(json.dumps(ready), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


@click.command("coordinator")
@click.option("--db", "db", required=True, type=click.Path(dir_okay=False, path_type=Path), help="SQLite state file.")
@click.option("--listen", "listen", required=True, help="HOST:PORT to serve on; port 0 picks a free one.")
@click.option(
    "--key",
    "key",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="The coordinator's identity: /pull responses are signed with it, so agents can pin it.",
)
@click.option(
    "--lease",
    "lease_s",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds of agent silence before its claims are requeued.",
)
@click.option(
    "--heartbeat",
    "heartbeat_s",
    type=click.FloatRange(min=0.05),
    help="Heartbeat interval agents are told to use [default: lease / 3].",
)
@click.option(
    "--rate",
    "rate",
    type=click.FloatRange(min=0.001),
    default=5.0,
    show_default=True,
    help="Requests per second per agent.",
)
@click.option(
    "--burst", "burst", type=click.IntRange(min=1), default=20, show_default=True, help="Token bucket size per agent."
)
@click.option(
    "--max-lapses",
    "max_lapses",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Leases a task may lose before it fails.",
)
@click.option(
    "--offer-skew",
    "offer_skew_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Clock skew allowed when checking an offer's issuedAt and expiresAt.",
)
@click.option(
    "--retention",
    "retention_s",
    type=click.FloatRange(min=0),
    default=24 * 3600.0,
    show_default=True,
    help="Seconds a finished task stays readable before it is deleted.",
)
@click.option(
    "--max-queued",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Unfinished tasks held in all; past it, enqueue answers 503 busy.",
)
@click.option(
    "--max-queued-per-offerer",
    type=click.IntRange(min=1),
    default=1_000,
    show_default=True,
    help="Unfinished tasks held for one offerer.",
)
@click.option(
    "--max-agents",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Agents known at once; long-silent agents without a claim are forgotten.",
)
def coordinator(
    db: Path,
    listen: str,
    key: Path | None,
    lease_s: float,
    heartbeat_s: float | None,
    rate: float,
    burst: int,
    max_lapses: int,
    offer_skew_s: float,
    retention_s: float,
    max_queued: int,
    max_queued_per_offerer: int,
    max_agents: int,
) -> None:
    """Serve the coordinator: agents register, heartbeat, /pull signed offers and post signed results back."""
    host, port = parse_listen(listen)
    identity = None
    if key is not None:
        try:
            identity = NodeIdentity.load(key)
        except KeyFileError as exc:
            raise click.ClickException(str(exc)) from None
    lease_ms = round(lease_s * 1000)
    settings = Settings(
        lease_ms=lease_ms,
        heartbeat_ms=round(heartbeat_s * 1000) if heartbeat_s is not None else lease_ms // 3,
        rate_per_s=rate,
        burst=burst,
        max_lapses=max_lapses,
        offer_skew_ms=round(offer_skew_s * 1000),
        retention_ms=round(retention_s * 1000),
        max_queued=max_queued,
        max_queued_per_offerer=max_queued_per_offerer,
        max_agents=max_agents,
    )
    configure_logs()  # on stderr: stdout carries the ready line, which callers parse
    try:
        trio.run(_serve_until_signalled, db, host, port, settings, identity)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {listen}: {exc.strerror or exc}") from None
