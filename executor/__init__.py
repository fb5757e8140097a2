"""The hardened Docker executor: the node's safety boundary.

    async with Executor.open(policy, node_label=node_id) as ex:
        result = await ex.run_code(request)            # sandbox="docker", origin="remote"

See docs/executor.md for the container flags, the stdin protocol and the measured latencies.
"""

from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits, QueueReason
from executor.policy import ExecutorPolicy
from executor.runner import Executor, ExecutorStats, run_code
from executor.sandbox import SandboxHealth
from executor.subset import SubsetViolation, check_subset

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
