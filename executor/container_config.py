"""The one place where a sandbox container's configuration is decided.

Every container the node creates (pooled or cold) is made from `build_container_config`, and a unit test pins
the whole dict, so a flag cannot drift silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from executor.bootstrap import BOOTSTRAP
from executor.contract import Limits
from executor.policy import ExecutorPolicy

SANDBOX_USER = "65534:65534"
MESH_LABEL = "edgecoder.mesh"
NODE_LABEL = "edgecoder.node"
PIDS_LIMIT = 50
NOFILE = 256
TMPFS = {"/tmp": "rw,noexec,nosuid,size=64m"}
# The bootstrap runs isolated (-I) and without site (-S): it only needs os, and nothing from the image's
# site-packages or the environment may steer it.
COMMAND = ["python3", "-I", "-S", "-c", BOOTSTRAP]


def build_container_config(
    request_limits_clamped: Limits, policy: ExecutorPolicy, *, labels: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments for `docker.APIClient.create_container`, host_config included.

    The limits must already be clamped by `policy.clamp`. No mounts, binds or volumes: code and input enter over
    stdin only. A seccomp profile, when configured, is read here and sent as JSON text (the API wants the
    profile itself, the CLI is what reads files).
    """
    memory = request_limits_clamped.memory_mb * 1024 * 1024
    security_opt = ["no-new-privileges"]
    if policy.seccomp_profile:
        security_opt.append("seccomp=" + _seccomp_json(policy.seccomp_profile))
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
        "Ulimits": [{"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE}],
        # Output is read from the attach stream, bounded. The default json-file driver would also copy every
        # byte of an output flood to the host's disk.
        "LogConfig": {"Type": "none", "Config": {}},
    }
    return {
        "image": policy.image,
        "command": list(COMMAND),
        "user": SANDBOX_USER,
        "working_dir": "/tmp",
        "environment": [],
        # Without this the SDK copies proxy settings from ~/.docker/config.json into the environment.
        "use_config_proxy": False,
        "stdin_open": True,
        "tty": False,
        "labels": {**labels, MESH_LABEL: "1"},
        "host_config": host_config,
    }


def _seccomp_json(path: str) -> str:
    # Parsed and re-serialised: a broken profile fails here, closed, before any container exists.
    return json.dumps(json.loads(Path(path).read_text()), separators=(",", ":"))
