"""The sandbox gate: a node that cannot sandbox takes no part in the work at all.

At start the gate checks, for every isolation tier the executor offers (runc, gvisor: executor/backends/), the
daemon, the image and its user and the tier's runtime, then makes a canary run of that tier that proves from inside
its container the policy's limits and hardening (executor/canary.py: memory, pids, CPU, nofile, nproc, its own uid,
no capabilities, no new privileges, a seccomp filter, a read-only root, only `lo`). It repeats the same checks
periodically. A tier that fails them is withdrawn (`tiers` no longer names it, and the executor runs nothing on it);
when every tier is withdrawn the node withdraws from every transport; when a tier passes again, it comes back by
itself. With `SANDBOX_MODE=none` the gate is closed for good: the node still connects and heartbeats
`sandboxMode: none`, and nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from mesh.peers import SandboxMode

if TYPE_CHECKING:
    # The installed trio-stubs (which mypy prefers to trio's own hints) know TaskStatus only from trio_typing.
    from trio_typing import TaskStatus

log = structlog.get_logger("edgecoder.gate")


@dataclass(frozen=True, slots=True)
class GateStatus:
    ok: bool
    # `ready`, `sandbox_mode_none`, or why the sandbox failed (`daemon_unreachable`, `image_missing`,
    # `runtime_missing`, `canary_failed`, `limit_not_enforced`, ...)
    reason: str
    detail: str = ""
    # For `limit_not_enforced`: the canary readings that did not match the policy (`cgroup.pids`, `host.cpus`, ...).
    missing: tuple[str, ...] = ()
    checked_at_ms: int | None = None  # wall clock of the check, None before the first
    # The gVisor platform the tier's last canary really ran on (systrap, ptrace, kvm), read from the runtime.
    platform: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "detail": self.detail,
            "missing": list(self.missing),
            "checkedAtMs": self.checked_at_ms,
            "platform": self.platform,
        }


class HealthReport(Protocol):
    @property
    def ok(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def detail(self) -> str: ...


class SandboxProbe(Protocol):
    """What the gate needs of the executor (`executor.runner.Executor` is one)."""

    @property
    def offered_tiers(self) -> Sequence[str]: ...

    async def health(self, tier: str | None = None) -> HealthReport: ...

    async def canary(self, tier: str | None = None) -> HealthReport: ...


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
        offered = tuple(probe.offered_tiers) if probe is not None and mode == "docker" else ()
        # Every offered tier's last verdict, weakest first.
        self.tier_status: dict[str, GateStatus] = {tier: GateStatus(False, "not_checked") for tier in offered}
        self._listeners: list[Listener] = []
        self._changed = trio.Event()

    @property
    def tiers(self) -> frozenset[str]:
        """The isolation tiers whose last checks passed: the ones this node can run work on now."""
        if self.mode != "docker":
            return frozenset()
        return frozenset(tier for tier, status in self.tier_status.items() if status.ok)

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
        """Run the checks of every tier once and tell the listeners if participation or the tiers changed."""
        if self.mode == "none" or self._probe is None:
            return self.status
        before = (self.participating, self.tiers)
        for tier in self.tier_status:
            self.tier_status[tier] = await self._check_tier(self._probe, tier)
            if self.tier_status[tier].ok != (tier in before[1]):
                verdict = self.tier_status[tier]
                log.info("isolation tier", tier=tier, ok=verdict.ok, reason=verdict.reason, detail=verdict.detail)
        self.status = self._overall()
        if (self.participating, self.tiers) != before:
            log.info(
                "sandbox gate",
                participating=self.participating,
                tiers=sorted(self.tiers),
                reason=self.status.reason,
                detail=self.status.detail,
            )
            for listener in self._listeners:
                await listener(self.participating)
            self._changed.set()
            self._changed = trio.Event()
        return self.status

    @staticmethod
    async def _check_tier(probe: SandboxProbe, tier: str) -> GateStatus:
        status: HealthReport = await probe.health(tier)
        if status.ok:
            status = await probe.canary(tier)
        now = time.time_ns() // 1_000_000
        platform = getattr(status, "platform", None)
        if status.ok:
            return GateStatus(True, "ready", checked_at_ms=now, platform=platform)
        return GateStatus(False, status.reason, status.detail, tuple(getattr(status, "missing", ())), now, platform)

    def _overall(self) -> GateStatus:
        """Ready while any tier is; the first failing tier's reason once none is. A tier withdrawn beside a
        healthy one is named in the detail."""
        failing = {tier: status for tier, status in self.tier_status.items() if not status.ok}
        if not self.tier_status:
            return GateStatus(False, "no_tier", "the executor offers no isolation tier")
        if len(failing) < len(self.tier_status):
            withdrawn = "; ".join(f"{tier} withdrawn: {s.reason}: {s.detail}" for tier, s in failing.items())
            return GateStatus(True, "ready", withdrawn)
        first = next(iter(failing.values()))
        return GateStatus(False, first.reason, first.detail, first.missing, first.checked_at_ms)

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
