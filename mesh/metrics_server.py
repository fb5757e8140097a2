"""The node's HTTP face, served by Hypercorn inside the node's own nursery (no background thread):

- `/metrics`: Prometheus text (or OpenMetrics, when the scraper asks for it);
- `/status`: the node's state as JSON (`mesh.status`), read by `edgecoder status`, `peers` and `jobs`;
- `/healthz`: 200 while the node takes part in the mesh, 503 with the reason while it does not.

It binds to 127.0.0.1 unless told otherwise (`metrics.bind`): `/status` names the node's peers and jobs, which is
for the operator, not the internet.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mesh.bindprobe import probe_bind
from mesh.metrics import NodeMetrics

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus


class MetricsBindError(Exception):
    """The metrics address cannot be served; the message names it and the fix."""


def build_app(
    metrics: NodeMetrics,
    status: Callable[[], dict[str, Any]] | None = None,
    health: Callable[[], tuple[bool, str]] | None = None,
) -> Starlette:
    async def metrics_page(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(metrics.registry), media_type=content_type)

    async def status_page(request: Request) -> Response:
        if status is None:
            return JSONResponse({"reason": "not_found", "detail": "this server has no node status"}, status_code=404)
        return JSONResponse(status())

    async def health_page(request: Request) -> Response:
        ok, reason = health() if health is not None else (True, "ready")
        return JSONResponse({"ok": ok, "reason": reason}, status_code=200 if ok else 503)

    return Starlette(
        routes=[
            Route("/metrics", metrics_page, methods=["GET"]),
            Route("/status", status_page, methods=["GET"]),
            Route("/healthz", health_page, methods=["GET"]),
        ]
    )


def _bind_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _os_error(exc: BaseException) -> OSError | None:
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None


async def serve_metrics(
    metrics: NodeMetrics,
    port: int,
    host: str = "127.0.0.1",
    *,
    status: Callable[[], dict[str, Any]] | None = None,
    health: Callable[[], tuple[bool, str]] | None = None,
    task_status: TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. `task_status.started` gets the bound URLs, with the real port when `port` is 0.
    An address that cannot be bound raises `MetricsBindError` before `started`."""
    config = Config()
    config.bind = [_bind_text(host, port)]
    config.accesslog = None
    config.errorlog = None
    started = False

    class _Started:
        def started(self, value: list[str]) -> None:
            nonlocal started
            started = True
            task_status.started(value)

    try:
        probe_bind(host, port)  # Hypercorn leaves its socket open when its own bind fails
        await serve(build_app(metrics, status, health), config, mode="asgi", task_status=_Started())  # type: ignore[arg-type]
    except BaseException as exc:
        error = None if started else _os_error(exc)
        if error is None:
            raise
        why = {
            errno.EADDRINUSE: "the port is already in use",
            errno.EADDRNOTAVAIL: "that is not an address of this machine",
            errno.EACCES: "the port needs privileges (use one above 1023)",
        }.get(error.errno or 0, error.strerror or str(error))
        raise MetricsBindError(
            f"cannot serve metrics on {_bind_text(host, port)}: {why}; pick another --metrics-port (metrics.bind)"
        ) from None
