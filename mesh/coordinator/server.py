"""Serving the coordinator: Hypercorn's trio worker, plus the reaper that takes back leases from silent agents."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from mesh.bindprobe import probe_bind
from mesh.coordinator.app import Coordinator, Settings
from mesh.coordinator.store import Database, Store
from transports.wire.agent_requests import now_ms
from transports.wire.identity import NodeIdentity

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) only know TaskStatus from trio_typing.
    from trio_typing import TaskStatus


def hypercorn_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = "-"  # hypercorn's "-" is stderr; stdout carries only the ready line
    config.graceful_timeout = 2.0
    config.include_server_header = False
    return config


PURGE_EVERY_S = 60.0


async def _reap_forever(db: Database, settings: Settings) -> None:
    """`/pull` reaps before it claims, so this only keeps `GET /tasks/{id}` honest between pulls. It also purges
    what is past its retention, about once a minute."""
    next_purge = trio.current_time()
    while True:
        await trio.sleep(max(settings.lease_ms / 4000, 0.1))
        now = now_ms()
        await db.call(Store.reap, db.store, now, settings.lease_ms)
        if trio.current_time() >= next_purge:
            await db.call(
                Store.purge, db.store, now, settings.retention_ms, settings.agent_retention_ms, settings.offer_skew_ms
            )
            next_purge = trio.current_time() + PURGE_EVERY_S


async def run_coordinator(
    db_path: Path,
    host: str,
    port: int,
    settings: Settings,
    *,
    identity: NodeIdentity | None = None,
    task_status: TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. Reports the URL it listens on (the real port, when `port` is 0) once it accepts.
    An address that cannot be bound raises its OSError, before the database is opened."""
    probe_bind(host, port)  # Hypercorn leaves its socket open when its own bind fails
    store = Store(db_path, max_lapses=settings.max_lapses)
    store.trust(settings.trusted_offerers)
    db = Database(store)
    try:
        app = Coordinator(db, settings, identity=identity).app()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, hypercorn_config(host, port))
            nursery.start_soon(_reap_forever, db, settings)
            task_status.started(binds[0])
    finally:
        store.close()
