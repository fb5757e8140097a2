"""What every benchmark ends with: each target "met" or "not met", and whether the run itself was broken.

A target not met is a figure (a slow machine makes one); the exit code stays 0. A broken run is not a figure at
all: nothing was admitted, the attacker never ran, every run failed at once, a result was wrong. Its figures would
look good for the wrong reason, so the benchmark says why and exits 1.

    verdict = Verdict()
    verdict.target("warm gVisor / warm runc p50", ratio, at_most=2.0, unit="x")
    verdict.require(admitted == offers, f"admitted {admitted} of {offers} offers")
    sys.exit(verdict.finish())
"""

from __future__ import annotations


class Verdict:
    def __init__(self) -> None:
        self.met: list[str] = []
        self.not_met: list[str] = []
        self.broken: list[str] = []

    def target(
        self, name: str, value: float, *, at_least: float | None = None, at_most: float | None = None, unit: str = ""
    ) -> bool:
        """Print one target's line and return whether it was met."""
        assert (at_least is None) != (at_most is None), "a target is a lower or an upper bound"
        ok = value >= at_least if at_least is not None else value <= at_most  # type: ignore[operator]
        bound = f">= {at_least:g}{unit}" if at_least is not None else f"<= {at_most:g}{unit}"
        print(f"target: {name}: {value:.3g}{unit} (target {bound}): {'met' if ok else 'not met'}", flush=True)
        (self.met if ok else self.not_met).append(name)
        return ok

    def require(self, condition: bool, why_broken: str) -> None:
        """A condition without which the run measured nothing: when it fails, the run is broken."""
        if not condition:
            self.broken.append(why_broken)
            print(f"BROKEN: {why_broken}", flush=True)

    def finish(self) -> int:
        """The summary line; the exit code (1 when the run was broken)."""
        print(f"targets: {len(self.met)} met, {len(self.not_met)} not met", flush=True)
        if self.broken:
            print(f"the run was broken, so its figures mean nothing: {'; '.join(self.broken)}", flush=True)
            return 1
        return 0
