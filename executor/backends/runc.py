"""The runc tier: Docker's default runtime with the shared hardening (executor/container_config.py).

The program's syscalls reach the host kernel, through the seccomp profile. Its limits are the container's own
cgroup, which the container sees as /sys/fs/cgroup: the canary reads them there, v1 or v2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executor.backends import Tier
from executor.container_config import PIDS_LIMIT
from executor.contract import Limits
from executor.policy import ExecutorPolicy

RUNTIME = "runc"


class RuncBackend:
    tier: Tier = "runc"
    runtime = RUNTIME
    host_witness = False

    def host_config(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        # Named explicitly: a daemon whose default runtime is something else must not change the tier unseen.
        return {"Runtime": RUNTIME}

    def adapt_seccomp(self, profile: dict[str, Any]) -> dict[str, Any]:
        return profile  # runc applies the profile as written, errnoRet included

    def daemon_problem(self, info: Mapping[str, Any]) -> str | None:
        runtimes = info.get("Runtimes") or {}
        if RUNTIME not in runtimes:
            return f"the Docker daemon has no {RUNTIME!r} runtime (it has {sorted(runtimes)}); reinstall docker.io"
        return None

    def expected(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        return {
            "cgroup.memory": limits.memory_mb << 20,
            "cgroup.pids": PIDS_LIMIT,
            "cgroup.cpus": limits.cpus,
        }
