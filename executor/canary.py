"""The canary: proof, from inside a real container of each tier, that the policy's limits are really enforced.

A daemon can accept a limit and not enforce it: rootless Docker on cgroup v1 drops the memory and pids limits, a
daemon that does not see a cgroup controller discards its limit with no more than a warning (which the SDK
ignores), and `runsc --ignore-cgroups` runs gVisor with no host cgroup at all. So the gate runs this program as an
ordinary task, in a container made exactly as every other one is, and compares what it reads with the policy.

What it reads (CANARY_CODE), by name; a mismatch names the reading:

- `cgroup.memory`, `cgroup.pids`, `cgroup.cpus`: the container's own cgroup files, v1 (memory.limit_in_bytes,
  pids/pids.max, cpu.cfs_quota_us / cpu.cfs_period_us) or v2 (memory.max, pids.max, cpu.max). Checked under runc,
  where they are the host's own cgroup of the container.
- `meminfo.total`: MemTotal. Under gVisor it is the memory limit runsc found on the sandbox's host cgroup (the
  host total when runsc set none up); under runc it is the host's and is not judged.
- `nofile`, `nproc`: RLIMIT_NOFILE and RLIMIT_NPROC (gVisor's Sentry enforces RLIMIT_NPROC itself).
- `uid`, `gid`, `groups`: exactly the uid the executor drew for this container, its own group and no other.
- `cap_eff` (CapEff), `no_new_privs` (prctl PR_GET_NO_NEW_PRIVS, which gVisor answers but does not show in
  /proc/self/status), `seccomp` (the Seccomp mode: 2 is a filter; under gVisor only with `runsc --oci-seccomp`).
- `root_write`: the errno of a write under /var/tmp, which is mode 1777 in the image, so that only a read-only
  root refuses it (EROFS); a write to / would be refused for want of permission first under gVisor.
- `interfaces`: the network devices of /proc/net/dev, only `lo` without a network. Not /sys/class/net: runsc
  since 2024 (Debian's bookworm-backports and trixie builds) has no /sys/class/net at all under `--network=none`,
  which made the canary itself fail and withdrew the tier.
- `threads`: a thread starts (glibc's clone3 -> clone fallback needs the profile's ENOSYS for clone3, which
  runsc turned into EPERM: executor/backends/gvisor.py).

gVisor's own cgroupfs is its own bookkeeping, not the host's (runsc of 2022 mounts none at /sys/fs/cgroup; runsc of
2024 mounts its own, where pids.max reads "max"), and its CPU count has a floor of 2: nothing inside a gVisor
container shows the CPU quota or the host's pids ceiling. For that tier the canary also reads the host
cgroup of the container's sandbox process (`host.memory`, `host.pids`, `host.cpus`, through /proc/<pid>/cgroup),
which needs the daemon on this host; when it is elsewhere those readings cannot be made and the tier is withdrawn
(fail closed: not proven is not enforced).

Beside the host cgroup it reads `host.platform`, the gVisor platform the sandbox really runs on (systrap, ptrace,
kvm: `sandbox_platform`), from the sandbox process and its stubs. It is reported (doctor, /status), not judged:
ptrace isolates as well as systrap, at about 2.25x its cost per syscall.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Runs inside the sandbox as an ordinary task; prints what it observes as one JSON object.
CANARY_CODE = r"""
import ctypes, errno, json, os, resource, threading

def text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None

def number(value):
    return None if value is None or value == "max" else int(value)

v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
if v2:
    memory, pids = text("/sys/fs/cgroup/memory.max"), text("/sys/fs/cgroup/pids.max")
    quota, _, period = (text("/sys/fs/cgroup/cpu.max") or "max").partition(" ")
