"""`edgecoder doctor`: what an operator needs to know about this machine's sandbox, check by check, with the fix.

It reports the Docker, runc and runsc versions, the cgroup version, whether userns-remap or rootless mode is on,
the seccomp profile in use, and a fresh canary per isolation tier (executor/canary.py). It flags a runc without the
November 2025 fixes, and says why the node never lets an offer choose its image or any mount.

Levels: `ok`; `warn` (the node can sandbox, but the operator should act); `fail` (a tier the node offers cannot
run: the node would refuse its work); `info` (a fact, or a tier the node does not offer). The report is ok when no
check fails.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executor.policy import ExecutorPolicy

# runc 1.2.8 (and 1.3.3, 1.4.0-rc.3) fixed three container escapes published in November 2025. Each needs the
# attacker to control the image or the mount configuration of a container.
RUNC_FIXED = (1, 2, 8)
RUNC_CVES = ("CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881")
IMAGE_AND_MOUNTS = (
    "an offer carries only language, code, JSON input, limits and a runtime's name: the images are the "
    "operator's (executor.image, executor.runtimes: Debian package lists built here), an undeclared runtime never "
    "runs, and no container has any bind, volume or device (executor/container_config.py), so the "
    "runc escapes that need an attacker-chosen image or mount ({cves}) have nothing to work with"
).format(cves=", ".join(RUNC_CVES))


def check(name: str, level: str, detail: str, fix: str = "") -> dict[str, Any]:
    return {"name": name, "ok": level != "fail", "level": level, "detail": detail, "fix": fix}


def runc_version_tuple(text: str) -> tuple[int, int, int] | None:
    """(1, 1, 5) from "1.1.5+ds1", "runc version 1.2.8" or "v1.3.0-rc.1"; None when no version is in it."""
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3]))


def runc_check(version: str | None) -> dict[str, Any]:
    if not version:
        return check("runc", "warn", "the daemon does not say which runc it uses", "docker version --format json")
    parsed = runc_version_tuple(version)
    if parsed is None or parsed < RUNC_FIXED:
        return check(
            "runc",
            "warn",
            f"runc {version}: upstream fixed {', '.join(RUNC_CVES)} in 1.2.8; this version predates it "
            "(a distribution may have backported the fixes: check its security tracker). Offers cannot reach "
            "them: see `image and mounts`",
            "install runc >= 1.2.8 (or the distribution's fixed build), or run remote work under gVisor: "
            "edgecoder node --isolation gvisor",
        )
    return check("runc", "ok", f"runc {version} (has the November 2025 fixes)")


def runsc_check(info: dict[str, Any], offered: bool) -> dict[str, Any]:
    from executor.backends.gvisor import FIX, REQUIRED_ARGS, RUNTIME

    registered = (info.get("Runtimes") or {}).get(RUNTIME)
    local = shutil.which("runsc")
    version = _runsc_version(local) if local else None
    where = f"{local}: {version}" if local else "no runsc on this host's PATH"
    missing_level = "fail" if offered else "info"
    if registered is None:
        return check("runsc (gVisor)", missing_level, f"{where}; not registered with the daemon", FIX)
    args = list(registered.get("runtimeArgs") or [])
    missing = [a for a in REQUIRED_ARGS if a not in args]
    detail = f"{where}; registered as {RUNTIME!r}: {registered.get('path')} {' '.join(args)}".rstrip()
    if missing:
        return check("runsc (gVisor)", missing_level, f"{detail}; lacks {' '.join(missing)}", FIX)
    if "--ignore-cgroups" in args:
        return check(
            "runsc (gVisor)",
            "warn",
            f"{detail}: with --ignore-cgroups runsc sets up no host cgroup, so no memory, CPU or pids limit holds "
            "(the gVisor canary withdraws the tier)",
            f"drop --ignore-cgroups; {FIX}",
        )
    return check("runsc (gVisor)", "ok", detail)


def _runsc_version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0].strip() if done.stdout else None


def cgroup_check(info: dict[str, Any]) -> dict[str, Any]:
    version, driver = str(info.get("CgroupVersion") or "?"), info.get("CgroupDriver") or "?"
    rootless = any("name=rootless" in str(o) for o in info.get("SecurityOptions") or [])
    if rootless and version == "1":
        return check(
            "cgroups",
            "fail",
            f"cgroup v{version} ({driver}) under rootless Docker: the daemon drops every memory and pids limit",
            "run the daemon as root, or boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1)",
        )
    mode = "rootless" if rootless else "rootful"
    # What the daemon itself says it can enforce (GET /info): a limit it cannot, it discards with a warning.
    abilities = {"memory": "MemoryLimit", "swap": "SwapLimit", "pids": "PidsLimit", "CPU quota": "CpuCfsQuota"}
    missing = [name for name, key in abilities.items() if info.get(key) is False]
    detail = f"cgroup v{version}, driver {driver}, {mode} daemon"
    if missing:
        return check(
            "cgroups",
            "fail",
            f"{detail}; the daemon cannot enforce {', '.join(missing)} limits (the cgroup controller is not "
            "mounted, or the kernel lacks it): it would discard them",
            "mount the controller's cgroup hierarchy (or boot with it enabled, e.g. cgroup_enable=memory "
            "swapaccount=1) and restart the daemon",
        )
    return check("cgroups", "ok", f"{detail}; it enforces memory, swap, pids and CPU quota limits")


def userns_check(info: dict[str, Any]) -> dict[str, Any]:
    on = any("name=userns" in str(o) for o in info.get("SecurityOptions") or [])
    if on:
        return check(
            "userns-remap",
            "info",
            "on: every container's uids map into one host range, so RLIMIT_NPROC is shared between sandboxes "
            "(moby #27444); the pids cgroup still holds each one",
        )
    return check(
        "userns-remap",
        "info",
        "off: each sandbox runs as a host uid of its own (2000000000 + a random draw), never one of the host's users",
    )


def seccomp_check(info: dict[str, Any], policy: ExecutorPolicy) -> dict[str, Any]:
    from executor import seccomp

    daemon_has = any("name=seccomp" in str(o) for o in info.get("SecurityOptions") or [])
    if not daemon_has:
        return check(
            "seccomp",
            "fail",
            "the daemon has no seccomp support: no profile can be applied",
            "use a Docker built with seccomp (Debian's docker.io is)",
        )
    if policy.seccomp_profile is None:
        return check("seccomp", "warn", "the daemon's default profile (no profile set)", "unset the profile setting")
    path = Path(policy.seccomp_profile)
    try:
        text = path.read_bytes()
        profile = seccomp.load(path)
        seccomp.check(profile)
    except (OSError, ValueError) as exc:
        return check(
            "seccomp",
            "fail",
            f"{path}: {exc}",
            "give a profile derived from Docker's (python -m executor.seccomp derive)",
        )
    shipped = path.resolve() == seccomp.PROFILE_PATH
    which = "the shipped profile" if shipped else "the operator's profile"
    detail = f"{which} {path} (sha256 {hashlib.sha256(text).hexdigest()[:12]}), checked: {seccomp.__name__}.check"
    return check("seccomp", "ok", detail)


async def run_doctor(policy: ExecutorPolicy, mode: str) -> dict[str, Any]:
    """Every check, with the fix for each failure (see the module docstring for the levels)."""
    from executor.backends import TIERS
    from executor.containers import DOCKER_ERRORS
    from executor.runner import Executor

    checks = [check("SANDBOX_MODE", "ok" if mode == "docker" else "fail", mode, "unset it, or set it to docker")]
    tiers: dict[str, Any] = {}
    if mode != "docker":
        return _report(checks, tiers)
    import dataclasses

    # Every tier is tried, so an operator sees what gVisor would need before choosing it; only the offered ones
    # can fail the report.
    every = dataclasses.replace(policy, isolation=TIERS)
    async with Executor.open(every, node_label="doctor", pool_size=0) as executor:
        try:
            version, info = await executor.sandbox.docker.call(lambda api: (api.version(), api.info()))
        except DOCKER_ERRORS as exc:
            checks.append(
                check(
                    "docker daemon",
                    "fail",
                    f"cannot reach the Docker daemon: {exc}",
                    "start Docker (systemctl start docker; as root, scripts/setup.sh starts dockerd), or point "
                    "DOCKER_HOST at it",
                )
            )
            return _report(checks, tiers)
        components = {c.get("Name"): c.get("Version") for c in version.get("Components") or []}
        checks.append(
            check(
                "docker daemon",
                "ok",
                f"Docker {version.get('Version')} (API {version.get('ApiVersion')}), "
                f"containerd {components.get('containerd', '?')}, default runtime {info.get('DefaultRuntime')}",
            )
        )
        checks.append(runc_check(components.get("runc")))
        checks.append(runsc_check(info, "gvisor" in policy.isolation))
        checks.append(cgroup_check(info))
        checks.append(userns_check(info))
        checks.append(seccomp_check(info, policy))
        checks.append(check("image and mounts", "info", IMAGE_AND_MOUNTS))
        built = await executor.refresh_runtimes()
        for name in policy.runtime_names:
            info = built.get(name)
            if info is not None:
                detail = (
                    f"{info.image} digest {info.digest} ({len(info.packages)} packages: {', '.join(info.packages)})"
                )
                checks.append(check(f"runtime {name}", "ok", detail))
            else:
                declared = policy.runtime(name)
                image = declared.image if declared is not None else name
                why = f"{image} is not built (or carries no package list): offers for {name} are refused here"
                checks.append(check(f"runtime {name}", "warn", why, f"edgecoder image build --runtime {name}"))
        for tier in TIERS:
            offered = tier in policy.isolation
            health = await executor.health(tier)
            verdict = await executor.canary(tier) if health.ok else health
            level = "ok" if verdict.ok else ("fail" if offered else "info")
            name = f"canary {tier}" + ("" if offered else " (not offered)")
            fix = "" if verdict.ok else _canary_fix(verdict.reason, tier)
            detail = summary(verdict.detail) if verdict.ok else f"{verdict.reason}: {verdict.detail}"
            checks.append(check(name, level, detail, fix))
            if tier == "gvisor" and health.ok:
                checks.append(platform_check(verdict.platform, offered))
            tiers[tier] = {
                "offered": offered,
                "ok": verdict.ok,
                "reason": "ready" if verdict.ok else verdict.reason,
                "detail": verdict.detail,
                "missing": list(verdict.missing),
                "platform": verdict.platform,
            }
    return _report(checks, tiers)


def platform_check(platform: str | None, offered: bool) -> dict[str, Any]:
    """The gVisor platform the canary's sandbox really ran on, as read from the runtime (executor/canary.py)."""
    name = "gVisor platform" + ("" if offered else " (not offered)")
    fix = "install runsc from bookworm-backports and register it with --platform=systrap: scripts/setup.sh"
    if platform is None:
        return check(name, "warn" if offered else "info", "the canary could not read it from the sandbox", fix)
    if platform == "ptrace":
        return check(
            name,
            "warn" if offered else "info",
            "ptrace (read from the sandbox: the Sentry traces its stubs): isolates as systrap does, at about 2.25x "
            "the cost per syscall",
            fix,
        )
    return check(name, "ok", f"{platform} (read from the canary's sandbox)")


