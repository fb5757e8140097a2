"""The hardened Docker executor: the node's safety boundary.

    async with Executor.open(policy, node_label=node_id) as ex:
        result = await ex.run_code(request)            # sandbox="docker", origin="remote"

See docs/executor.md for the container flags, the stdin protocol and the measured latencies.

Importing a submodule (`executor.contract`, `executor.policy`) imports this package first, and every CLI command does
that, so nothing here may import the Docker SDK or Trio: the names below are loaded on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits, QueueReason
    from executor.health import SandboxHealth
    from executor.policy import ExecutorPolicy
    from executor.runner import Executor, ExecutorStats, run_code
    from executor.subset import SubsetViolation, check_subset

_HOMES = {
    "ErrorKind": "executor.contract",
    "ExecRequest": "executor.contract",
    "ExecResult": "executor.contract",
    "Limits": "executor.contract",
    "QueueReason": "executor.contract",
    "ExecutorPolicy": "executor.policy",
    "Executor": "executor.runner",
    "ExecutorStats": "executor.runner",
    "run_code": "executor.runner",
    "SandboxHealth": "executor.health",
    "SubsetViolation": "executor.subset",
    "check_subset": "executor.subset",
}

__all__ = [
    "ErrorKind",
    "ExecRequest",
    "ExecResult",
    "Executor",
    "ExecutorPolicy",
    "ExecutorStats",
    "Limits",
    "QueueReason",
    "SandboxHealth",
    "SubsetViolation",
    "check_subset",
    "run_code",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'executor' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
