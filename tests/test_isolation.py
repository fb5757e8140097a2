"""Isolation tiers against real daemons: the runsc registration scripts/setup.sh makes, the canary against real
daemon misconfigurations (never a mocked reading), the tier a run gets, and what an offer can never choose.

The misconfigurations are made on private daemons of the test's own (tests/private_dockerd.py), never on the
machine's shared one:
- a dockerd that cannot see the pids cgroup controller (its mount namespace lacks the hierarchy, as a kernel without
  the controller would): it discards `PidsLimit` with nothing but a create warning, and a container forks past 50;
- runsc registered with `--ignore-cgroups`: gVisor then sets up no host cgroup at all, and a program allocates far
  past its memory limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import docker
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from executor.backends import meets, parse_tiers, weakest_meeting
from executor.backends.gvisor import PTRACE_RUNTIME, RUNTIME, RUNTIME_ARGS, GvisorBackend
from executor.backends.registration import entry, merged, ptrace_entry, register
from executor.container_config import ISOLATION_LABEL, NODE_LABEL
from executor.contract import ErrorKind, ExecRequest, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from mesh.doctor import run_doctor
from mesh.gate import SandboxGate
from mesh.node import MeshNode, NodeConfig
from mesh.status import PTRACE_WARNING, node_status
from tests.conftest import _skip_or_fail, containers_of, docker_problem
from tests.docker_support import sandbox_policy
from tests.private_dockerd import PrivateDockerd, private_dockerd, private_dockerd_problem
from transports.wire.identity import NodeIdentity

POLICY = ExecutorPolicy(subset_check=False, pool_size=0)
BOTH = replace(POLICY, isolation=("runc", "gvisor"))
# The kernel a program sees: the host's under runc, gVisor's own (4.4.0) under gVisor.
KERNEL = "import os\nprint(os.uname().release)"
HOARD = "hoard = [bytearray(10 << 20) for _ in range(30)]\nprint(len(hoard) * 10, 'MiB')"
FORKS = (
    "import os, time\nn = 0\nfor _ in range(60):\n    if os.fork() == 0:\n        time.sleep(2)\n        os._exit(0)\n"
    "    n += 1\nprint('forked', n)"
)


# -- the ladder ---------------------------------------------------------------------------------------------------


def test_the_ladder() -> None:
    assert parse_tiers("gvisor, runc") == ("runc", "gvisor") == parse_tiers("runc,gvisor,runc")
    assert meets("gvisor", "runc") and meets("runc", None) and not meets("runc", "gvisor")
    assert weakest_meeting(("runc", "gvisor"), None) == "runc"
    assert weakest_meeting(("runc", "gvisor"), "gvisor") == "gvisor"
    assert weakest_meeting(("runc",), "gvisor") is None
    for bad in ("", "kata", "runc,kata"):
        with pytest.raises(ValueError):
            parse_tiers(bad)
    with pytest.raises(ValueError, match="isolation"):
        ExecutorPolicy(isolation=())
    assert ExecutorPolicy(isolation=("gvisor", "runc")).isolation == ("runc", "gvisor")  # weakest first


# -- the registration scripts/setup.sh makes ----------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@given(
    others=st.dictionaries(st.text(max_size=12).filter(lambda k: k != "runtimes"), JSON_VALUES, max_size=5),
    runtimes=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in ("runsc", "runsc-ptrace")),
        st.fixed_dictionaries({"path": st.text(min_size=1, max_size=12)}),
        max_size=3,
    ),
)
def test_registration_adds_runsc_and_keeps_everything_else(others: dict[str, Any], runtimes: dict[str, Any]) -> None:
    config = {**others, "runtimes": runtimes} if runtimes else others
    new, verdict = merged(config)
    assert verdict == "added"
    assert {k: v for k, v in new.items() if k != "runtimes"} == others
    assert new["runtimes"] == {**runtimes, "runsc": entry(), "runsc-ptrace": ptrace_entry()}
    assert merged(new) == (new, "present")  # idempotent


def test_registration_moves_setups_ptrace_entry_to_systrap(tmp_path: Any) -> None:
    """The entry setup.sh wrote while bookworm's runsc had ptrace only becomes the systrap one; the operator's
    other settings stay, and a second run changes nothing."""
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"debug": True, "runtimes": {"runsc": ptrace_entry()}}))
    assert register(path) == "updated"
    after = json.loads(path.read_text())
    assert after == {"debug": True, "runtimes": {"runsc": entry(), "runsc-ptrace": ptrace_entry()}}
    assert entry()["runtimeArgs"] == ["--platform=systrap", "--network=none", "--oci-seccomp"]
    assert register(path) == "present" and json.loads(path.read_text()) == after


def test_registration_leaves_an_operators_other_runsc_alone(tmp_path: Any) -> None:
    path = tmp_path / "daemon.json"
    their_runsc = {"path": "/opt/runsc", "runtimeArgs": ["--platform=kvm"]}
    path.write_text(json.dumps({"runtimes": {"runsc": their_runsc}, "debug": True}))
    assert register(path) == "conflict"  # theirs stays; only the benchmark's entry is added beside it
    assert json.loads(path.read_text()) == {
        "runtimes": {"runsc": their_runsc, "runsc-ptrace": ptrace_entry()},
        "debug": True,
    }
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        register(path)
    assert path.read_text() == "{not json"
    fresh = tmp_path / "etc" / "docker" / "daemon.json"
    assert register(fresh) == "added"
    assert json.loads(fresh.read_text()) == {"runtimes": {"runsc": entry(), "runsc-ptrace": ptrace_entry()}}
    assert oct(fresh.stat().st_mode & 0o777) == "0o644"


# -- private daemons -----------------------------------------------------------------------------------------------


def private_or_skip(required_by: str, *, runsc: bool) -> None:
    problem = docker_problem() or private_dockerd_problem()
    if problem is None and runsc and shutil.which("runsc") is None:
        problem = "runsc is not installed (apt-get install runsc; scripts/setup.sh does it)"
    _skip_or_fail(problem, required_by)


@pytest.fixture(scope="module")
def registered() -> Iterator[PrivateDockerd]:
    """A private dockerd started as setup.sh starts one, from a daemon.json that already holds a setting. Shared
    by this module's tests: each leaves its daemon.json as it found it."""
    private_or_skip("EDGECODER_REQUIRE_GVISOR", runsc=True)
    with private_dockerd(daemon_json={"log-level": "warn"}) as daemon:
        yield daemon


