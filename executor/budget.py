"""One warm-pool budget shared by the runtimes in use.

Every pool container is made with the policy's pool limits, so a budget of `pool_size` containers per tier is one
memory budget: `pool_size` x the pool's memory, whatever the runtimes. `python` holds it all until another
runtime is used; from then on the runtimes in use share it, the most recently used first for the remainder, and a
runtime unused for IDLE_S gives its share back (its warm containers are removed). The first run of a runtime not
in use starts cold: it is what puts the runtime in use.

Pure bookkeeping, no I/O: the executor applies the shares with `WarmPool.resize`.
"""

from __future__ import annotations

from collections.abc import Iterable

from executor.runtimes import DEFAULT_RUNTIME

# A runtime with no run for this long is no longer in use (ten minutes: longer than a burst of work with gaps).
IDLE_S = 600.0


class WarmBudget:
    def __init__(self, total: int, runtimes: Iterable[str], *, idle_s: float = IDLE_S) -> None:
        self.total = total
        self.idle_s = idle_s
        self.runtimes = tuple(runtimes)
        # The last run of each runtime in use; `python` is always in use (offers without a runtime name it).
        self._last_used: dict[str, float] = {DEFAULT_RUNTIME: float("-inf")}

    def used(self, runtime: str, now: float) -> bool:
        """Note a run of `runtime` at `now`; True when the shares change (it was not in use)."""
        changed = runtime not in self._last_used
        self._last_used[runtime] = now
        return changed

    def expire(self, now: float) -> bool:
        """Forget the runtimes idle for `idle_s`; True when the shares change."""
        idle = [r for r, t in self._last_used.items() if r != DEFAULT_RUNTIME and now - t >= self.idle_s]
        for runtime in idle:
            del self._last_used[runtime]
        return bool(idle)

    @property
    def in_use(self) -> tuple[str, ...]:
        """The runtimes in use, the most recently used first."""
        return tuple(sorted(self._last_used, key=lambda r: -self._last_used[r]))

    def shares(self) -> dict[str, int]:
        """How many warm containers each declared runtime keeps: 0 for those not in use, and in all `total`."""
        active = self.in_use
        base, extra = divmod(self.total, len(active))
        share = {r: 0 for r in self.runtimes}
        for position, runtime in enumerate(active):
            share[runtime] = base + (1 if position < extra else 0)
        return share
