"""The sandbox gate: a node that cannot sandbox takes no part in the work at all.

At start the gate checks the daemon, the image and its user, then makes a canary run that proves, from inside a
container, network none, a read-only root and a sandbox uid of its own. It repeats the same checks periodically.
When they fail, the node withdraws from every transport; when they pass again, it rejoins by itself. With
`SANDBOX_MODE=none` the gate is closed for good: the node still connects and heartbeats `sandboxMode: none`, and
nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import structlog
import trio

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus

SandboxMode = Literal["docker", "none"]
log = structlog.get_logger("edgecoder.gate")


@dataclass(frozen=True, slots=True)
class GateStatus:
    ok: bool
    reason: str  # `ready`, `sandbox_mode_none`, or why the sandbox failed (`no_daemon`, `no_image`, ...)
    detail: str = ""


class HealthReport(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def detail(self) -> str: ...


class SandboxProbe(Protocol):
    """What the gate needs of the executor (`executor.runner.Executor` is one)."""

    async def health(self) -> HealthReport: ...

    async def canary(self) -> HealthReport: ...


def sandbox_mode_from_env(environ: dict[str, str] | None = None) -> SandboxMode:
    value = (environ if environ is not None else os.environ).get("SANDBOX_MODE", "docker").strip().lower()
    if value not in ("docker", "none"):
        raise ValueError(f"SANDBOX_MODE must be 'docker' or 'none', not {value!r}")
    return value  # type: ignore[return-value]


Listener = Callable[[bool], Awaitable[None]]


class SandboxGate:
    def __init__(self, mode: SandboxMode, probe: SandboxProbe | None, *, interval: float = 5.0) -> None:
        if mode == "docker" and probe is None:
            raise ValueError("a docker gate needs a probe")
        self.mode = mode
        self.interval = interval
        self._probe = probe
        self.status = GateStatus(False, "sandbox_mode_none" if mode == "none" else "not_checked")
        self._listeners: list[Listener] = []
        self._changed = trio.Event()

    @property
    def participating(self) -> bool:
        return self.mode == "docker" and self.status.ok

    @property
    def reported_mode(self) -> SandboxMode:
        """What the heartbeat says: `docker` only while the sandbox actually works."""
        return "docker" if self.participating else "none"

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def check(self) -> GateStatus:
        """Run the checks once and tell the listeners if participation changed."""
        if self.mode == "none" or self._probe is None:
            return self.status
        status: HealthReport = await self._probe.health()
        if status.ok:
            status = await self._probe.canary()
        if status.ok:
            status = GateStatus(True, "ready")
        before = self.participating
        self.status = GateStatus(status.ok, status.reason, status.detail)
        if self.participating != before:
            log.info("sandbox gate", participating=self.participating, reason=status.reason, detail=status.detail)
            for listener in self._listeners:
                await listener(self.participating)
            self._changed.set()
            self._changed = trio.Event()
        return self.status

    async def wait_changed(self) -> None:
        await self._changed.wait()

    async def run(self, *, task_status: TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The periodic health check. Its owner's nursery cancels it at shutdown."""
        await self.check()
        task_status.started()
        if self.mode == "none":
            return
        while True:
            await trio.sleep(self.interval)
            await self.check()