def summary(detail: str) -> str:
    """A passed canary's readings (its JSON detail) as one line a person reads."""
    try:
        seen = json.loads(detail)
    except ValueError:
        return detail
    memory = seen.get("cgroup.memory") or seen.get("host.memory") or 0
    pids = seen.get("cgroup.pids") or seen.get("host.pids")
    cpus = seen.get("cgroup.cpus") or seen.get("host.cpus")
    where = "inside" if seen.get("cgroup.memory") else "MemTotal inside, the rest on the host cgroup"
    return (
        f"proven: memory {memory >> 20} MiB, pids {pids}, cpus {cpus} ({where}); nofile {seen['nofile'][0]}, "
        f"nproc {seen['nproc'][0]}, uid {seen['uid']} (gid the same, no other group), CapEff {seen['cap_eff']}, "
        f"no_new_privs {seen['no_new_privs']}, seccomp mode {seen['seccomp']}, root {seen['root_write']}, "
        f"interfaces {','.join(seen['interfaces'])}, threads {seen['threads']}"
    )


def _canary_fix(reason: str, tier: str) -> str:
    from executor.backends.gvisor import FIX

    if reason == "runtime_missing":
        return FIX if tier == "gvisor" else "reinstall docker.io (runc)"
    if reason == "image_missing":
        return "edgecoder image build"
    if reason == "image_user":
        return "use the image `edgecoder image build` makes, or rebuild yours with USER 65534:65534"
    if reason == "daemon_unreachable":
        return "start Docker, or point DOCKER_HOST at it"
    if reason == "limit_not_enforced":
        return (
            "the daemon or runtime does not enforce a limit the node sets (each reading is named above): a cgroup "
            "controller that is not mounted, rootless Docker on cgroup v1, runsc with --ignore-cgroups, or a "
            "daemon/runtime option that rewrites containers; see docs/troubleshooting.md"
        )
    return "see docs/troubleshooting.md; the node retries by itself every few seconds"


def _report(checks: list[dict[str, Any]], tiers: dict[str, Any]) -> dict[str, Any]:
    ok = all(c["ok"] for c in checks)
    return {"ok": ok, "sandboxMode": "docker" if ok else "none", "checks": checks, "tiers": tiers}
