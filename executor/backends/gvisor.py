"""The gVisor tier: Docker with `runtime="runsc"`, a second kernel between the program and the host's.

The program's syscalls are served by gVisor's Sentry, a kernel in user space; the host kernel sees only the
Sentry's own, under gVisor's seccomp filter. Every flag of the shared hardening stays on.

The platform is how the Sentry takes the program's syscalls. runsc is registered with `--platform=systrap`
(Debian's bookworm-backports runsc 0.0~20240729; scripts/setup.sh installs it): systrap traps them with a seccomp
filter in the program's own stub processes, about 2.25x cheaper per syscall than ptrace, the only platform of
bookworm's own runsc 0.0~20221219 (KVM hangs on a host without nested virtualisation). The platform a container
really got is read from the host by the canary (executor/canary.py, `host.platform`), never taken from the
registration. A second registration, `runsc-ptrace` (PTRACE_RUNTIME), exists for benchmarks/bench_isolation.py's
side-by-side figures only: the tier never names it.

Facts of runsc (both builds unless said) that shape the rest:

- runsc applies the OCI seccomp profile (ours) to the program only when registered with `--oci-seccomp`; without
  it, Seccomp reads 0 inside. The registration (executor/backends/registration.py) passes it, the daemon check
  below demands it, and the canary reads the mode.
- runsc applies every SCMP_ACT_ERRNO rule as EPERM: its OCI converter never reads `errnoRet`
  (google/gvisor#14688). The profile answers clone3 with ENOSYS, so that glibc falls back to clone (clone3's
  flags live in memory where seccomp cannot look); under runsc it got EPERM, and no thread could start: Python's
  threading and Node.js itself failed. So this tier lets clone3 through the filter (`adapt_seccomp`), where the
  Sentry itself answers ENOSYS (this runsc does not implement clone3; the canary's `threads` reading proves the
  fallback works). The host kernel never sees the call either way: only the Sentry does.
- Under `network=sandbox` this runsc fails behind Docker ("cannot run with network enabled in root network
  namespace"); `--network=none` gives the Sentry no host network at all, only its own loopback, which is what
  the policy asks for anyway. So this tier refuses a policy that allows the network.
- The host's pids cgroup counts the Sentry's and the ptrace stubs' threads, not the program's processes: an idle
  sandbox holds 38, and each guest process about 5 more (292 measured with 50 guest processes, up to 740 during a
  fork storm). At the runc tier's 50 the Sentry itself panics after two forks. So the host ceiling is
  GVISOR_HOST_PIDS, and the program's own
  processes are held at PIDS_LIMIT by RLIMIT_NPROC, which the Sentry enforces (EAGAIN at the limit).
- What else the registration says (`--ignore-cgroups`, which leaves the sandbox without any host limit, or a
  wrapper in place of /usr/bin/runsc) is not judged from the arguments: the canary proves the limits or withdraws
  the tier.
- The memory limit is the host cgroup's, and it counts the Sentry's own memory too: a program has a little less
  than under runc. runsc reports the limit it finds on that cgroup as MemTotal inside, which the canary checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from executor.backends import Tier
from executor.contract import Limits
from executor.policy import ExecutorPolicy

RUNTIME = "runsc"
RUNSC_PATH = "/usr/bin/runsc"
# The arguments every registration of the runtime must carry (see the module docstring).
REQUIRED_ARGS = ("--network=none", "--oci-seccomp")
PLATFORM = "systrap"
RUNTIME_ARGS = (f"--platform={PLATFORM}", *REQUIRED_ARGS)
# The registration setup.sh wrote before systrap (bookworm's runsc had ptrace only): replaced where it is found.
PTRACE_ARGS = ("--platform=ptrace", *REQUIRED_ARGS)
PTRACE_RUNTIME = "runsc-ptrace"
ENOSYS = 38
CLONE3_THROUGH = {"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}
# The host's pids ceiling of one gVisor sandbox: 38 threads idle + about 5 per guest process (292 measured with
# PIDS_LIMIT guest processes at rest); under a fork storm the Sentry's own threads peaked at 349 (256 MiB) to 740
# (512 MiB) host tasks, and at 512 the Sentry died of the ceiling instead of the storm meeting RLIMIT_NPROC.
GVISOR_HOST_PIDS = 1024
FIX = (
    "install runsc from Debian's backports (apt-get install -t bookworm-backports runsc) and register it with the "
    'daemon: scripts/setup.sh does both, writing /etc/docker/daemon.json {"runtimes": {"runsc": {"path": '
    '"/usr/bin/runsc", "runtimeArgs": ["--platform=systrap", "--network=none", "--oci-seccomp"]}}}; then reload '
    "dockerd (SIGHUP, or systemctl reload docker)"
)


class GvisorBackend:
    tier: Tier = "gvisor"
    host_witness = True

    def __init__(self, runtime: str = RUNTIME) -> None:
        # Another registration of runsc only for a side-by-side measurement (PTRACE_RUNTIME); nodes use RUNTIME.
        self.runtime = runtime

    def host_config(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        if policy.allow_network:
            raise ValueError("the gvisor tier runs with runsc --network=none: a policy that allows the network")
        return {"Runtime": self.runtime, "PidsLimit": GVISOR_HOST_PIDS}

    def adapt_seccomp(self, profile: dict[str, Any]) -> dict[str, Any]:
        """clone3's ENOSYS rule becomes an allow rule (see the module docstring): the Sentry answers ENOSYS."""
        rules = []
        for rule in profile.get("syscalls") or []:
            if rule.get("action") == "SCMP_ACT_ERRNO" and rule.get("errnoRet") == ENOSYS and "clone3" in rule["names"]:
                others = [name for name in rule["names"] if name != "clone3"]
                if others:
                    rules.append({**rule, "names": others})
                rules.append({key: value for key, value in rule.items() if key != "errnoRet"} | CLONE3_THROUGH)
            else:
                rules.append(rule)
        return {**profile, "syscalls": rules}

    def daemon_problem(self, info: Mapping[str, Any]) -> str | None:
        runtimes = info.get("Runtimes") or {}
        if self.runtime not in runtimes:
            return f"the Docker daemon has no {self.runtime!r} runtime (it has {sorted(runtimes)}); fix: {FIX}"
        args = list((runtimes[self.runtime] or {}).get("runtimeArgs") or [])
        missing = [arg for arg in REQUIRED_ARGS if arg not in args]
        if missing:
            return f"the daemon's {self.runtime!r} runtime lacks {' '.join(missing)} (it has {args}); fix: {FIX}"
        return None

    def expected(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        memory = limits.memory_mb << 20
        return {
            "meminfo.total": memory,
            "host.memory": memory,
            "host.pids": GVISOR_HOST_PIDS,
            "host.cpus": limits.cpus,
        }
