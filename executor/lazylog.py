"""`get_logger(name)`: structlog's logger, with structlog itself imported at the first log line instead of at import.

structlog imports asyncio, and the two cost about 30 ms: a third of what `edgecoder exec` may spend before its
container starts. A one-shot run that goes well logs nothing, so the modules on its path (the executor, the CLI's
command bodies) take their module-level logger from here. The logger is the same structlog proxy once resolved, so
configuration (mesh/logs.py) and `structlog.testing.capture_logs` apply exactly as before.
"""

from __future__ import annotations

from typing import Any


class LazyLogger:
    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def get_logger(name: str) -> LazyLogger:
    return LazyLogger(name)
