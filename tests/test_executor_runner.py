"""The Executor's decisions: refusals that start nothing, admission (busy), pooled vs cold, sweeping."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from typing import Any

import docker
import pytest
import trio

from executor.contract import SANDBOX_REQUIRED, ErrorKind, ExecRequest, ExecResult, Limits, QueueReason
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from tests.conftest import containers_of

POLICY = ExecutorPolicy(pool_size=0)


class ProcessSpy:
    """Counts every way this process could start another one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for owner, name in [
            (trio.lowlevel, "open_process"),
            (trio, "run_process"),
            (subprocess, "Popen"),
            (os, "fork"),
            (os, "posix_spawn"),
            (os, "posix_spawnp"),
            (os, "execv"),
            (os, "system"),
        ]:
            monkeypatch.setattr(owner, name, self._spy(f"{owner.__name__}.{name}"))

    def _spy(self, what: str) -> Any:
        def called(*args: Any, **kwargs: Any) -> None:
            self.calls.append(what)
            raise AssertionError(f"{what} was called")

        return called


@pytest.mark.docker
async def test_remote_host_run_is_refused_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, docker_api: docker.APIClient, node_label: str
) -> None:
    async with Executor.open(POLICY, node_label=node_label) as ex:
        # This executor's containers only: the daemon is shared with parallel workers and other runs.
        before = containers_of(docker_api, node_label)
        spy = ProcessSpy(monkeypatch)
        starts: list[Any] = []
        monkeypatch.setattr(ex.sandbox, "start", lambda *a, **k: starts.append(a))
        result = await ex.run_code(ExecRequest("python", "print('hi')"), sandbox="host")
        after = containers_of(docker_api, node_label)
    assert result == ExecResult(
        ok=False,
        stderr=SANDBOX_REQUIRED,
        exit_code=None,
        queue_for_cloud=True,
        queue_reason=QueueReason.SANDBOX_REQUIRED,
        error_kind=ErrorKind.SANDBOX_VIOLATION,
    )
    assert result.to_json()["queueReason"] == "sandbox_required_for_remote_task"
    assert spy.calls == [] and starts == []
    assert {c["Id"] for c in after} <= {c["Id"] for c in before}


async def test_remote_is_the_default_origin_and_docker_the_default_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    async with Executor.open(POLICY, node_label="defaults", docker_base_url="unix:///nonexistent.sock") as ex:
        spy = ProcessSpy(monkeypatch)
        refused = await ex.run_code(ExecRequest("python", "print(1)"), sandbox="host")
        assert refused.queue_reason == SANDBOX_REQUIRED and spy.calls == []
        # Default sandbox is docker: with no daemon this is sandbox_unavailable, never a host process.
        default = await ex.run_code(ExecRequest("python", "print(1)"))
        assert (default.error_kind, default.queue_reason) == (ErrorKind.SANDBOX_VIOLATION, "sandbox_unavailable")
        assert spy.calls == []


async def test_local_host_run_is_allowed() -> None:
    async with Executor.open(POLICY, node_label="local-host", docker_base_url="unix:///nonexistent.sock") as ex:
        result = await ex.run_code(ExecRequest("python", "print(6 * 7)"), sandbox="host", origin="local")
    assert (result.ok, result.stdout) == (True, "42\n")


