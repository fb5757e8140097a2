"""`edgecoder coordinator`: serve the coordinator until SIGTERM or Ctrl-C, or submit work to one.

    edgecoder coordinator --db tasks.sqlite --listen 127.0.0.1:8700 [--key coordinator.key]   # serve
    edgecoder coordinator submit --url http://127.0.0.1:8700 --key me.key --language python --code-file job.py [--wait]

The group serves when it is given no subcommand, so the serving command line stays what it always was.
`python -m mesh.coordinator` runs the same group on its own.

Nothing heavy is imported at module level: the `edgecoder` group registers this one, and `edgecoder --help` must not
pay for Starlette, Hypercorn, SQLite or httpx. The service is imported only when it is served.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mesh.cli_common import (
    EXIT_REFUSED,
    InputError,
    cause_of,
    code_option,
    emit,
    input_option,
    language_option,
    load_identity,
    parse_input,
)
from mesh.cli_settings import table_options, typed_flags
from mesh.config_kinds import ConfigError, host_port
from mesh.coordinator.settings import COORDINATOR_SETTINGS

if TYPE_CHECKING:
    from mesh.coordinator.app import Settings
    from transports.wire.identity import NodeIdentity

# The states a task ends in (`mesh/coordinator/store.py`); `queued` and `claimed` are still moving.
FINAL_STATES = ("done", "failed", "expired")


def parse_listen(value: str) -> tuple[str, int]:
    try:
        return host_port(value)
    except ValueError:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r}") from None


async def _serve_until_signalled(db: Path, host: str, port: int, settings: Settings, key: NodeIdentity | None) -> None:
    import trio

    from mesh.coordinator.server import run_coordinator

    async with trio.open_nursery() as nursery:
        # The receiver is open before the ready line, so a test's SIGTERM right after it is never missed.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            url = await nursery.start(partial(run_coordinator, db, host, port, settings, identity=key))
            ready = {"event": "ready", "url": url}
            if key is not None:
                ready["publicKey"] = key.public_key.hex()
                from transports.wire.peerid import ed25519_peer_id

                ready["peerId"] = ed25519_peer_id(key.public_key)
            print(json.dumps(ready), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


@click.group("coordinator", invoke_without_command=True, context_settings={"show_default": False})
@table_options(COORDINATOR_SETTINGS)
@click.pass_context
def coordinator(ctx: click.Context, **params: Any) -> None:
    """Serve a coordinator (--db, --listen), or submit work to one (`submit`).

    Served, agents register, heartbeat, /pull signed offers and post signed results back. Every setting can also
    come from its EDGECODER_COORDINATOR_* variable (docs/reference/config.md)."""
    flags = typed_flags(ctx, params, COORDINATOR_SETTINGS)
    if ctx.invoked_subcommand is not None:
        if "coordinator.db" in flags or "coordinator.listen" in flags:
            raise click.UsageError("--db and --listen serve a coordinator; give them without a subcommand")
        return
    from mesh.config_resolve import resolve_table

    try:  # the coordinator reads no settings file: flags, then its variables, then the defaults
        v = resolve_table(COORDINATOR_SETTINGS, flags, read_config=False).values
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    db, listen, key = v["coordinator.db"], v["coordinator.listen"], v["coordinator.key_file"]
    if db is None or listen is None:
        raise click.UsageError("to serve, give --db FILE and --listen HOST:PORT (or use `coordinator submit`)")
    host, port = parse_listen(listen)
    if db.is_dir():
        raise InputError(f"--db {db} is a directory; give the SQLite file's path")
    if key is not None and not key.exists():
        raise InputError(f"--key {key} does not exist; make one with: edgecoder keygen --out {key}")
    identity = load_identity(key) if key is not None else None
    from transports.wire.identity import public_key_of_peer_id

    trusted = frozenset(public_key_of_peer_id(p).hex() for p in v["coordinator.trusted_offerers"])
    if not db.parent.is_dir():
        raise InputError(f"--db {db}: directory {db.parent} does not exist; create it or pick another path")
    import trio

    from mesh.coordinator.app import Settings
    from mesh.logs import configure as configure_logs

    lease_ms = round(v["coordinator.lease_s"] * 1000)
    heartbeat_s, fresh_offer_rate, new_agent_rate = (
        v["coordinator.heartbeat_s"],
        v["coordinator.fresh_offer_rate"],
        v["coordinator.new_agent_rate"],
    )
    settings = Settings(
        lease_ms=lease_ms,
        heartbeat_ms=round(heartbeat_s * 1000) if heartbeat_s is not None else lease_ms // 3,
        rate_per_s=v["coordinator.rate"],
        burst=v["coordinator.burst"],
        max_lapses=v["coordinator.max_lapses"],
        offer_skew_ms=round(v["coordinator.offer_skew_s"] * 1000),
        retention_ms=round(v["coordinator.retention_s"] * 1000),
        max_queued=v["coordinator.max_queued"],
        max_queued_per_offerer=v["coordinator.max_queued_per_offerer"],
        max_agents=v["coordinator.max_agents"],
        trusted_offerers=trusted,
        tenure_ms=round(v["coordinator.established_after_s"] * 1000),
        fresh_share=v["coordinator.fresh_share"],
        fresh_offers_per_s=fresh_offer_rate,
        fresh_offers_burst=max(1, round(fresh_offer_rate * 5)),
        new_agents_per_s=new_agent_rate,
        new_agents_burst=max(1, round(new_agent_rate * 10)),
        max_body_bytes_in_flight=int(v["coordinator.max_body_mib"] * (1 << 20)),
        max_queued_bytes=int(v["coordinator.max_queued_mib"] * (1 << 20)),
    )
    configure_logs()  # on stderr: stdout carries the ready line, which callers parse
    import sqlite3

    try:
        trio.run(_serve_until_signalled, db, host, port, settings, identity)
    except Exception as exc:
        if (found := cause_of(exc, (sqlite3.Error,))) is not None:
            raise InputError(f"--db {db} cannot be used as the coordinator's SQLite file: {found}") from None
        if (os_error := cause_of(exc, (OSError,))) is not None:
            raise InputError(
                f"cannot serve on {listen}: {os_error.strerror or os_error}; pick another --listen"
            ) from None
        raise
    except KeyboardInterrupt:
        return


# -- submit ----------------------------------------------------------------------------------------------------


def _read_code(path: Path, max_chars: int) -> str:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if size > max_chars * 4:
        raise InputError(f"{path} is {size:,} bytes; an offer carries at most {max_chars:,} characters")
    try:
        code = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if len(code) > max_chars:
        raise InputError(f"{path} holds {len(code):,} characters; an offer carries at most {max_chars:,}")
    return code


@coordinator.command("submit")
@click.option("--url", required=True, metavar="URL", help="The coordinator's base URL (its ready line's `url`).")
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The offerer's key file.")
@language_option
@code_option
@input_option
@click.option("--timeout-ms", type=click.IntRange(1, 3_600_000), default=5_000, show_default=True)
@click.option("--memory-mb", type=click.IntRange(1, 65_536), default=128, show_default=True)
@click.option(
    "--ttl-s",
    type=click.IntRange(1, 3600),
    default=600,
    show_default=True,
    help="How long the offer stays valid: the queue keeps it at most this long.",
)
@click.option("--wait", is_flag=True, help="Wait for the result, verify its signature and print it.")
@click.option(
    "--wait-s", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True, help="How long --wait waits."
)
def submit(
    url: str,
    key: Path,
    language: str,
    code_file: Path,
    input_json: str | None,
    timeout_ms: int,
    memory_mb: int,
    ttl_s: int,
    wait: bool,
    wait_s: float,
) -> None:
    """Sign an offer from files and enqueue it; print {"taskId": ...}. With --wait, also the verified result.

    Exit codes: 0 queued (or, with --wait, ran ok), 1 the run failed or no coordinator answered, 2 bad input,
    3 refused (by the coordinator, or the task failed or expired), 130 interrupted."""
    import hashlib

    from executor.contract import Limits
    from mesh.config import coordinator_url
    from transports.wire.offers import MAX_CODE_CHARS, TaskOffer

    try:
        base = coordinator_url(url)
    except ValueError as exc:
        raise InputError(f"--url: {exc}") from None
    identity = load_identity(key)
    code = _read_code(code_file, MAX_CODE_CHARS)
    offer = TaskOffer.create(
        identity,
        language=language,  # type: ignore[arg-type]
        code=code,
        input=parse_input(input_json),
        limits=Limits(timeout_ms=timeout_ms, memory_mb=memory_mb),
        ttl_ms=ttl_s * 1000,
    )
    raw = offer.sign(identity)
    from transports.wire.codec import DEFAULT_MAX_MESSAGE_BYTES

    if len(raw) > DEFAULT_MAX_MESSAGE_BYTES:  # checked before anything is sent
        raise InputError(
            f"the signed offer is {len(raw):,} bytes; a coordinator takes at most {DEFAULT_MAX_MESSAGE_BYTES:,}"
        )
    import httpx

    with httpx.Client(base_url=base, timeout=10) as client:
        answer = _request(client, "POST", "/tasks", content=raw, headers={"content-type": "application/octet-stream"})
        if answer.status_code != 201:
            _refused(answer)
        task_id = str(answer.json()["taskId"])
        emit({"taskId": task_id})
        if not wait:
            return
        from transports.wire.agent_requests import sign_request

        deadline = time.monotonic() + wait_s
        path = f"/tasks/{task_id}"
        while True:
            # A task's state is for its offerer only: the read is signed with the same key as the offer.
            state = _request(client, "GET", path, headers=sign_request(identity, "GET", path, b""))
            if state.status_code in (429, 503):  # the coordinator asks us to come back later
                status = {"state": "waiting"}
            elif state.status_code != 200:
                _refused(state)
            else:
                status = state.json()
                if status["state"] in FINAL_STATES:
                    break
            if time.monotonic() > deadline:
                emit({"ok": False, "refusal": "timeout", "detail": f"task still {status['state']} after {wait_s:g} s"})
                sys.exit(EXIT_REFUSED)
            time.sleep(0.25)
    if status["state"] != "done":
        emit(_refusal_line(status.get("reason") or status["state"], status.get("detail") or ""))
        sys.exit(EXIT_REFUSED)
    _print_verified(status, raw, offer.offer_id, hashlib.sha256(raw).digest())


def _print_verified(status: dict[str, Any], raw: bytes, offer_id: bytes, digest: bytes) -> None:
    """The result, verified against the agent that held the claim, this offer's id and this offer's digest."""
    import base64

    from transports.wire.peerid import ed25519_peer_id
    from transports.wire.reasons import Rejected
    from transports.wire.results import open_result

    try:
        claimant = bytes.fromhex(status["claimedBy"])
        result = open_result(base64.b64decode(status["result"], validate=True), expect_executor=claimant)
    except (Rejected, ValueError, TypeError, KeyError) as exc:
        detail = exc.rejection.detail if isinstance(exc, Rejected) else f"{type(exc).__name__}: {exc}"
        emit({"ok": False, "refusal": "malformed", "detail": f"the result does not verify: {detail}"})
        sys.exit(EXIT_REFUSED)
    if result.offer_id != offer_id or result.offer_digest != digest:
        emit({"ok": False, "refusal": "malformed", "detail": "the result names another offer"})
        sys.exit(EXIT_REFUSED)
    emit({**result.to_json(), "executorPeerId": ed25519_peer_id(result.executor)})
    sys.exit(0 if result.result.ok else 1)


def _request(client: Any, method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    try:
        return client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise click.ClickException(
            f"no coordinator answers at {client.base_url} ({type(exc).__name__}: {exc}); check --url"
        ) from None


def _refused(response: Any) -> None:
    try:
        body = response.json()
        reason, detail = str(body["reason"]), str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        reason, detail = "http_error", f"{response.status_code}: {response.text[:200]}"
    emit(_refusal_line(reason, detail))
    sys.exit(EXIT_REFUSED)


def _refusal_line(reason: str, detail: str) -> dict[str, Any]:
    """A refusal as `edgecoder offer` prints it: with the seed's run result first, when the seed defines one for
    this code (a host request, no sandbox, no room: transports.wire.reasons.RUN_RESULT_REFUSALS)."""
    from transports.wire.reasons import run_result_of, wire_refusal

    code = wire_refusal(reason)
    seed = None if code is None else run_result_of(code, detail)
    return {**(seed.to_json() if seed is not None else {"ok": False}), "refusal": reason, "detail": detail}
