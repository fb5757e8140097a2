"""The one place where a sandbox container's configuration is decided.

Every container the node creates (pooled or cold, under any tier) is made from `build_container_config`, and a unit
test pins the whole dict for each tier, so a flag cannot drift silently. The hardening here is shared by every
tier; a backend (executor/backends/) adds only its runtime's own keys: the runtime name, and under gVisor the
host's pids ceiling sized for gVisor's own threads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from executor.backends import SandboxBackend
from executor.bootstrap import BOOTSTRAP
from executor.contract import Limits
from executor.policy import ExecutorPolicy

# Every container runs as a uid (and gid) of its own from this range, never one of the host's users: per-uid
# kernel limits (inotify instances, pending signals, message queues) are then one sandbox's alone. The image's
# files are root's and world-readable, and /tmp is a fresh tmpfs (mode 1777), so no uid needs an account.
SANDBOX_UID_BASE = 2_000_000_000
SANDBOX_UID_COUNT = 1 << 20
MESH_LABEL = "edgecoder.mesh"
NODE_LABEL = "edgecoder.node"
ISOLATION_LABEL = "edgecoder.isolation"
# Processes of one run: the pids cgroup under runc, and RLIMIT_NPROC (the sandbox's uid is its own) under both
# tiers; under gVisor the Sentry enforces RLIMIT_NPROC itself, and the host's pids cgroup counts gVisor's threads.
PIDS_LIMIT = 50
NOFILE = 256
TMPFS = {"/tmp": "rw,noexec,nosuid,size=64m"}
# Setting MaskedPaths replaces Docker's own list, so its defaults (moby oci/defaults.go) come first. Added: host
# information no task needs (the kernel's symbols, command line and modules, the machine's DMI identity, and the
# boot id, which would also let runs recognise one host across offers).
DOCKER_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
MASKED_PATHS = (
    *DOCKER_MASKED_PATHS,
    "/proc/kallsyms",
    "/proc/cmdline",
    "/proc/sys/kernel/random/boot_id",
    "/sys/kernel",
    "/sys/module",
    "/sys/devices/virtual/dmi",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
# Without a network there is no resolver to name: Docker would copy the host's. Loopback refuses at once; "."
# means no search domain, and an option must be given or Docker copies the host's options too.
NO_NETWORK_DNS = {"Dns": ["127.0.0.1"], "DnsSearch": ["."], "DnsOptions": ["ndots:1"]}
# The bootstrap runs isolated (-I) and without site (-S): it only needs os, and nothing from the image's
# site-packages or the environment may steer it.
COMMAND = ["python3", "-I", "-S", "-c", BOOTSTRAP]
# The one shared key a backend may replace: gVisor's own threads count in the host's pids cgroup (its guest
# processes stay limited by RLIMIT_NPROC above).
RUNTIME_MAY_SET = frozenset({"PidsLimit"})


def build_container_config(
    request_limits_clamped: Limits,
    policy: ExecutorPolicy,
    *,
    labels: Mapping[str, str],
    uid: int,
    backend: SandboxBackend,
) -> dict[str, Any]:
    """Keyword arguments for `docker.APIClient.create_container`, host_config included.

    The limits must already be clamped by `policy.clamp`; `uid` is the container's own, from the sandbox range.
    Nothing of a request reaches this function but its clamped limits: the image is the policy's, and there are
    no mounts, binds or volumes (code and input enter over stdin only). The seccomp profile (the shipped one
    unless the policy names another) is read here and sent as JSON text (the API wants the profile itself, the
    CLI is what reads files).
    """
    if not SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_COUNT:
        raise ValueError(f"uid {uid} is outside the sandbox range")
    memory = request_limits_clamped.memory_mb * 1024 * 1024
    security_opt = ["no-new-privileges"]
    if policy.seccomp_profile:
        security_opt.append("seccomp=" + _seccomp_json(policy.seccomp_profile, backend.tier))
    host_config: dict[str, Any] = {
        "NetworkMode": "default" if policy.allow_network else "none",
        "ReadonlyRootfs": True,
        "Memory": memory,
        # Equal to Memory: no swap, so a memory bomb meets the OOM killer instead of the disk.
        "MemorySwap": memory,
        "NanoCpus": round(request_limits_clamped.cpus * 1e9),
        "PidsLimit": PIDS_LIMIT,
        "CapDrop": ["ALL"],
        "SecurityOpt": security_opt,
        "Tmpfs": dict(TMPFS),
        "Ulimits": [
            {"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE},
            {"Name": "nproc", "Soft": PIDS_LIMIT, "Hard": PIDS_LIMIT},
        ],
        # Output is read from the attach stream, bounded. The default json-file driver would also copy every
        # byte of an output flood to the host's disk.
        "LogConfig": {"Type": "none", "Config": {}},
        "MaskedPaths": list(MASKED_PATHS),
        "ReadonlyPaths": list(READONLY_PATHS),
    }
    if not policy.allow_network:
        host_config.update(NO_NETWORK_DNS)
    runtime_keys = backend.host_config(request_limits_clamped, policy)
    if overridden := (set(runtime_keys) & set(host_config)) - RUNTIME_MAY_SET:
        raise ValueError(f"the {backend.tier} backend may not override the shared hardening: {sorted(overridden)}")
    host_config.update(runtime_keys)
    return {
        "image": policy.image,
        "command": list(COMMAND),
        "user": f"{uid}:{uid}",
        "working_dir": "/tmp",
        "environment": [],
        # Without this the SDK copies proxy settings from ~/.docker/config.json into the environment.
        "use_config_proxy": False,
        "stdin_open": True,
        "tty": False,
        "labels": {**labels, MESH_LABEL: "1", ISOLATION_LABEL: backend.tier},
        "host_config": host_config,
    }


def _seccomp_json(path: str, tier: str) -> str:
    # Parsed and re-serialised: a broken profile fails here, closed, before any container exists. Read again only
    # when the file changes (about 0.3 ms a container otherwise).
    stat = Path(path).stat()
    return _seccomp_json_of(path, stat.st_mtime_ns, stat.st_size, tier)


@functools.lru_cache(maxsize=8)
def _seccomp_json_of(path: str, _mtime_ns: int, _size: int, tier: str) -> str:
    from executor.backends import backend_for

    profile = backend_for(tier).adapt_seccomp(json.loads(Path(path).read_text()))
    return json.dumps(profile, separators=(",", ":"))