@pytest.mark.docker
async def test_outside_subset_is_refused_before_any_container(
    docker_api: docker.APIClient, node_label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Executor.open(POLICY, node_label=node_label) as ex:
        starts: list[Any] = []
        monkeypatch.setattr(ex.sandbox, "start", lambda *a, **k: starts.append(a))
        result = await ex.run_code(ExecRequest("python", "import socket\nsocket.socket()"))
        js = await ex.run_code(ExecRequest("javascript", "require('child_process').execSync('id')"))
    assert (result.ok, result.error_kind, result.queue_reason) == (False, ErrorKind.SANDBOX_VIOLATION, "outside_subset")
    assert result.stderr == "outside_subset: import socket (line 1)"
    assert js.queue_reason == "outside_subset" and "child_process" in js.stderr
    assert starts == []
    assert containers_of(docker_api, node_label) == []


async def test_local_runs_are_subset_checked_until_the_user_turns_it_off() -> None:
    """`edgecoder exec` checks by default and `--no-subset` turns it off; the host path is hygiene either way."""
    request = ExecRequest("python", "import subprocess\nprint('local')")
    async with Executor.open(POLICY, node_label="local-subset", docker_base_url="unix:///nonexistent.sock") as ex:
        checked = await ex.run_code(request, sandbox="host", origin="local")
    assert (checked.ok, checked.queue_reason) == (False, "outside_subset")
    unchecked_policy = replace(POLICY, subset_check=False)
    async with Executor.open(unchecked_policy, node_label="local-subset", docker_base_url="unix:///x.sock") as ex:
        result = await ex.run_code(request, sandbox="host", origin="local")
    assert (result.ok, result.stdout) == (True, "local\n")


@pytest.mark.docker
async def test_busy_when_slots_and_queue_are_full(docker_api: docker.APIClient, node_label: str) -> None:
    policy = replace(POLICY, max_concurrent=1, max_waiting=1)
    sleeper = ExecRequest("python", "import time\ntime.sleep(1.5)\nprint('slept')")
    results: list[ExecResult] = []
    async with Executor.open(policy, node_label=node_label) as ex:

        async def run() -> None:
            results.append(await ex.run_code(sleeper))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await wait_until(lambda: ex.stats().runs_in_flight == 1)
            nursery.start_soon(run)
            await wait_until(lambda: ex.stats().waiting == 1)
            assert ex.stats().free_slots == 0
            busy = await ex.run_code(ExecRequest("python", "print(1)"))
            # Refused at once, not after a wait: the run and the waiter it found are both still there, unfinished.
            assert (ex.stats().runs_in_flight, ex.stats().waiting, results) == (1, 1, [])
    assert (busy.ok, busy.queue_reason, busy.queue_for_cloud) == (False, "busy", True)
    assert [r.stdout for r in results] == ["slept\n", "slept\n"]
    assert containers_of(docker_api, node_label) == []


TASKS = [
    ("python", "import json, sys\nd = json.load(sys.stdin)\nprint(sum(d['xs']))", {"xs": [1, 2, 3]}),
    ("python", "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)", None),
    ("python", "raise ValueError('boom')", None),
    ("python", "print('\u00e9\u2603' * 3)", None),
    (
        "javascript",
        "let s='';process.stdin.on('data',c=>s+=c).on('end',()=>console.log(JSON.parse(s).xs.length))",
        {"xs": [1, 2]},
    ),
    ("javascript", "console.error('bad'); process.exit(4)", None),
    ("javascript", "throw new Error('boom')", None),
]


def comparable(result: ExecResult) -> tuple[Any, ...]:
    return (result.ok, result.stdout, result.stderr, result.exit_code, result.error_kind, result.queue_reason)


@pytest.mark.docker
async def test_pooled_and_cold_runs_give_identical_results(docker_api: docker.APIClient, node_label: str) -> None:
    policy = ExecutorPolicy(subset_check=False, pool_size=2)
    requests = [ExecRequest(lang, code, data) for lang, code, data in TASKS]  # type: ignore[arg-type]
    roles: list[str] = []
    async with Executor.open(policy, node_label=node_label) as ex:
        real_start = ex.sandbox.start

        async def recording_start(
            limits: Limits, *, role: str, prestart: Any = None, accept_warnings: bool = False
        ) -> Any:
            roles.append(role)
            return await real_start(limits, role=role, prestart=prestart, accept_warnings=accept_warnings)

        ex.sandbox.start = recording_start  # type: ignore[method-assign]
        pooled = []
        for request in requests:
            await wait_until(lambda: ex.stats().pool_ready >= 1)
            pooled.append(await ex.run_code(request))
    async with Executor.open(replace(policy, pool_size=0), node_label=node_label) as ex:
        cold = [await ex.run_code(request) for request in requests]
    assert "cold" not in roles  # every pooled run really used a pre-started container
    assert [comparable(r) for r in pooled] == [comparable(r) for r in cold]
    assert pooled[0].stdout == "6\n" and pooled[1].exit_code == 3 and pooled[5].stderr == "bad\n"
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
async def test_a_run_asked_to_spare_the_last_warm_container_starts_cold(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """The node keeps the last warm container for offerers it knows (mesh/standing.py): a fresh one's run goes
    cold rather than take it."""
    roles: list[str] = []
    async with Executor.open(ExecutorPolicy(subset_check=False, pool_size=1), node_label=node_label) as ex:
        real_start = ex.sandbox.start

        async def recording_start(limits: Limits, *, role: str, **options: Any) -> Any:
            roles.append(role)
            return await real_start(limits, role=role, **options)

        ex.sandbox.start = recording_start  # type: ignore[method-assign]
        await wait_until(lambda: ex.stats().pool_ready == 1)
        roles.clear()  # the pool's own start
        spared = await ex.run_code(ExecRequest("python", "print(1)"), spare_warm=1)
        assert (spared.ok, spared.stdout, roles) == (True, "1\n", ["cold"])
        assert ex.stats().pool_ready == 1  # still there for the next run that may have it
        roles.clear()
        taken = await ex.run_code(ExecRequest("python", "print(2)"))
        assert (taken.ok, taken.stdout) == (True, "2\n")
        assert "cold" not in roles  # the pooled one ran it (what may have started since is the refill)
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
async def test_pool_is_refilled_and_emptied_on_close(docker_api: docker.APIClient, node_label: str) -> None:
    async with Executor.open(ExecutorPolicy(pool_size=2), node_label=node_label) as ex:
        await wait_until(lambda: ex.stats().pool_ready == 2)
        assert len(containers_of(docker_api, node_label)) == 2
        await ex.run_code(ExecRequest("python", "print(1)"))
        await wait_until(lambda: ex.stats().pool_ready == 2)
    assert containers_of(docker_api, node_label) == []


@pytest.mark.docker
async def test_limits_other_than_the_pools_run_cold(docker_api: docker.APIClient, node_label: str) -> None:
    async with Executor.open(ExecutorPolicy(pool_size=1), node_label=node_label) as ex:
        await wait_until(lambda: ex.stats().pool_ready == 1)
        # cgroup v1 (this host) has the limit in memory/memory.limit_in_bytes, cgroup v2 in memory.max.
        code = (
            "import os\n"
            "v1, v2 = '/sys/fs/cgroup/memory/memory.limit_in_bytes', '/sys/fs/cgroup/memory.max'\n"
            "print(open(v1 if os.path.exists(v1) else v2).read())"
        )
        result = await ex.run_code(ExecRequest("python", code, None, Limits(2000, 96, 0.5)))
        assert ex.stats().pool_ready == 1
    assert result.stdout.strip() == str(96 << 20)


NO_DAEMON = "unix:///nonexistent.sock"
MESH_OFFER_CHARS = 128 * 1024


async def test_a_trio_task_keeps_ticking_while_a_128_kib_offer_is_checked() -> None:
    """The check ran on the Trio thread before any await: for its whole duration (0.3 s here, 1 s under load)
    nothing else in the node ran. Now it runs in the checker process and the node's other tasks carry on."""
    code = "x;" * (MESH_OFFER_CHARS // 2 - 16) + "\nimport socket"
    ticks: list[float] = []

    async def ticker(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            ticks.append(trio.current_time())
            await trio.sleep(0.005)

    async with (
        Executor.open(POLICY, node_label="ticking", docker_base_url=NO_DAEMON) as ex,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(ticker)
        began = trio.current_time()
        result = await ex.run_code(ExecRequest("python", code))
        ended = trio.current_time()
        nursery.cancel_scope.cancel()
    during = [t for t in ticks if began < t < ended]
    assert (result.queue_reason, result.stderr) == ("outside_subset", "outside_subset: import socket (line 2)")
    # Had the check held the Trio thread, no tick would fall inside it; how long the longest gap was is a timing,
    # and timings belong to the benchmarks.
    assert len(during) >= 5, f"the ticker ran {len(during)} times during a {ended - began:.2f} s check"


async def test_the_nested_code_offer_is_refused_and_the_executor_keeps_serving() -> None:
    async with Executor.open(POLICY, node_label="nested", docker_base_url=NO_DAEMON) as ex:
        nested = await ex.run_code(ExecRequest("python", "a" + ".b" * 60000))
        honest = await ex.run_code(ExecRequest("python", "print(6 * 7)"), sandbox="host", origin="local")
    assert (nested.ok, nested.error_kind, nested.queue_reason) == (False, ErrorKind.SANDBOX_VIOLATION, "outside_subset")
    assert nested.stderr == "outside_subset: code nests too deeply to check"
    assert (honest.ok, honest.stdout) == (True, "42\n")


async def test_sizes_are_refused_before_anything_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = replace(POLICY, max_code_bytes=1000, max_input_bytes=100)
    parsed: list[str] = []
    async with Executor.open(policy, node_label="sizes", docker_base_url=NO_DAEMON) as ex:
        assert ex.checker is not None
        real_check = ex.checker.check

        async def recording_check(language: str, code: str) -> Any:
            parsed.append(code)
            return await real_check(language, code)

        monkeypatch.setattr(ex.checker, "check", recording_check)
        too_long = await ex.run_code(ExecRequest("python", "x;" * 100_000))
        too_long_utf8 = await ex.run_code(ExecRequest("python", "\u2603" * 400))  # 400 characters, 1200 bytes
        input_too_big = await ex.run_code(ExecRequest("python", "print(1)", {"xs": list(range(100))}))
        deep: Any = []
        for _ in range(100_000):
            deep = [deep]
        input_too_deep = await ex.run_code(ExecRequest("python", "print(1)", deep))
    assert too_long.stderr == "code is 200000 characters, more than 1000 bytes"
    assert too_long_utf8.stderr == "code is 1200 bytes, more than 1000"
    assert input_too_big.stderr.startswith("input is ") and input_too_big.stderr.endswith(
        "bytes of JSON, more than 100"
    )
    assert input_too_deep.stderr == "input nests too deeply to encode as JSON"
    for result in (too_long, too_long_utf8, input_too_big, input_too_deep):
        assert (result.ok, result.error_kind, result.exit_code) == (False, ErrorKind.EXECUTION_FAILED, None)
    assert parsed == []


async def test_unknown_language_and_non_json_input_are_results_not_exceptions() -> None:
    async with Executor.open(POLICY, node_label="bad-input", docker_base_url="unix:///nonexistent.sock") as ex:
        language = await ex.run_code(ExecRequest("ruby", "puts 1"))  # type: ignore[arg-type]
        data = await ex.run_code(ExecRequest("python", "print(1)", {1, 2}), sandbox="host", origin="local")
    assert language.error_kind is ErrorKind.EXECUTION_FAILED and "ruby" in language.stderr
    assert data.error_kind is ErrorKind.EXECUTION_FAILED and "JSON" in data.stderr


async def wait_until(condition: Any, timeout_s: float = 15.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.02)


@pytest.mark.docker
async def test_an_exception_in_the_owner_still_removes_every_container(
    docker_api: docker.APIClient, node_label: str
) -> None:
    class OwnerFailed(Exception):
        pass

    with pytest.raises(BaseExceptionGroup) as raised:
        async with Executor.open(ExecutorPolicy(pool_size=2), node_label=node_label) as ex:
            await wait_until(lambda: ex.stats().pool_ready == 2)
            await ex.run_code(ExecRequest("python", "print(1)"))  # leaves a removal in the background too
            raise OwnerFailed
    assert raised.group_contains(OwnerFailed)
    assert containers_of(docker_api, node_label) == []