@pytest.mark.docker
async def test_a_daemon_started_by_setup_registers_runsc_and_both_tiers_prove_their_limits(
    registered: PrivateDockerd,
) -> None:
    config = json.loads(registered.daemon_json.read_text())
    assert config == {"log-level": "warn", "runtimes": {"runsc": entry(), "runsc-ptrace": ptrace_entry()}}
    with registered.api() as api:
        assert api.info()["Runtimes"]["runsc"] == {"path": "/usr/bin/runsc", "runtimeArgs": list(RUNTIME_ARGS)}
    async with Executor.open(BOTH, node_label="iso-registered", docker_base_url=registered.base_url) as ex:
        gate = SandboxGate("docker", ex, interval=60)
        await gate.check()
        assert gate.tiers == {"runc", "gvisor"}, gate.tier_status
        # The platform as the canary read it from the sandbox process on the host, not from the registration.
        assert (gate.tier_status["gvisor"].platform, gate.tier_status["runc"].platform) == ("systrap", None)
        runc = await ex.run_code(ExecRequest("python", KERNEL))
        gvisor = await ex.run_code(ExecRequest("python", KERNEL), min_isolation="gvisor")
    assert runc.stdout.strip() == os.uname().release  # the weakest tier that meets no minimum: the host's kernel
    assert gvisor.stdout.strip() == "4.4.0"  # gVisor's Sentry


