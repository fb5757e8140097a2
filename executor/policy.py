"""What the node allows a run to ask for, and how requested limits are clamped into it."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from executor.backends import TIERS, Tier, parse_tiers
from executor.contract import LANGUAGES, Language, Limits
from executor.runtimes import DEFAULT_RUNTIME, Runtime, check_runtimes
from executor.seccomp import PROFILE_PATH

DEFAULT_IMAGE = "edgecoder-sandbox:bookworm"

# Docker's smallest CPU quota is 0.01 CPU; a program needs at least a millisecond to be a program.
MIN_CPUS = 0.01
MIN_TIMEOUT_MS = 1


@dataclass(frozen=True, slots=True)
class ExecutorPolicy:
    image: str = DEFAULT_IMAGE
    max_timeout_ms: int = 30_000
    max_memory_mb: int = 512
    min_memory_mb: int = 32
    max_cpus: float = 1.0
    allow_network: bool = False
    # Hygiene in front of the container, never the boundary: see executor/subset.py.
    subset_check: bool = True
    stdout_cap: int = 65_536
    stderr_cap: int = 65_536
    # Path of the seccomp profile (JSON): the shipped one (executor/seccomp.py) unless SANDBOX_SECCOMP_PROFILE names
    # another. It REPLACES Docker's default profile, so derive any other from that one. None: the daemon's default.
    seccomp_profile: str | None = str(PROFILE_PATH)
    max_concurrent: int = 2
    max_waiting: int = 16
    pool_size: int = 2
    # Pre-started containers are created with these limits; a run whose memory and cpus match uses one.
    pool_limits: Limits = field(default_factory=Limits)
    # Every container starts its program's interpreter before the code arrives (executor/supervisor.py); pool
    # containers do so for these languages, cycled over the pool's size. False: interpreters start on arrival.
    prestart: bool = True
    pool_languages: tuple[Language, ...] = LANGUAGES
    # Upper bounds of what travels into the container over stdin (code and JSON input), in bytes.
    max_code_bytes: int = 1 << 20
    max_input_bytes: int = 8 << 20
    # The isolation tiers this executor offers, weakest first (executor/backends/). A run goes to the weakest of
    # them that meets its minimum; with ("gvisor",) everything runs under gVisor.
    isolation: tuple[Tier, ...] = ("runc",)
    # The runtimes declared beyond `python` (whose image is `image`): executor/runtimes.py. An offer names one of
    # them or none (`python`); it never names an image.
    runtimes: tuple[Runtime, ...] = ()

    def __post_init__(self) -> None:
        if any(r.name == DEFAULT_RUNTIME for r in self.runtimes):
            raise ValueError(f"the {DEFAULT_RUNTIME!r} runtime is the policy's image, not a declared package list")
        check_runtimes((self.runtime(DEFAULT_RUNTIME), *self.runtimes))  # type: ignore[arg-type]
        if (
            not self.isolation
            or any(t not in TIERS for t in self.isolation)
            or len(set(self.isolation)) != len(self.isolation)
        ):
            raise ValueError(f"isolation must list distinct tiers of {', '.join(TIERS)}, not {self.isolation!r}")
        object.__setattr__(self, "isolation", tuple(sorted(self.isolation, key=TIERS.index)))  # weakest first
        if not self.min_memory_mb <= self.max_memory_mb:
            raise ValueError("min_memory_mb must not exceed max_memory_mb")
        if self.max_concurrent < 1 or self.max_waiting < 0 or self.pool_size < 0:
            raise ValueError("max_concurrent >= 1, max_waiting >= 0 and pool_size >= 0 are required")
        if not self.pool_languages or not set(self.pool_languages) <= set(LANGUAGES):
            raise ValueError(f"pool_languages must name some of {LANGUAGES}, not {self.pool_languages}")
        if self.clamp(self.pool_limits) != self.pool_limits:
            raise ValueError(f"pool_limits {self.pool_limits} lie outside the policy")

    @property
    def runtime_names(self) -> tuple[str, ...]:
        return (DEFAULT_RUNTIME, *(r.name for r in self.runtimes))

    def runtime(self, name: str) -> Runtime | None:
        """The declared runtime called `name`, or None: nothing else ever runs."""
        if name == DEFAULT_RUNTIME:
            return Runtime(DEFAULT_RUNTIME, (), image=self.image)
        return next((r for r in self.runtimes if r.name == name), None)

    def for_runtime(self, name: str) -> ExecutorPolicy:
        """This policy with the image of the declared runtime `name` (ValueError when it is not declared): every
        hardening setting is the same under every runtime; only the image differs."""
        runtime = self.runtime(name)
        if runtime is None:
            raise ValueError(f"runtime {name!r} is not declared here (declared: {', '.join(self.runtime_names)})")
        return dataclasses.replace(self, image=runtime.image, runtimes=())

    def clamp(self, limits: Limits) -> Limits:
        """Requested limits forced into the policy's bounds. Non-finite cpus become the ceiling."""
        cpus = limits.cpus if math.isfinite(limits.cpus) else self.max_cpus
        return Limits(
            timeout_ms=_between(int(limits.timeout_ms), MIN_TIMEOUT_MS, self.max_timeout_ms),
            memory_mb=_between(int(limits.memory_mb), self.min_memory_mb, self.max_memory_mb),
            # Round to what Docker can express (nano-cpus), so equal limits mean equal containers.
            cpus=round(min(max(cpus, MIN_CPUS), self.max_cpus), 2),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutorPolicy:
        env = os.environ if environ is None else environ
        return cls(
            image=env.get("EDGECODER_IMAGE") or DEFAULT_IMAGE,
            subset_check=env.get("EDGECODER_SUBSET_CHECK", "1").strip() != "0",
            seccomp_profile=env.get("SANDBOX_SECCOMP_PROFILE") or str(PROFILE_PATH),
            isolation=parse_tiers(env.get("EDGECODER_ISOLATION") or "runc"),
        )


def _between(value: int, low: int, high: int) -> int:
    return min(max(value, low), high)
