"""The container configuration, pinned field by field."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from executor import seccomp
from executor.backends import SandboxBackend, backend_for
from executor.backends.gvisor import GVISOR_HOST_PIDS
from executor.container_config import SANDBOX_UID_BASE, SANDBOX_UID_COUNT, build_container_config
from executor.contract import ExecRequest, Limits
from executor.policy import ExecutorPolicy

BOOTSTRAP_COMMAND_PREFIX = ["python3", "-I", "-S", "-c"]
UID = SANDBOX_UID_BASE + 12345


RUNC = backend_for("runc")
GVISOR = backend_for("gvisor")


def config_of(
    policy: ExecutorPolicy | None = None,
    limits: Limits | None = None,
    labels: dict[str, str] | None = None,
    backend: SandboxBackend = RUNC,
) -> dict[str, Any]:
    return build_container_config(
        limits or Limits(), policy or ExecutorPolicy(), labels=labels or {}, uid=UID, backend=backend
    )


@pytest.mark.parametrize("tier", ["runc", "gvisor"])
def test_every_field_is_pinned(tier: str) -> None:
    config = build_container_config(
        Limits(5000, 128, 0.5),
        ExecutorPolicy(),
        labels={"edgecoder.node": "n1"},
        uid=SANDBOX_UID_BASE + 7,
        backend=backend_for(tier),
    )
    command = config.pop("command")
    assert command[:4] == BOOTSTRAP_COMMAND_PREFIX and len(command) == 5
    security = config["host_config"].pop("SecurityOpt")
    assert security[0] == "no-new-privileges" and len(security) == 2
    # The shipped profile, as JSON text (under gVisor with clone3 let through to the Sentry: see below).
    assert json.loads(security[1].removeprefix("seccomp=")) == backend_for(tier).adapt_seccomp(seccomp.load())
    assert config == {
        "image": "edgecoder-sandbox:bookworm",
        "user": f"{SANDBOX_UID_BASE + 7}:{SANDBOX_UID_BASE + 7}",
        "working_dir": "/tmp",
        "environment": [],
        "use_config_proxy": False,
        "stdin_open": True,
        "tty": False,
        "labels": {"edgecoder.node": "n1", "edgecoder.mesh": "1", "edgecoder.isolation": tier},
        "host_config": {
            # Named on every container, never left to the daemon's default runtime.
            "Runtime": {"runc": "runc", "gvisor": "runsc"}[tier],
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "Memory": 128 * 1024 * 1024,
            "MemorySwap": 128 * 1024 * 1024,
            "NanoCpus": 500_000_000,
            # gVisor's own threads count in the host's pids cgroup; its guest processes stop at nproc = 50.
            "PidsLimit": {"runc": 50, "gvisor": GVISOR_HOST_PIDS}[tier],
            "CapDrop": ["ALL"],
            "Tmpfs": {"/tmp": "rw,noexec,nosuid,size=64m"},
            "Ulimits": [{"Name": "nofile", "Soft": 256, "Hard": 256}, {"Name": "nproc", "Soft": 50, "Hard": 50}],
            "LogConfig": {"Type": "none", "Config": {}},
            "MaskedPaths": [
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
                "/proc/kallsyms",
                "/proc/cmdline",
                "/proc/sys/kernel/random/boot_id",
                "/sys/kernel",
                "/sys/module",
                "/sys/devices/virtual/dmi",
            ],
            "ReadonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
            "Dns": ["127.0.0.1"],
            "DnsSearch": ["."],
            "DnsOptions": ["ndots:1"],
        },
    }


def test_the_uid_must_come_from_the_sandbox_range() -> None:
    for uid in (0, 65534, SANDBOX_UID_BASE - 1, SANDBOX_UID_BASE + SANDBOX_UID_COUNT):
        with pytest.raises(ValueError, match="sandbox range"):
            build_container_config(Limits(), ExecutorPolicy(), labels={}, uid=uid, backend=RUNC)


def test_the_shipped_profile_is_what_derive_promises() -> None:
    shipped = seccomp.load()
    seccomp.check(shipped)
    assert seccomp.derive(shipped) == shipped  # a fixed point: nothing in it that derive would still change
    allowed = {name for rule in shipped["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert not allowed & seccomp.DENIED
    assert {"read", "write", "execve", "clone", "mmap", "openat", "wait4"} <= allowed  # still a usable profile


@pytest.mark.parametrize(
    "loophole",
    [
        {"names": ["io_uring_setup"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 41, "op": "SCMP_CMP_LT"}]},
    ],
)
def test_check_refuses_a_profile_with_a_loophole(loophole: dict[str, Any]) -> None:
    profile = seccomp.load()
    profile["syscalls"].append(loophole)
    with pytest.raises(ValueError):
        seccomp.check(profile)


def test_check_refuses_compat_architectures() -> None:
    profile = seccomp.load()
    profile["archMap"][0]["subArchitectures"] = ["SCMP_ARCH_X86"]
    with pytest.raises(ValueError, match="compat"):
        seccomp.check(profile)


def test_dns_is_left_alone_when_the_network_is_allowed() -> None:
    host = config_of(ExecutorPolicy(allow_network=True))["host_config"]
    assert not {"Dns", "DnsSearch", "DnsOptions"} & set(host)


def test_no_mount_of_any_kind() -> None:
    config = config_of()
    text = json.dumps(config).lower()
    for word in ("binds", "mounts", "volumes", "volumesfrom", "devices", "privileged"):
        assert f'"{word}"' not in text


def test_mesh_label_cannot_be_overridden_by_the_node() -> None:
    config = config_of(labels={"edgecoder.mesh": "0"})
    assert config["labels"]["edgecoder.mesh"] == "1"


def test_seccomp_profile_travels_as_json_text_not_a_path(tmp_path: Path) -> None:
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile, indent=2))
    config = config_of(ExecutorPolicy(seccomp_profile=str(path)))
    security = config["host_config"]["SecurityOpt"]
    assert security[0] == "no-new-privileges"
    assert security[1].startswith("seccomp=")
    assert json.loads(security[1].removeprefix("seccomp=")) == profile
    assert len(security) == 2


def test_a_broken_seccomp_profile_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError):
        config_of(ExecutorPolicy(seccomp_profile=str(path)))
    with pytest.raises(OSError):
        config_of(ExecutorPolicy(seccomp_profile=str(tmp_path / "absent")))


def test_network_only_when_the_policy_allows_it() -> None:
    config = config_of(ExecutorPolicy(allow_network=True))
    assert config["host_config"]["NetworkMode"] == "default"


def test_limits_map_to_docker_units() -> None:
    host = config_of(limits=Limits(1000, 33, 0.01))["host_config"]
    assert (host["Memory"], host["MemorySwap"], host["NanoCpus"]) == (33 << 20, 33 << 20, 10_000_000)


def test_the_gvisor_tier_refuses_a_policy_with_a_network() -> None:
    with pytest.raises(ValueError, match="network=none"):
        config_of(ExecutorPolicy(allow_network=True), backend=GVISOR)


class Weakening:
    """A backend that tries to switch a shared flag off."""

    tier = "runc"
    runtime = "runc"
    host_witness = False

    def host_config(self, limits: Limits, policy: ExecutorPolicy) -> dict[str, Any]:
        return {"Runtime": "runc", "CapDrop": []}


def test_no_backend_may_override_the_shared_hardening() -> None:
    with pytest.raises(ValueError, match="CapDrop"):
        config_of(backend=Weakening())  # type: ignore[arg-type]


# -- an offer never chooses the image or any mount ----------------------------------------------------------------
# The November 2025 runc escapes (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881) need an attacker-controlled image
# or mount configuration. These tests pin that nothing an offerer sends can name either.

FORBIDDEN_WORDS = ("image", "mount", "bind", "volume", "device", "runtime", "privileged", "cap", "security")


def test_neither_an_offer_nor_a_run_request_has_a_field_for_an_image_or_a_mount() -> None:
    from transports.wire.offers import TaskOffer

    for schema in (TaskOffer, ExecRequest, Limits):
        names = [f.name.lower() for f in dataclasses.fields(schema)]
        assert not [n for n in names if any(word in n for word in FORBIDDEN_WORDS)], (schema.__name__, names)


def test_an_offers_needs_name_a_declared_runtime_and_nothing_that_reaches_the_container() -> None:
    """Offer v3's needs: `runtime` is the name of one of the operator's declared package sets (never an image, and
    not the container runtime: the tier is the node's, `minIsolation` only a minimum). The executor refuses any name
    the policy does not declare, and a declared one changes the image and nothing else (tests/test_runtimes_docker.py
    proves both on the daemon)."""
    from transports.wire.needs import Needs, Resources

    for schema in (Needs, Resources):
        names = [f.name.lower() for f in dataclasses.fields(schema)]
        words = [w for w in FORBIDDEN_WORDS if w != "runtime"]
        assert not [n for n in names if any(word in n for word in words)], (schema.__name__, names)
    assert ExecutorPolicy().runtime("edgecoder-sandbox:bookworm") is None


def test_container_creation_takes_nothing_of_a_request_but_its_clamped_limits() -> None:
    parameters = list(inspect.signature(build_container_config).parameters)
    assert parameters == ["request_limits_clamped", "policy", "labels", "uid", "backend"]
    config = config_of()
    assert config["image"] == ExecutorPolicy().image
    assert not {"Binds", "Mounts", "VolumesFrom", "Devices", "Privileged"} & set(config["host_config"])


def test_under_gvisor_only_clone3_changes_and_it_goes_to_the_sentry() -> None:
    """runsc answers every SCMP_ACT_ERRNO rule with EPERM (google/gvisor#14688), so clone3's ENOSYS rule, which
    glibc needs to fall back to clone, is an allow rule under gVisor, where the Sentry answers ENOSYS itself."""
    shipped = seccomp.load()
    adapted = GVISOR.adapt_seccomp(shipped)
    seccomp.check(adapted)
    assert RUNC.adapt_seccomp(shipped) == shipped
    removed = [r for r in shipped["syscalls"] if r not in adapted["syscalls"]]
    added = [r for r in adapted["syscalls"] if r not in shipped["syscalls"]]
    assert removed == [
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "excludes": {"caps": ["CAP_SYS_ADMIN"]}}
    ]
    assert added == [{"names": ["clone3"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}}]
    assert {**adapted, "syscalls": None} == {**shipped, "syscalls": None}