else:
    memory, pids = text("/sys/fs/cgroup/memory/memory.limit_in_bytes"), text("/sys/fs/cgroup/pids/pids.max")
    quota, period = text("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), text("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
cpus = None if number(quota) in (None, -1) or not period else round(int(quota) / int(period), 2)
meminfo = dict(line.split(":", 1) for line in (text("/proc/meminfo") or "").splitlines() if ":" in line)
status = dict(line.split(":", 1) for line in (text("/proc/self/status") or "").splitlines() if ":" in line)
libc = ctypes.CDLL(None, use_errno=True)
try:
    with open("/var/tmp/edgecoder-canary", "w"):
        root_write = "written"
except OSError as exc:
    root_write = errno.errorcode.get(exc.errno, str(exc.errno))
devices = [line.split(":", 1)[0].strip() for line in (text("/proc/net/dev") or "").splitlines()[2:] if ":" in line]
started = []
try:
    thread = threading.Thread(target=started.append, args=("ok",))
    thread.start()
    thread.join()
except RuntimeError as exc:
    started.append(str(exc))
print(json.dumps({
    "cgroup.version": 2 if v2 else 1,
    "cgroup.memory": number(memory),
    "cgroup.pids": "max" if pids == "max" else number(pids),
    "cgroup.cpus": cpus,
    "meminfo.total": int(meminfo["MemTotal"].split()[0]) * 1024 if "MemTotal" in meminfo else None,
    "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    "nproc": list(resource.getrlimit(resource.RLIMIT_NPROC)),
    "uid": os.getuid(),
    "gid": os.getgid(),
    "groups": os.getgroups(),
    "cap_eff": status.get("CapEff", "").strip(),
    "no_new_privs": libc.prctl(39, 0, 0, 0, 0),
    "seccomp": status.get("Seccomp", "").strip(),
    "root_write": root_write,
    "interfaces": sorted(devices),
    "threads": started[0] if started else "no result",
}))
"""

NO_CAPABILITIES = "0000000000000000"
SECCOMP_FILTER = "2"


@dataclass(frozen=True, slots=True)
class Finding:
    """One reading that does not match the policy."""

    reading: str
    saw: Any
    want: Any

    def __str__(self) -> str:
        return f"{self.reading}: saw {self.saw!r}, policy {self.want!r}"


def expected_everywhere(*, uid: int, nofile: int, nproc: int, network: bool) -> dict[str, Any]:
    """What every tier must show: the identity, the rlimits, the privileges, the root and the network."""
    expected: dict[str, Any] = {
        "uid": uid,
        "gid": uid,
        "groups": [uid],
        "nofile": [nofile, nofile],
        "nproc": [nproc, nproc],
        "cap_eff": NO_CAPABILITIES,
        "no_new_privs": 1,
        "seccomp": SECCOMP_FILTER,
        "root_write": "EROFS",
        "threads": "ok",
    }
    if not network:
        expected["interfaces"] = ["lo"]
    return expected


def judge(seen: dict[str, Any], expected: dict[str, Any]) -> list[Finding]:
    """Every expected reading that differs (a missing reading is `None`, which never matches)."""
    return [Finding(name, seen.get(name), want) for name, want in expected.items() if not _same(seen.get(name), want)]


def _same(saw: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(saw, int | float):
        return math.isclose(saw, want, abs_tol=0.005)
    return bool(saw == want)


def parse_output(stdout: str) -> dict[str, Any] | None:
    """The canary's JSON object, or None when its output is not one."""
    try:
        seen = json.loads(stdout)
    except ValueError:
        return None
    return seen if isinstance(seen, dict) else None


# -- the host side: the cgroup the daemon made for a container, seen from this host -----------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


def host_cgroup_readings(pid: int, container_id: str, *, root: Path = CGROUP_ROOT) -> dict[str, Any] | str:
    """`host.memory`, `host.pids` and `host.cpus` of the host cgroup that holds process `pid` (the container's
    sandbox process, from `State.Pid`), or why they cannot be read from here.

    The cgroup's path must name the container: a pid of another host or pid namespace is never mistaken for it.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as exc:
        return f"process {pid} of the container is not visible from this host ({exc.strerror})"
    paths: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    v2 = (root / "cgroup.controllers").exists()
    if v2:
        if container_id not in paths.get("", ""):
            return f"process {pid} is not in a cgroup of container {container_id[:12]}: {paths.get('', '')!r}"
        where = root / paths[""].lstrip("/")
        memory, pids = _text(where / "memory.max"), _text(where / "pids.max")
        quota, _, period = (_text(where / "cpu.max") or "max").partition(" ")
    else:
        for controller in ("memory", "pids", "cpu"):
            if container_id not in paths.get(controller, ""):
                return (
                    f"process {pid} is not in a {controller} cgroup of container {container_id[:12]}: "
                    f"{paths.get(controller, '')!r}"
                )
        memory = _text(root / "memory" / paths["memory"].lstrip("/") / "memory.limit_in_bytes")
        pids = _text(root / "pids" / paths["pids"].lstrip("/") / "pids.max")
        quota = _text(root / "cpu" / paths["cpu"].lstrip("/") / "cpu.cfs_quota_us") or "max"
        period = _text(root / "cpu" / paths["cpu"].lstrip("/") / "cpu.cfs_period_us") or ""
    return {
        "host.memory": _number(memory),
        "host.pids": "max" if pids == "max" else _number(pids),
        "host.cpus": None if _number(quota) in (None, -1) or not period else round(int(quota) / int(period), 2),
    }


def sandbox_platform(pid: int, *, proc: Path = Path("/proc")) -> str | None:
    """The gVisor platform the sandbox process `pid` (runsc-sandbox: the container's `State.Pid`) really runs on,
    read from the host, or None when it shows none (not a runsc sandbox, or gone).

    What the processes do comes first: under ptrace the Sentry traces each of its stub processes (a child's
    TracerPid is one of the sandbox's threads), under systrap the stubs run untraced. A platform without stubs
    (kvm) is known only by the flag runsc passed its sandbox process: runsc of 2024 passes `--platform=` on,
    runsc of 2022 only when it is not its default (ptrace).
    """
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        threads = {entry.name for entry in (proc / str(pid) / "task").iterdir()}
        children: set[str] = set()
        for tid in threads:
            children.update((proc / str(pid) / "task" / tid / "children").read_text().split())
    except OSError:
        return None
    if not Path(argv[0].decode(errors="replace")).name.startswith("runsc"):
        return None
    flag = next((a[len(b"--platform=") :].decode() for a in argv if a.startswith(b"--platform=")), None)
    tracers: set[str] = set()
    for child in children:
        status = _text(proc / child / "status") or ""
        tracers.update(line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:"))
    if tracers & threads:
        return "ptrace"
    if flag is not None:
        return flag
    return "systrap" if children else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(value: str | None) -> int | None:
    return None if value is None or value == "max" else int(value)
