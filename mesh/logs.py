"""Structured logs on stderr: human-readable by default, one JSON object a line with `--log-json`.

stdout is kept for the machine-readable contract (the `ready` line, results), so logs never go there.
"""

from __future__ import annotations

import logging
import sys

import structlog


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured: a command run in-process
    (the CLI tests) may replace stderr and close the old one, and later log lines must not fail on it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(*, json_lines: bool = False, level: int = logging.INFO, level_name: str | None = None) -> None:
    """`level_name` (debug, info, warning, error: the `log.level` setting) wins over `level` when given."""
    if level_name is not None:
        level = LEVELS[level_name]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    # libp2p logs expected noise at shutdown (unclosed sockets, multiselect errors): keep it out of the way.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for noisy in ("libp2p", "multiaddr", "async_service", "bumble"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
