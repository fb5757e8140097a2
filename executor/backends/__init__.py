"""Sandbox backends: one per container runtime, behind one small interface.

The executor keeps the policy decisions (what may run, with which limits, which tier a run needs). A backend knows
only its runtime: the few container settings that differ under it, whether the daemon can run it at all, and what
the canary must read inside one of its containers for the policy's limits to be proven. The hardening itself is
shared and lives in executor/container_config.py; no backend may weaken it.

The tiers form a ladder, weakest first (`TIERS`): runc < gvisor.

- `runc` (executor/backends/runc.py): Docker's default runtime, hardened. The program's syscalls reach the host
  kernel, filtered by the seccomp profile.
- `gvisor` (executor/backends/gvisor.py): Docker with `runtime="runsc"`. The program's syscalls reach gVisor's own
  kernel (the Sentry, in user space); the host kernel sees only the Sentry's, under gVisor's own seccomp filter.

Importing this package imports neither the Docker SDK nor Trio.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from executor.contract import Limits
    from executor.policy import ExecutorPolicy

Tier = Literal["runc", "gvisor"]
TIERS: tuple[Tier, ...] = ("runc", "gvisor")  # the ladder, weakest first


class SandboxBackend(Protocol):
    """What the executor asks of a runtime. Implementations are small, stateless and I/O-free."""

    @property
    def tier(self) -> Tier: ...

    @property
    def runtime(self) -> str:
        """The Docker runtime name, set explicitly on every container (never the daemon's default)."""
        ...

    def host_config(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        """The host_config keys this runtime sets on top of the shared hardening (they are merged last)."""
        ...

    def daemon_problem(self, info: Mapping[str, Any]) -> str | None:
        """Why the daemon (its `GET /info`) cannot run this tier, with the fix; None when it can."""
        ...

    def expected(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        """The runtime's own canary readings and the values the policy demands (see executor/canary.py)."""
        ...

    def adapt_seccomp(self, profile: dict[str, Any]) -> dict[str, Any]:
        """The seccomp profile as this runtime must be given it to apply it as written (a copy, never weaker
        for the host kernel)."""
        ...

    @property
    def host_witness(self) -> bool:
        """Whether the canary must also read the container's host cgroup: the limits the runtime enforces outside
        the container that nothing inside can observe."""
        ...


def rank(tier: str) -> int:
    """The tier's place on the ladder (0 = weakest). Raises ValueError for an unknown tier."""
    try:
        return TIERS.index(tier)
    except ValueError:
        raise ValueError(f"unknown isolation tier {tier!r}; one of {', '.join(TIERS)}") from None


def meets(tier: str, minimum: str | None) -> bool:
    """Whether `tier` is at least as strong as `minimum` (None: no minimum)."""
    return minimum is None or rank(tier) >= rank(minimum)


def weakest_meeting(offered: Iterable[str], minimum: str | None) -> Tier | None:
    """The weakest of `offered` that meets `minimum`: a run gets the boundary it asked for, at the lowest cost."""
    fitting = sorted((t for t in offered if meets(t, minimum)), key=rank)
    return fitting[0] if fitting else None  # type: ignore[return-value]


def parse_tiers(text: str) -> tuple[Tier, ...]:
    """`runc`, `gvisor` or `runc,gvisor` (the `executor.isolation` setting) as tiers, weakest first."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("no isolation tier given; one of runc, gvisor or runc,gvisor")
    for name in names:
        rank(name)
    return tuple(sorted(set(names), key=rank))  # type: ignore[arg-type]


def backend_for(tier: str) -> SandboxBackend:
    """The backend of `tier`."""
    rank(tier)
    if tier == "gvisor":
        from executor.backends.gvisor import GvisorBackend

        return GvisorBackend()
    from executor.backends.runc import RuncBackend

    return RuncBackend()
