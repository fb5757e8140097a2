"""The sandbox's seccomp profile: Docker's default one, tightened, shipped with the project and used by default.

`SANDBOX_SECCOMP_PROFILE` (a path) replaces it, as before. executor/seccomp.json is `derive(upstream)`, where
upstream is moby's default profile as of UPSTREAM; to follow a newer upstream:

    python -m executor.seccomp derive path/to/upstream/default.json > executor/seccomp.json

What `derive` changes, each checked from inside a container by tests/test_executor_sandbox.py:
- Denied (removed from every allow rule, so the profile's default action answers EPERM): io_uring_setup,
  io_uring_enter, io_uring_register (this Debian daemon's own profile allows them); userfaultfd; memfd_create and
  memfd_secret (an ELF written to a memfd ran despite the noexec /tmp); ptrace, process_vm_readv,
  process_vm_writev, pidfd_getfd, kcmp, process_madvise (nothing may reach into another process: the supervisor
  holds the run's nonce); socketcall.
- socket() only for address families below AF_ALG (38): AF_ALG, AF_NFC, AF_VSOCK (40: vsock is not covered by
  --network=none, and this host is a Firecracker guest with the virtio vsock transport loaded), AF_KCM, AF_XDP
  and every later family are refused. socketpair() only for AF_UNIX.
- No 32-bit compat architectures (x86 and x32 under x86_64, arm under aarch64): through the i386 `socketcall`
  multiplexer, whose arguments live in memory where seccomp cannot look, machine code in an executable mapping
  created an AF_VSOCK socket even under upstream's own socket rule. Their syscalls now never reach the kernel.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

PROFILE_PATH = Path(__file__).resolve().with_name("seccomp.json")
UPSTREAM = (
    "github.com/moby/moby b985e2313a8676e18072b442911fc8f64f17d440 (2026-08-23): "
    "vendor/github.com/moby/profiles/seccomp/default.json"
)
DENIED = frozenset(
    {
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "userfaultfd",
        "memfd_create",
        "memfd_secret",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "pidfd_getfd",
        "kcmp",
        "process_madvise",
        "socketcall",
    }
)
AF_UNIX = 1
AF_ALG = 38  # socket() is allowed only for families below this one
SOCKET_RULES = [
    {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": AF_ALG, "op": "SCMP_CMP_LT"}]},
    {
        "names": ["socketpair"],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"}],
    },
]


def derive(upstream: dict[str, Any]) -> dict[str, Any]:
    """Our profile from Docker's: the denials, socket rules and architectures above; nothing else changes."""
    profile = copy.deepcopy(upstream)
    for arch in profile.get("archMap") or []:
        arch["subArchitectures"] = None
    rules = []
    for rule in profile["syscalls"]:
        names = [name for name in rule["names"] if name not in DENIED and name not in ("socket", "socketpair")]
        if names:
            rules.append({**rule, "names": names})
    profile["syscalls"] = rules + copy.deepcopy(SOCKET_RULES)
    check(profile)
    return profile


def check(profile: dict[str, Any]) -> None:
    """Raise ValueError unless `profile` has every property `derive` promises."""
    if profile.get("defaultAction") != "SCMP_ACT_ERRNO":
        raise ValueError("the default action must refuse")
    for rule in profile["syscalls"]:
        if rule["action"] != "SCMP_ACT_ALLOW":
            continue
        allowed = set(rule["names"])
        if allowed & DENIED:
            raise ValueError(f"allowed although denied: {sorted(allowed & DENIED)}")
        if allowed & {"socket", "socketpair"} and rule not in SOCKET_RULES:
            raise ValueError(f"socket or socketpair allowed beyond the shipped rules: {rule}")
    for arch in profile.get("archMap") or []:
        if arch.get("subArchitectures"):
            raise ValueError(f"compat architectures allowed under {arch['architecture']}")


def load(path: str | Path = PROFILE_PATH) -> dict[str, Any]:
    profile: dict[str, Any] = json.loads(Path(path).read_text())
    return profile


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "derive":
        print("usage: python -m executor.seccomp derive UPSTREAM.json > executor/seccomp.json", file=sys.stderr)
        return 2
    print(json.dumps(derive(load(argv[1])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
