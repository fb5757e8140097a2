"""Live negative tests against the real daemon: each run returns promptly with the right error kind, proves the
boundary from inside the container, and leaves no container behind."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest
import trio

from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from tests.conftest import containers_of

pytestmark = pytest.mark.docker

# The boundary is the container, so these tests switch the subset hygiene off and attack the container itself.
POLICY = ExecutorPolicy(subset_check=False, pool_size=0)


@asynccontextmanager
async def executor(label: str, **changes: Any) -> AsyncIterator[Executor]:
    async with Executor.open(replace(POLICY, **changes), node_label=label) as ex:
        yield ex


async def run_inside(label: str, code: str, *, limits: Limits | None = None, **changes: Any) -> ExecResult:
    async with executor(label, **changes) as ex:
        return await ex.run_code(ExecRequest("python", code, limits=limits or Limits()))


def assert_nothing_left(api: docker.APIClient, label: str) -> None:
    assert containers_of(api, label) == []


async def test_only_the_loopback_interface_exists_inside(docker_api: docker.APIClient, node_label: str) -> None:
    code = (
        "import json, os\n"
        "devices = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
        "print(json.dumps({'sys': sorted(os.listdir('/sys/class/net')), 'proc': devices,"
        " 'routes': open('/proc/net/route').read().splitlines()[1:]}))"
    )
    result = await run_inside(node_label, code)
    assert result.ok, result.stderr
    assert json.loads(result.stdout) == {"sys": ["lo"], "proc": ["lo"], "routes": []}
    assert_nothing_left(docker_api, node_label)


async def test_root_file_system_is_read_only(docker_api: docker.APIClient, node_label: str) -> None:
    code = (
        "import errno\n"
        "for path in ('/pwned', '/etc/passwd', '/usr/bin/python3'):\n"
        "    try:\n"
        "        open(path, 'a').close()\n"
        "        print(path, 'WRITABLE')\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    result = await run_inside(node_label, code)
    assert result.stdout.split("\n")[0] == "/pwned EROFS"
    assert "WRITABLE" not in result.stdout
    assert_nothing_left(docker_api, node_label)


async def test_identity_capabilities_and_no_new_privileges(docker_api: docker.APIClient, node_label: str) -> None:
    code = (
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getegid(), status['CapEff'].strip(),"
        " status['CapPrm'].strip(), status['NoNewPrivs'].strip())"
    )
    result = await run_inside(node_label, code)
    assert result.stdout.split() == ["65534"] * 4 + ["0000000000000000", "0000000000000000", "1"]
    assert_nothing_left(docker_api, node_label)


async def test_canary_passes_on_the_hardened_config(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        health = await ex.health()
        canary = await ex.canary()
    assert health.ok, health
    assert canary.ok, canary
    seen = json.loads(canary.detail)
    assert (seen["interfaces"], seen["uid"], seen["gid"], seen["root_read_only"]) == (["lo"], 65534, 65534, True)
    assert_nothing_left(docker_api, node_label)


async def test_fork_bomb_stops_at_the_pids_ceiling(docker_api: docker.APIClient, node_label: str) -> None:
    began = time.monotonic()
    async with executor(node_label) as ex:
        bomb = await ex.run_code(ExecRequest("python", "import os\nwhile True:\n    os.fork()", limits=Limits(5000)))
        after = await ex.run_code(ExecRequest("python", "print('still fine')"))
    assert time.monotonic() - began < 15
    assert bomb.error_kind in (ErrorKind.EXECUTION_FAILED, ErrorKind.TIMEOUT)
    if bomb.error_kind is ErrorKind.EXECUTION_FAILED:
        assert "Resource temporarily unavailable" in bomb.stderr
    assert (after.ok, after.stdout) == (True, "still fine\n")
    assert_nothing_left(docker_api, node_label)


async def test_memory_bomb_is_memory_exceeded(docker_api: docker.APIClient, node_label: str) -> None:
    code = "hoard = []\nwhile True:\n    hoard.append('x' * 10**6)"
    result = await run_inside(node_label, code, limits=Limits(timeout_ms=10_000, memory_mb=64))
    assert (result.ok, result.error_kind, result.queue_reason) == (False, ErrorKind.MEMORY_EXCEEDED, "memory_exceeded")
    assert result.exit_code == 137
    assert_nothing_left(docker_api, node_label)


async def test_exit_137_without_oom_is_not_memory_exceeded(docker_api: docker.APIClient, node_label: str) -> None:
    result = await run_inside(node_label, "import sys\nsys.exit(137)")
    assert (result.exit_code, result.error_kind) == (137, ErrorKind.EXECUTION_FAILED)
    assert_nothing_left(docker_api, node_label)


async def test_infinite_loop_times_out_and_its_container_is_gone(docker_api: docker.APIClient, node_label: str) -> None:
    began = time.monotonic()
    async with executor(node_label) as ex:
        result = await ex.run_code(ExecRequest("python", "while True:\n    pass", limits=Limits(timeout_ms=1000)))
        assert time.monotonic() - began < 5
        # Killed before the result came back: nothing of it is still running.
        running = docker_api.containers(filters={"label": f"edgecoder.node={node_label}", "status": "running"})
        assert running == []
    assert (result.ok, result.exit_code, result.error_kind, result.queue_reason) == (
        False,
        124,
        ErrorKind.TIMEOUT,
        "timeout",
    )
    assert_nothing_left(docker_api, node_label)


async def test_output_flood_is_truncated_in_bounded_memory(docker_api: docker.APIClient, node_label: str) -> None:
    flood_mb = 150
    code = f"import sys\nchunk = 'x' * 65536\nfor _ in range({flood_mb * 16}):\n    sys.stdout.write(chunk)\n"
    peak_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await run_inside(node_label, code, limits=Limits(timeout_ms=25_000))
    peak_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before_kb) / 1024
    assert result.ok, result.stderr
    assert (len(result.stdout), result.stdout_truncated) == (POLICY.stdout_cap, True)
    assert peak_growth_mb < 40, f"node memory grew {peak_growth_mb:.0f} MiB for a {flood_mb} MiB flood"
    assert_nothing_left(docker_api, node_label)


async def test_a_file_written_to_tmp_cannot_be_executed(docker_api: docker.APIClient, node_label: str) -> None:
    code = (
        "import os, shutil\n"
        "shutil.copy('/bin/true', '/tmp/true')\n"
        "os.chmod('/tmp/true', 0o755)\n"
        "try:\n"
        "    os.execv('/tmp/true', ['true'])\n"
        "except PermissionError:\n"
        "    print('noexec')\n"
    )
    result = await run_inside(node_label, code)
    assert (result.ok, result.stdout) == (True, "noexec\n"), result.stderr
    assert_nothing_left(docker_api, node_label)


async def test_open_files_are_limited_to_256(docker_api: docker.APIClient, node_label: str) -> None:
    code = (
        "import resource\n"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        "files = []\n"
        "try:\n"
        "    while True:\n"
        "        files.append(open('/dev/null'))\n"
        "except OSError:\n"
        "    print(len(files) < 256)\n"
    )
    result = await run_inside(node_label, code)
    assert result.stdout == "(256, 256)\nTrue\n"
    assert_nothing_left(docker_api, node_label)


async def test_seccomp_profile_denies_its_syscall(
    docker_api: docker.APIClient, node_label: str, tmp_path: Path
) -> None:
    profile = tmp_path / "deny-mkdir.json"
    profile.write_text(
        json.dumps(
            {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}],
            }
        )
    )
    code = (
        "import os\ntry:\n    os.mkdir('/tmp/d')\n    print('made')\n"
        "except PermissionError as exc:\n    print(exc.errno)"
    )
    denied = await run_inside(node_label, code, seccomp_profile=str(profile))
    allowed = await run_inside(node_label, code)
    assert (denied.ok, denied.stdout) == (True, "1\n"), denied.stderr  # EPERM
    assert (allowed.ok, allowed.stdout) == (True, "made\n"), allowed.stderr
    assert_nothing_left(docker_api, node_label)


async def test_input_and_output_round_trip_in_both_languages(docker_api: docker.APIClient, node_label: str) -> None:
    data = {"xs": [1, 2, 3], "text": "h\u00e9llo \u2603"}
    python = "import json, sys\nd = json.load(sys.stdin)\nprint(sum(d['xs']), d['text'])"
    javascript = (
        "let s = '';\nprocess.stdin.on('data', c => s += c).on('end', () => {\n"
        "  const d = JSON.parse(s);\n  console.log(d.xs.reduce((a, b) => a + b, 0), d.text);\n});"
    )
    async with executor(node_label) as ex:
        py = await ex.run_code(ExecRequest("python", python, data))
        js = await ex.run_code(ExecRequest("javascript", javascript, data))
    assert (py.ok, py.stdout) == (True, "6 h\u00e9llo \u2603\n"), py.stderr
    assert (js.ok, js.stdout) == (True, "6 h\u00e9llo \u2603\n"), js.stderr
    assert_nothing_left(docker_api, node_label)


async def test_supervisor_trailer_never_shows_and_status_is_the_programs(
    docker_api: docker.APIClient, node_label: str
) -> None:
    result = await run_inside(node_label, "import sys\nsys.stderr.write('oops')\nsys.exit(3)")
    assert (result.exit_code, result.stderr, result.error_kind) == (3, "oops", ErrorKind.EXECUTION_FAILED)
    assert result.queue_for_cloud is False
    assert_nothing_left(docker_api, node_label)


async def test_abort_kills_and_removes_and_reports_aborted(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        results: list[ExecResult] = []

        async def long_run() -> None:
            results.append(await ex.run_code(ExecRequest("python", "import time\ntime.sleep(60)")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_run)
            await wait_until(lambda: ex.stats().runs_in_flight == 1)
            await trio.sleep(0.5)
            began = time.monotonic()
            ex.abort_all()
        assert time.monotonic() - began < 3
    assert [(r.ok, r.error_kind, r.queue_reason) for r in results] == [(False, ErrorKind.ABORTED, "aborted")]
    assert_nothing_left(docker_api, node_label)


async def test_caller_cancel_kills_and_removes(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        with trio.move_on_after(1.0) as scope:
            await ex.run_code(ExecRequest("python", "import time\ntime.sleep(60)"))
        assert scope.cancelled_caught
        running = docker_api.containers(filters={"label": f"edgecoder.node={node_label}", "status": "running"})
        assert running == []
        assert ex.stats().runs_in_flight == 0
    assert_nothing_left(docker_api, node_label)


async def test_closing_the_executor_aborts_runs_in_flight(docker_api: docker.APIClient, node_label: str) -> None:
    results: list[ExecResult] = []
    async with trio.open_nursery() as nursery, executor(node_label) as ex:

        async def long_run() -> None:
            results.append(await ex.run_code(ExecRequest("python", "import time\ntime.sleep(60)")))

        nursery.start_soon(long_run)
        await wait_until(lambda: ex.stats().runs_in_flight == 1)
        await trio.sleep(0.5)
    assert [r.error_kind for r in results] == [ErrorKind.ABORTED]
    assert_nothing_left(docker_api, node_label)


async def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.02)