@pytest.mark.docker
@pytest.mark.gvisor
async def test_the_platform_is_read_from_the_runtime_and_status_names_ptrace() -> None:
    """The machine's daemon has both registrations setup.sh makes: the tier's runsc (systrap) and runsc-ptrace.
    A node's canary reads which platform its sandbox really ran on (the Sentry traces its stubs under ptrace
    only), and /status warns of ptrace."""
    for runtime, platform, warnings in ((RUNTIME, "systrap", []), (PTRACE_RUNTIME, "ptrace", [PTRACE_WARNING])):
        config = NodeConfig(
            identity=NodeIdentity.generate(),
            executor_policy=replace(POLICY, isolation=("gvisor",)),
            isolation="gvisor",
            executor_options={"backends": {"gvisor": GvisorBackend(runtime)}},
            gate_interval=3600,
            mdns=False,
        )
        async with MeshNode.open(config) as node:
            status = node_status(node)
        assert status["participating"], status["gate"]
        assert (status["gate"]["tiers"]["gvisor"]["platform"], status["warnings"]) == (platform, warnings)


@pytest.mark.docker
async def test_runsc_without_host_cgroups_is_caught_and_only_that_tier_is_withdrawn(
    registered: PrivateDockerd,
) -> None:
    """runsc --ignore-cgroups, a real runsc flag (meant for hosts without cgroups), reloaded into the running
    daemon: a 128 MiB run then really allocates 300 MiB; the canary sees MemTotal at the host's size and no host
    cgroup, withdraws gvisor with the readings named, and the node keeps runc; restored, the tier comes back."""
    args = [*RUNTIME_ARGS, "--ignore-cgroups"]
    config = json.loads(registered.daemon_json.read_text())
    node_config = NodeConfig(
        identity=NodeIdentity.generate(),
        executor_policy=BOTH,
        isolation="runc,gvisor",
        executor_options={"docker_base_url": registered.base_url},
        gate_interval=3600,  # checked by hand below
        mdns=False,
    )
    async with MeshNode.open(node_config) as node:
        assert node.gate.tiers == {"runc", "gvisor"}
        assert node.executor is not None
        try:
            await misconfigured(node, registered, {**config, "runtimes": {"runsc": {**entry(), "runtimeArgs": args}}})
        finally:
            registered.reload(config)
        await node.gate.check()
        assert node.gate.tiers == {"runc", "gvisor"}


async def misconfigured(node: MeshNode, daemon: PrivateDockerd, config: dict[str, Any]) -> None:
    """The node once `config` is its daemon's: the limit is really gone, the canary names it, gvisor alone goes."""
    assert node.executor is not None
    daemon.reload(config)
    # The policy's longest timeout: 300 MiB of page faults through gVisor's ptrace platform took over the default
    # 5 s on this loaded 2-core machine (the run then ends as a timeout, not as the proof this is).
    hoard = await node.executor.run_code(
        ExecRequest("python", HOARD, limits=Limits(memory_mb=128, timeout_ms=POLICY.max_timeout_ms)),
        min_isolation="gvisor",
    )
    assert (hoard.ok, hoard.stdout) == (True, "300 MiB\n"), hoard  # the limit is really gone

    await node.gate.check()
    assert node.gate.tiers == {"runc"} and node.gate.participating
    withdrawn = node.gate.tier_status["gvisor"]
    assert withdrawn.reason == "limit_not_enforced"
    assert {"meminfo.total", "host.memory", "host.pids", "host.cpus"} <= set(withdrawn.missing)
    assert "meminfo.total: saw" in withdrawn.detail and "policy 134217728" in withdrawn.detail
    status = node_status(node)
    assert status["participating"] and status["isolation"] == "runc,gvisor"
    assert status["gate"]["tiers"]["gvisor"]["reason"] == "limit_not_enforced"
    assert "meminfo.total" in status["gate"]["tiers"]["gvisor"]["missing"]
    assert status["gate"]["tiers"]["runc"]["ok"] is True

    refused = await node.executor.run_code(ExecRequest("python", KERNEL), min_isolation="gvisor")
    assert (refused.ok, refused.queue_reason) == (False, "sandbox_unavailable")
    assert "meminfo.total" in refused.stderr
    still = await node.executor.run_code(ExecRequest("python", KERNEL))
    assert still.stdout.strip() == os.uname().release


