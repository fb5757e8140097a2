"""The run_code contract: what goes into a sandbox run and what comes out.

Results are data, never exceptions. Field names on the wire and in JSON are the contract's own camelCase names
(`exitCode`, `durationMs`, ...); Python attributes are snake_case.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Literal

Language = Literal["python", "javascript"]
SandboxKind = Literal["docker", "host"]
Origin = Literal["local", "remote"]

LANGUAGES: tuple[Language, ...] = ("python", "javascript")
SANDBOXES: tuple[SandboxKind, ...] = ("docker", "host")

# The stderr text and queue reason of a remote offer that asked to run on the host. Fixed by the design.
SANDBOX_REQUIRED = "sandbox_required_for_remote_task"


class ErrorKind(enum.StrEnum):
    TIMEOUT = "timeout"
    MEMORY_EXCEEDED = "memory-exceeded"
    SANDBOX_VIOLATION = "sandbox-violation"
    ABORTED = "aborted"
    EXECUTION_FAILED = "execution-failed"


class QueueReason(enum.StrEnum):
    """Why a run should fall back to the cloud queue (the `queueReason` field).

    Each value is a code of the node's one vocabulary, `transports.wire.reasons.Reason`, which this layer may not
    import: `transports.wire.reasons.QUEUE_REASONS` maps the two, and tests/test_reasons.py checks that it is total
    and keeps every value. `ErrorKind` is mapped the same way (`ERROR_KINDS`); its hyphenated values are the seed's.
    """

    OUTSIDE_SUBSET = "outside_subset"
    TIMEOUT = "timeout"
    MEMORY = "memory_exceeded"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    SANDBOX_REQUIRED = SANDBOX_REQUIRED
    BUSY = "busy"
    ABORTED = "aborted"
    # The node failed while handling the offer (a bug, not the program): another node may well run it.
    NODE_ERROR = "node_error"
    # The run needs a stronger isolation tier than this executor offers.
    ISOLATION_INSUFFICIENT = "isolation_insufficient"
    # A sealed offer's payload did not open, or was not the code and input the offer's digests name: nothing ran
    # (transports.wire.reasons has the same word).
    PAYLOAD_MISMATCH = "payload_mismatch"
    # The run names a runtime this executor does not declare, or whose image is not built (the same word as
    # transports.wire.reasons).
    RUNTIME_UNAVAILABLE = "runtime_unavailable"


@dataclass(frozen=True, slots=True)
class Limits:
    """Requested (or clamped) resource limits of one run."""

    timeout_ms: int = 5_000
    memory_mb: int = 128
    cpus: float = 0.5


@dataclass(frozen=True, slots=True)
class ExecRequest:
    language: Language
    code: str
    # JSON-compatible data. It reaches the program as JSON on its standard input, the only data door.
    input: Any = None
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True, slots=True)
class ExecResult:
    ok: bool
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration_ms: int = 0
    queue_for_cloud: bool = False
    queue_reason: QueueReason | None = None
    error_kind: ErrorKind | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        """The contract's own names, as printed by the CLI and carried on the wire."""
        return {
            "ok": self.ok,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exitCode": self.exit_code,
            "durationMs": self.duration_ms,
            "queueForCloud": self.queue_for_cloud,
            "queueReason": None if self.queue_reason is None else str(self.queue_reason),
            "errorKind": None if self.error_kind is None else str(self.error_kind),
            "stdoutTruncated": self.stdout_truncated,
            "stderrTruncated": self.stderr_truncated,
        }

    def replace(self, **changes: Any) -> ExecResult:
        return dataclasses.replace(self, **changes)


def refusal(
    stderr: str,
    *,
    error_kind: ErrorKind,
    queue_reason: QueueReason,
    queue_for_cloud: bool = True,
    duration_ms: int = 0,
) -> ExecResult:
    """A run that never started: no process, no container."""
    return ExecResult(
        ok=False,
        stderr=stderr,
        exit_code=None,
        duration_ms=duration_ms,
        queue_for_cloud=queue_for_cloud,
        queue_reason=queue_reason,
        error_kind=error_kind,
    )
