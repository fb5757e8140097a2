"""`edgecoder doctor`'s checks, judged from what a daemon answers (its /info and /version), and its runc flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from executor.policy import ExecutorPolicy
from mesh.doctor import (
    RUNC_CVES,
    cgroup_check,
    platform_check,
    runc_check,
    runc_version_tuple,
    runsc_check,
    seccomp_check,
)

SECCOMP_ON = {"SecurityOptions": ["name=seccomp,profile=default"]}
ABLE = {"MemoryLimit": True, "SwapLimit": True, "PidsLimit": True, "CpuCfsQuota": True}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("1.1.5+ds1", (1, 1, 5)), ("runc version 1.2.8", (1, 2, 8)), ("v1.3.0-rc.1", (1, 3, 0)), ("dev", None)],
)
def test_runc_versions_are_read_from_what_daemons_say(text: str, parsed: tuple[int, int, int] | None) -> None:
    assert runc_version_tuple(text) == parsed


@pytest.mark.parametrize(
    ("version", "level"),
    [("1.1.5+ds1", "warn"), ("1.2.7", "warn"), ("1.2.8", "ok"), ("1.3.3", "ok"), ("", "warn"), ("unknown", "warn")],
)
def test_a_runc_without_the_november_2025_fixes_is_flagged(version: str, level: str) -> None:
    found = runc_check(version)
    assert found["level"] == level and found["ok"]  # a warning, never a failure: offers cannot reach the escapes
    if level == "warn" and version:
        assert all(cve in found["detail"] for cve in RUNC_CVES) and "1.2.8" in found["fix"]


def test_a_daemon_that_cannot_enforce_a_limit_fails_with_the_limit_named() -> None:
    assert cgroup_check({"CgroupVersion": "2", "CgroupDriver": "systemd", **ABLE})["level"] == "ok"
    dropped = cgroup_check({"CgroupVersion": "1", "CgroupDriver": "cgroupfs", **ABLE, "PidsLimit": False})
    assert dropped["level"] == "fail" and "cannot enforce pids limits" in dropped["detail"] and dropped["fix"]
    rootless = {"CgroupVersion": "1", "SecurityOptions": ["name=seccomp,profile=default", "name=rootless"], **ABLE}
    assert cgroup_check(rootless)["level"] == "fail" and "rootless" in cgroup_check(rootless)["detail"]


def runtimes(args: list[str] | None) -> dict[str, Any]:
    info: dict[str, Any] = {"Runtimes": {"runc": {"path": "runc"}}}
    if args is not None:
        info["Runtimes"]["runsc"] = {"path": "/usr/bin/runsc", "runtimeArgs": args}
    return info


def test_runsc_registration_is_judged_by_its_arguments() -> None:
    good = ["--platform=ptrace", "--network=none", "--oci-seccomp"]
    assert runsc_check(runtimes(good), offered=True)["level"] == "ok"
    assert runsc_check(runtimes(None), offered=True)["level"] == "fail"
    assert runsc_check(runtimes(None), offered=False)["level"] == "info"  # not offered: a fact, not a failure
    lacking = runsc_check(runtimes(["--network=none"]), offered=True)
    assert lacking["level"] == "fail" and "--oci-seccomp" in lacking["detail"]
    assert runsc_check(runtimes([*good, "--ignore-cgroups"]), offered=True)["level"] == "warn"


def test_the_seccomp_profile_in_use_is_named_and_checked(tmp_path: Path) -> None:
    shipped = seccomp_check(SECCOMP_ON, ExecutorPolicy())
    assert shipped["level"] == "ok" and "the shipped profile" in shipped["detail"] and "sha256" in shipped["detail"]
    loophole = tmp_path / "open.json"
    loophole.write_text('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}')
    refused = seccomp_check(SECCOMP_ON, ExecutorPolicy(seccomp_profile=str(loophole)))
    assert refused["level"] == "fail" and "default action must refuse" in refused["detail"]
    assert seccomp_check({"SecurityOptions": []}, ExecutorPolicy())["level"] == "fail"


def test_the_gvisor_platform_is_reported_and_ptrace_is_a_warning() -> None:
    assert platform_check("systrap", offered=True)["level"] == "ok"
    ptrace = platform_check("ptrace", offered=True)
    assert ptrace["level"] == "warn" and "2.25x" in ptrace["detail"] and "bookworm-backports" in ptrace["fix"]
    assert platform_check("ptrace", offered=False)["level"] == "info"  # not offered: a fact
    assert platform_check(None, offered=True)["level"] == "warn"  # not read is not assumed