@pytest.fixture
def no_pids_controller() -> Iterator[PrivateDockerd]:
    private_or_skip("EDGECODER_REQUIRE_DOCKER", runsc=False)
    with private_dockerd(hide_controllers=("pids",)) as daemon:
        yield daemon


@pytest.mark.docker
async def test_a_daemon_that_cannot_see_the_pids_controller_is_caught(
    no_pids_controller: PrivateDockerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon takes PidsLimit=50 and discards it, saying so only in a create warning; a container of it forks
    60 children. The canary reads no pids.max inside and names it; a run is refused before its program starts."""
    with no_pids_controller.api() as api:
        created = api.create_container(
            "edgecoder-sandbox:bookworm",
            ["python3", "-c", FORKS],
            user="2000000001:2000000001",
            host_config=api.create_host_config(pids_limit=50, network_mode="none", mem_limit="128m"),
        )
        try:
            assert any("PIDs limit discarded" in w for w in created.get("Warnings") or []), created
            api.start(created["Id"])
            assert api.wait(created["Id"], timeout=60)["StatusCode"] == 0
            assert api.logs(created["Id"]).decode() == "forked 60\n"  # past the policy's 50: not enforced
        finally:
            api.remove_container(created["Id"], force=True)
    async with Executor.open(POLICY, node_label="iso-no-pids", docker_base_url=no_pids_controller.base_url) as ex:
        canary = await ex.canary("runc")
        refused = await ex.run_code(ExecRequest("python", "print('never')"))
    assert (canary.ok, canary.reason) == (False, "limit_not_enforced")
    assert canary.missing == ("cgroup.pids", "daemon.warning")
    assert canary.detail.startswith("runc: cgroup.pids: saw None, policy 50")
    assert (refused.ok, refused.error_kind, refused.queue_reason) == (
        False,
        ErrorKind.SANDBOX_VIOLATION,
        "sandbox_unavailable",
    )
    assert "failed its canary" in refused.stderr and "cgroup.pids" in refused.stderr

    monkeypatch.setenv("DOCKER_HOST", no_pids_controller.base_url)
    report = await run_doctor(POLICY, "docker")
    failed = {c["name"]: c for c in report["checks"] if c["level"] == "fail"}
    assert report["ok"] is False and set(failed) == {"cgroups", "canary runc"}
    assert "cannot enforce pids limits" in failed["cgroups"]["detail"] and failed["cgroups"]["fix"]
    assert "cgroup.pids: saw None, policy 50" in failed["canary runc"]["detail"]
    assert report["tiers"]["runc"]["missing"] == ["cgroup.pids", "daemon.warning"]


# -- a run's tier, on the machine's daemon -------------------------------------------------------------------------


@pytest.mark.docker
async def test_a_run_needing_gvisor_is_refused_by_a_runc_only_executor(
    docker_api: docker.APIClient, node_label: str
) -> None:
    async with Executor.open(POLICY, node_label=node_label) as ex:
        refused = await ex.run_code(ExecRequest("python", "print('never')"), min_isolation="gvisor")
        unknown = await ex.run_code(ExecRequest("python", "print('never')"), min_isolation="kata")
    assert (refused.ok, refused.queue_reason, refused.exit_code) == (False, "isolation_insufficient", None)
    assert refused.stderr == "isolation_insufficient: the run needs at least gvisor; this executor offers runc"
    assert (unknown.ok, unknown.exit_code) == (False, None) and "unknown isolation tier 'kata'" in unknown.stderr
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
@pytest.mark.gvisor
async def test_a_gvisor_executor_runs_everything_under_gvisor(docker_api: docker.APIClient, node_label: str) -> None:
    async with Executor.open(replace(POLICY, isolation=("gvisor",)), node_label=node_label) as ex:
        any_tier = await ex.run_code(ExecRequest("python", KERNEL))
        minimum = await ex.run_code(ExecRequest("python", KERNEL), min_isolation="runc")
    assert any_tier.stdout == minimum.stdout == "4.4.0\n"


# -- an offer never chooses the image or any mount ------------------------------------------------------------------


@pytest.mark.docker
async def test_what_a_run_asks_for_never_reaches_the_container_configuration(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """The input of a run names an image, binds and a runtime: the container is the policy's all the same, with no
    mount of any kind (the runc escapes of November 2025 need an attacker-chosen image or mount)."""
    wishes = {"image": "attacker/escape:latest", "Binds": ["/:/host"], "Mounts": [{"Source": "/"}], "Runtime": "x"}
    seen: dict[str, Any] = {}

    async def look() -> None:
        with trio.fail_after(30):
            while not (containers := containers_of(docker_api, node_label)):
                await trio.sleep(0.02)
        seen.update(docker_api.inspect_container(containers[0]["Id"]))

    async with Executor.open(POLICY, node_label=node_label) as ex, trio.open_nursery() as nursery:
        nursery.start_soon(look)
        result = await ex.run_code(ExecRequest("python", "import time\ntime.sleep(1)", input=wishes))
    assert result.ok, result.stderr
    assert seen["Config"]["Image"] == POLICY.image and seen["Mounts"] == []
    host = seen["HostConfig"]
    assert (host["Binds"], host["Runtime"], host["Privileged"], host["Devices"] or []) == (None, "runc", False, [])
    assert seen["Config"]["Labels"][ISOLATION_LABEL] == "runc" and seen["Config"]["Labels"][NODE_LABEL] == node_label


# -- end to end: an offer's minimum tier across real nodes ------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.gvisor
async def test_an_offer_needing_gvisor_runs_only_on_a_gvisor_node() -> None:
    """A runc-only node refuses it (`isolation_insufficient`, before any claim or container); a gVisor node runs it
    under gVisor (its kernel says so); over gossip only the gVisor node gets the claim."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(isolation: str | None, peers: list[str]) -> MeshNode:
            config = NodeConfig(
                identity=NodeIdentity.generate(),
                peers=peers,
                sandbox_mode="none" if isolation is None else "docker",
                executor_policy=sandbox_policy(),
                isolation=isolation,
                heartbeat_interval=0.5,
                mdns=False,
            )
            return await stack.enter_async_context(MeshNode.open(config))

        runc = await start("runc", [])
        gvisor = await start("gvisor", runc.addrs[:1])
        offerer = await start(None, runc.addrs[:1])
        assert (runc.gate.tiers, gvisor.gate.tiers) == ({"runc"}, {"gvisor"})
        with trio.fail_after(15):
            while {h.peer_id: h.isolation for h in offerer.peers.fresh()} != {
                runc.peer_id: ("runc",),
                gvisor.peer_id: ("gvisor",),
            }:
                await trio.sleep(0.05)

        refused = await offerer.offer_direct(
            runc.addrs[0], offerer.make_offer(to=runc.peer_id, language="python", code=KERNEL, min_isolation="gvisor")
        )
        assert refused.refusal is not None and refused.refusal.reason == "isolation_insufficient"
        assert not runc.ran

        direct = await offerer.offer_direct(
            gvisor.addrs[0],
            offerer.make_offer(to=gvisor.peer_id, language="python", code=KERNEL, min_isolation="gvisor"),
        )
        assert direct.result is not None and direct.result.result.stdout == "4.4.0\n", direct

        raw = offerer.make_offer(language="python", code=KERNEL, min_isolation="gvisor")
        claimed = await offerer.offer_gossip(raw, timeout=30)
        assert claimed.result is not None, claimed.refusal
        assert claimed.result.executor == gvisor.identity.public_key and claimed.result.result.stdout == "4.4.0\n"
        assert not runc.ran
