"""`/metrics` for Prometheus, served by Hypercorn inside the node's own nursery (no background thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import make_asgi_app

from mesh.metrics import NodeMetrics


async def serve_metrics(
    metrics: NodeMetrics,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    await serve(make_asgi_app(registry=metrics.registry), config, mode="asgi", task_status=task_status)
