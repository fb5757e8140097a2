"""`/metrics` for Prometheus, served by Hypercorn inside the node's own nursery (no background thread)."""

from __future__ import annotations

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import make_asgi_app

from mesh.metrics import NodeMetrics


async def serve_metrics(
    metrics: NodeMetrics,
    port: int,
    host: str = "127.0.0.1",
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    await serve(make_asgi_app(registry=metrics.registry), config, mode="asgi", task_status=task_status)
