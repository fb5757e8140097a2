"""Live negative tests against the real daemon: each run returns promptly with the right error kind, proves the
boundary from inside the container, and leaves no container behind.

Every test runs under each isolation tier (runc and gvisor: executor/backends/), the hostile catalogue under both
boundaries; a test marked `runc_only` says why it holds for runc alone (the node's own side of a run, which is the
same under every tier, or a property of runc's shared host kernel)."""

from __future__ import annotations

import ast
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import trio

from executor.backends import Tier
from executor.bootstrap import BOOTSTRAP_FAILED
from executor.container_config import SANDBOX_UID_BASE, SANDBOX_UID_COUNT
from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.sandbox import TIMEOUT_EXIT_CODE
from tests.conftest import containers_of
from tests.docker_support import kill_process, start_executor_process

pytestmark = pytest.mark.docker

# The boundary is the container, so these tests switch the subset hygiene off and attack the container itself.
BASE_POLICY = ExecutorPolicy(subset_check=False, pool_size=0)
POLICY = BASE_POLICY  # the tier fixture below sets the tier of each test's executors


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tier" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("runc_only") is not None
        gvisor = pytest.param("gvisor", marks=pytest.mark.gvisor)
        metafunc.parametrize("tier", ["runc"] if one else ["runc", gvisor], indirect=True)


@pytest.fixture(autouse=True)
def tier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The isolation tier of this run of the test: every executor the test opens offers it alone."""
    tier: Tier = request.param
    monkeypatch.setattr(sys.modules[__name__], "POLICY", replace(BASE_POLICY, isolation=(tier,)))
    return tier


@asynccontextmanager
async def executor(label: str, **changes: Any) -> AsyncIterator[Executor]:
    async with Executor.open(replace(POLICY, **changes), node_label=label) as ex:
        yield ex


async def run_inside(label: str, code: str, *, limits: Limits | None = None, **changes: Any) -> ExecResult:
    async with executor(label, **changes) as ex:
        return await ex.run_code(ExecRequest("python", code, limits=limits or Limits()))


def assert_nothing_left(api: docker.APIClient, label: str) -> None:
    assert containers_of(api, label) == []


async def test_only_the_loopback_interface_exists_inside(
    docker_api: docker.APIClient, node_label: str, tier: str
) -> None:
    """The devices of the network namespace (/proc/net/dev, what the canary reads), the kernel's interface index
    (netlink) and the routes. /sys/class/net too where it exists: runsc since 2024 has none without a network."""
    code = (
        "import json, os, socket\n"
        "devices = [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]\n"
        "sys_net = sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else None\n"
        "print(json.dumps({'sys': sys_net, 'proc': devices, 'index': [n for _, n in socket.if_nameindex()],"
        " 'routes': open('/proc/net/route').read().splitlines()[1:]}))"
    )
    result = await run_inside(node_label, code)
    assert result.ok, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop("sys") in ([["lo"]] if tier == "runc" else [["lo"], None])
    assert seen == {"proc": ["lo"], "index": ["lo"], "routes": []}
    assert_nothing_left(docker_api, node_label)


async def test_root_file_system_is_read_only(docker_api: docker.APIClient, node_label: str, tier: str) -> None:
    """/var/tmp is mode 1777 in the image, so only the read-only root refuses a write there. gVisor checks the
    permission of / (root's, 0755) before the read-only mount: EACCES there, where runc says EROFS."""
    code = (
        "import errno\n"
        "for path in ('/var/tmp/pwned', '/pwned', '/etc/passwd', '/usr/bin/python3'):\n"
        "    try:\n"
        "        open(path, 'a').close()\n"
        "        print(path, 'WRITABLE')\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    result = await run_inside(node_label, code)
    lines = result.stdout.split("\n")
    assert lines[0] == "/var/tmp/pwned EROFS"
    assert lines[1] == ("/pwned EROFS" if tier == "runc" else "/pwned EACCES")
    assert "WRITABLE" not in result.stdout
    assert_nothing_left(docker_api, node_label)


async def test_identity_capabilities_and_no_new_privileges(docker_api: docker.APIClient, node_label: str) -> None:
    # NoNewPrivs from prctl(PR_GET_NO_NEW_PRIVS): gVisor answers it but leaves it out of /proc/self/status.
    code = (
        "import ctypes, os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getegid(), status['CapEff'].strip(),"
        " status['CapPrm'].strip(), ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"
    )
    result = await run_inside(node_label, code)
    uid, *rest = result.stdout.split()
    assert SANDBOX_UID_BASE <= int(uid) < SANDBOX_UID_BASE + SANDBOX_UID_COUNT
    assert rest == [uid] * 3 + ["0000000000000000", "0000000000000000", "1"]
    assert_nothing_left(docker_api, node_label)


async def test_canary_passes_on_the_hardened_config(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        health = await ex.health()
        canary = await ex.canary()
    assert health.ok, health
    assert canary.ok, canary
    seen = json.loads(canary.detail)
    assert (seen["interfaces"], seen["gid"], seen["groups"], seen["root_write"]) == (
        ["lo"],
        seen["uid"],
        [seen["uid"]],
        "EROFS",
    )
    assert SANDBOX_UID_BASE <= seen["uid"] < SANDBOX_UID_BASE + SANDBOX_UID_COUNT
    assert_nothing_left(docker_api, node_label)


# Reads a cgroup file of the container's own, on cgroup v1 (one hierarchy per controller) or v2 (unified).
CGROUP_READ = """
import os
def cgroup(controller, name, v2_name=None):
    for path in (f"/sys/fs/cgroup/{controller}/{name}", f"/sys/fs/cgroup/{v2_name or name}"):
        if os.path.exists(path):
            return open(path).read().strip()
    raise FileNotFoundError(name)
"""

FORK_BOMB = (
    CGROUP_READ
    + """
import resource, sys
origin = os.getpid()
def pids(name):
    try:
        return cgroup("pids", name)
    except FileNotFoundError:  # runsc of 2022: no cgroupfs inside
        return "-"
while True:
    try:
        os.fork()
    except BlockingIOError as exc:  # every process forks on; the first one reports where it was stopped
        if os.getpid() == origin:
            nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
            print(exc.strerror, pids("pids.current"), pids("pids.max"), nproc, flush=True)
            sys.exit(0)
"""
)


async def test_fork_bomb_stops_at_the_pids_ceiling(docker_api: docker.APIClient, node_label: str, tier: str) -> None:
    """Not a timeout: the bomb itself meets EAGAIN at the ceiling, reports it, and its run ends (the supervisor
    kills every process the bomb left) well before its timeout. Under runc the ceiling is pids.max (and nproc);
    under gVisor it is RLIMIT_NPROC, which the Sentry enforces. Each gVisor process also costs the Sentry host
    memory, so in 128 MiB the bomb meets the memory limit first (contained all the same): 256 MiB here."""
    memory = 128 if tier == "runc" else 256
    async with executor(node_label) as ex:
        limits = Limits(timeout_ms=20_000, memory_mb=memory)
        bomb = await ex.run_code(ExecRequest("python", FORK_BOMB, limits=limits))
        after = await ex.run_code(ExecRequest("python", "print('still fine')"))
    assert (bomb.ok, bomb.error_kind) == (True, None), bomb.stderr
    why, current, ceiling, nproc = bomb.stdout.rsplit(maxsplit=3)
    assert (why, nproc) == ("Resource temporarily unavailable", "50")
    if tier == "runc":
        assert ceiling == "50" and int(current) <= 50
    else:  # no cgroupfs inside (runsc of 2022), or the Sentry's own, which sets no ceiling (runsc of 2024)
        assert (current, ceiling) == ("-", "-") or (ceiling == "max" and int(current) <= 50), bomb.stdout
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
    async with executor(node_label) as ex:
        result = await ex.run_code(ExecRequest("python", "while True:\n    pass", limits=Limits(timeout_ms=1000)))
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


# A fresh process owns an executor and measures its own memory around one run of a 150 MiB output flood: its
# resident peak (VmHWM) is reset through /proc/self/clear_refs just before the run, so nothing that happened
# earlier in it can hide the growth (ru_maxrss, the peak so far, was already higher whenever an earlier test
# had peaked higher).
FLOOD_MEMORY = """
import json, sys, trio
from pathlib import Path
from executor.contract import ExecRequest, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor

def status_kib(field):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1])

async def main():
    code = "import sys\\nchunk = 'x' * 65536\\nfor _ in range(150 * 16):\\n    sys.stdout.write(chunk)\\n"
    async with Executor.open(ExecutorPolicy(subset_check=False, pool_size=0), node_label=sys.argv[1]) as ex:
        await ex.run_code(ExecRequest("python", "print(1)"))  # warm: the first run allocates what all will use
        before = status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        result = await ex.run_code(ExecRequest("python", code, limits=Limits(timeout_ms=25_000)))
        peak = status_kib("VmHWM")
    print(json.dumps({"growth_kib": peak - before, "ok": result.ok, "stdout": len(result.stdout),
                      "truncated": result.stdout_truncated, "stderr": result.stderr[-500:]}))

trio.run(main)
"""


@pytest.mark.runc_only("the node's memory while it reads a flood: the same under every tier")
async def test_output_flood_is_truncated_in_bounded_memory(docker_api: docker.APIClient, node_label: str) -> None:
    done = await trio.run_process(
        [sys.executable, "-c", FLOOD_MEMORY, node_label], capture_stdout=True, capture_stderr=True
    )
    seen = json.loads(done.stdout.decode().splitlines()[-1])
    assert seen["ok"], seen["stderr"]
    assert (seen["stdout"], seen["truncated"]) == (POLICY.stdout_cap, True)
    assert seen["growth_kib"] < 40 * 1024, f"the node's peak grew {seen['growth_kib'] / 1024:.0f} MiB for 150 MiB"
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


@pytest.mark.runc_only("the node's kill and removal: the same under every tier")
async def test_abort_kills_and_removes_and_reports_aborted(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        results: list[ExecResult] = []

        async def long_run() -> None:
            results.append(await ex.run_code(ExecRequest("python", "import time\ntime.sleep(60)")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_run)
            await wait_until(lambda: ex.stats().runs_in_flight == 1)
            await trio.sleep(0.5)
            ex.abort_all()
    assert [(r.ok, r.error_kind, r.queue_reason) for r in results] == [(False, ErrorKind.ABORTED, "aborted")]
    assert_nothing_left(docker_api, node_label)


@pytest.mark.runc_only("the node's kill and removal: the same under every tier")
async def test_caller_cancel_kills_and_removes(docker_api: docker.APIClient, node_label: str) -> None:
    async with executor(node_label) as ex:
        with trio.move_on_after(1.0) as scope:
            await ex.run_code(ExecRequest("python", "import time\ntime.sleep(60)"))
        assert scope.cancelled_caught
        running = docker_api.containers(filters={"label": f"edgecoder.node={node_label}", "status": "running"})
        assert running == []
        assert ex.stats().runs_in_flight == 0
    assert_nothing_left(docker_api, node_label)


@pytest.mark.runc_only("the node's kill and removal: the same under every tier")
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


# -- wall-clock limits that hold ---------------------------------------------------------------------------------

FLOOD = "import sys\nwhile True:\n    sys.stdout.write('A' * 65536)"


@pytest.mark.runc_only("the node's kill under a flood: the same under every tier")
@pytest.mark.parametrize("pool_size", [0, 1])
async def test_an_output_flood_does_not_stall_the_kill(
    docker_api: docker.APIClient, node_label: str, pool_size: int
) -> None:
    """The container used to be killed while its attach socket was open and unread: dockerd's kill then blocked
    until the 20 s API timeout (a 3 s run took 23 s). How long the kill takes is a timing: benchmarks/bench_limits.py
    measures it and fails when it nears the API timeout. Here: the run ends as a timeout, with its output capped."""
    async with executor(node_label, pool_size=pool_size) as ex:
        if pool_size:
            await wait_until(lambda: ex.stats().pool_ready == 1)
        result = await ex.run_code(ExecRequest("python", FLOOD, limits=Limits(timeout_ms=1000)))
        running = docker_api.containers(filters={"label": f"edgecoder.node={node_label}", "status": "running"})
    assert (result.error_kind, result.exit_code, result.stdout_truncated) == (ErrorKind.TIMEOUT, 124, True)
    assert len(result.stdout) == POLICY.stdout_cap
    assert running == [] or all(c["Labels"].get("edgecoder.role") == "pool" for c in running)
    assert_nothing_left_but_the_pool(docker_api, node_label)


async def test_the_last_bytes_before_a_timeout_are_kept(docker_api: docker.APIClient, node_label: str) -> None:
    """The newest 43 bytes of each stream were held back as a possible trailer, and dropped on a timeout."""
    code = "import sys, time\nprint('hello')\nprint('bye', file=sys.stderr)\nsys.stdout.flush()\ntime.sleep(60)"
    result = await run_inside(node_label, code, limits=Limits(timeout_ms=1500))
    assert (result.error_kind, result.stdout, result.stderr) == (ErrorKind.TIMEOUT, "hello\n", "bye\n")
    assert_nothing_left(docker_api, node_label)


@pytest.mark.runc_only("the node's process dying: the same under every tier")
async def test_a_container_whose_owner_was_killed_ends_at_its_own_deadline(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """SIGKILL of the host process (`edgecoder exec`, a node) and of its guardian (which would remove them at once,
    tests/test_executor_owned.py) must not leave a container running past its limit: the supervisor inside ends
    the run at its timeout (+0.5 s) by itself, and a waiting pool container ends as soon as its owner's attach
    connection closes."""
    owner = await start_executor_process(node_label, pool_size=1, timeout_ms=2000, code=NAMED_SLEEPER)
    await wait_until(lambda: a_cold_program_runs(docker_api, node_label))
    await kill_process(owner, with_guardian=True)
    exits = {}
    for container in containers_of(docker_api, node_label):
        status = docker_api.wait(container["Id"], timeout=15)["StatusCode"]
        exits[container["Labels"]["edgecoder.role"]] = status
    assert exits == {"cold": TIMEOUT_EXIT_CODE, "pool": BOOTSTRAP_FAILED}


@pytest.mark.runc_only("the node's sweep: the same under every tier")
async def test_every_executor_sweeps_what_dead_owners_left_and_spares_the_living(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """Owners are judged by boot id, pid namespace, pid and start time: a one-off `exec` that was killed is swept
    by the next executor, whatever its label; a live node with the same label (the same key) keeps its pool."""
    dead_oneoff = await start_executor_process(node_label, pool_size=0, timeout_ms=20_000, code=NAMED_SLEEPER)
    await wait_until(lambda: a_cold_program_runs(docker_api, node_label))
    await kill_process(dead_oneoff, with_guardian=True)
    dead_ids = {c["Id"] for c in containers_of(docker_api, node_label)}
    living = await start_executor_process(node_label, pool_size=1)
    try:
        living_ids = {c["Id"] for c in containers_of(docker_api, node_label)} - dead_ids
        assert len(dead_ids) == 1 and len(living_ids) == 1
        async with executor(f"{node_label}-sweeper") as ex:
            await wait_until(lambda: ex.stats().pending_removals == 0 and ex.swept)
        assert {c["Id"] for c in containers_of(docker_api, node_label)} == living_ids
    finally:
        await kill_process(living)


# -- the exit status cannot be forged ----------------------------------------------------------------------------

FORGER = r"""
import ctypes, errno, os, re, sys
found, tried = set(), {}
def attempt(name, read):
    try:
        found.update(re.findall(rb"[0-9a-f]{32}", read()))
        tried[name] = "read"
    except OSError as exc:
        tried[name] = errno.errorcode[exc.errno]
attempt("cmdline", lambda: open("/proc/1/cmdline", "rb").read())
attempt("environ", lambda: open("/proc/1/environ", "rb").read())
attempt("fd", lambda: b"".join(os.readlink(f"/proc/1/fd/{fd}").encode() for fd in os.listdir("/proc/1/fd")))
def memory():
    maps = open("/proc/1/maps").read().splitlines()
    with open("/proc/1/mem", "rb") as mem:
        chunks = []
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if "rw" in line.split()[1]:
                mem.seek(start)
                chunks.append(mem.read(end - start))
        return b"".join(chunks)
attempt("mem", memory)
libc = ctypes.CDLL(None, use_errno=True)
tried["ptrace"] = "ok" if libc.ptrace(16, 1, None, None) == 0 else errno.errorcode[ctypes.get_errno()]
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buffer = ctypes.create_string_buffer(16)
local, remote = IoVec(ctypes.addressof(buffer), 16), IoVec(0x400000, 16)
r = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
tried["process_vm_readv"] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
print(sorted(tried.items()), file=sys.stderr)
for nonce in found:
    trailer = b"EC1END:" + nonce + b":000\n"
    for fd in (1, 2):
        os.write(fd, trailer)
        os.write(fd, trailer.replace(b"EC1END", b"EC2END"))
sys.exit(7)
"""


async def test_a_failing_program_cannot_report_success(
    docker_api: docker.APIClient, node_label: str, tier: str
) -> None:
    """The nonce was in /proc/1/cmdline and the supervisor could be traced: a program exiting 7 reported ok.

    gVisor's /proc applies the supervisor's PR_SET_DUMPABLE 0 to its memory but not to its environment or its fd
    links (measured): they hold no nonce (it lives in the supervisor's memory only), which the result proves."""
    result = await run_inside(node_label, FORGER)
    assert (result.ok, result.exit_code, result.error_kind) == (False, 7, ErrorKind.EXECUTION_FAILED)
    tried = dict(ast.literal_eval(result.stderr.splitlines()[0]))
    assert tried["mem"] == "EACCES", tried
    if tier == "runc":
        assert tried["environ"] == tried["fd"] == "EACCES", tried
    assert tried["ptrace"] == tried["process_vm_readv"] == "EPERM", tried
    assert_nothing_left(docker_api, node_label)


# The program names itself once it runs: its interpreter (python3 /tmp/main.py) exists before the code arrives.
NAMED_SLEEPER = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'ec-running', 0, 0, 0)\ntime.sleep(60)"


def a_cold_program_runs(api: docker.APIClient, label: str) -> bool:
    """NAMED_SLEEPER runs in a cold container of `label` (a run's readiness, seen from the host)."""
    for container in containers_of(api, label):
        if container["Labels"].get("edgecoder.role") != "cold":
            continue
        try:
            processes = api.top(container["Id"], ps_args="-o pid,comm")["Processes"] or []
        except docker.errors.APIError:  # not running (yet)
            continue
        if any(process[-1] == "ec-running" for process in processes):
            return True
    return False


def assert_nothing_left_but_the_pool(api: docker.APIClient, label: str) -> None:
    assert [c for c in containers_of(api, label) if c["Labels"].get("edgecoder.role") != "pool"] == []


# -- the shipped seccomp profile, and what is masked ------------------------------------------------------------

SYSCALL_PROBE = r"""
import ctypes, errno, json, mmap, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS = {
    "x86_64": {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
               "memfd_create": 319, "memfd_secret": 447, "ptrace": 101, "process_vm_readv": 310,
               "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312},
    "aarch64": {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282,
                "memfd_create": 279, "memfd_secret": 447, "ptrace": 117, "process_vm_readv": 270,
                "process_vm_writev": 271, "pidfd_getfd": 438, "kcmp": 272},
}[platform.machine()]
seen = {}
for name, number in NUMBERS.items():
    # Arguments that the kernel itself would accept or refuse with EINVAL/EFAULT/EBADF, never EPERM.
    buffer = ctypes.create_string_buffer(256)
    result = libc.syscall(number, 1, buffer, 0, 0, 0, 0)
    seen[name] = "allowed" if result >= 0 else errno.errorcode[ctypes.get_errno()]
def socket_of(family):
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        return "allowed"
    except OSError as exc:
        return errno.errorcode[exc.errno]
seen["socket(AF_VSOCK)"] = socket_of(40)  # created only, never connected
seen["socket(AF_ALG)"] = socket_of(38)
seen["socket(AF_UNIX)"] = socket_of(socket.AF_UNIX)
seen["socket(AF_INET)"] = socket_of(socket.AF_INET)
if platform.machine() == "x86_64":
    # socket(AF_VSOCK) through the 32-bit socketcall multiplexer (int 0x80), whose arguments seccomp cannot see,
    # from machine code in an executable mapping: in a child, since a denied architecture may kill it (SIGSYS).
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = libc.mmap(None, 4096, 7, 0x02 | 0x20 | 0x40, -1, 0)  # RWX, private, anonymous, below 2 GiB
    args = page + 2048
    ctypes.memmove(args, (ctypes.c_uint32 * 3)(40, 1, 0), 12)
    code = (b"\x53\xb8" + (102).to_bytes(4, "little") + b"\xbb" + (1).to_bytes(4, "little")
            + b"\xb9" + args.to_bytes(4, "little") + b"\xcd\x80\x5b\xc3")
    ctypes.memmove(page, code, len(code))
    child = os.fork()
    if child == 0:
        result = ctypes.CFUNCTYPE(ctypes.c_int)(page)()
        if result >= 0:  # a vsock socket, or a call that was not socketcall at all (gVisor runs int 0x80 as the
            try:         # x86_64 syscall 102, getuid)
                vsock = socket.socket(fileno=result).family == 40
            except OSError:
                vsock = False
            os._exit(0 if vsock else 121)
        os._exit(min(-result, 120))
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    seen["i386 socketcall(AF_VSOCK)"] = "allowed" if status == 0 else "no socket" if status == 121 else (
        f"killed by signal {-status}" if status < 0 else errno.errorcode[status])
print(json.dumps(seen))
"""


async def test_the_shipped_seccomp_profile_denies_from_inside(docker_api: docker.APIClient, node_label: str) -> None:
    result = await run_inside(node_label, SYSCALL_PROBE)
    assert result.ok, result.stderr
    seen = json.loads(result.stdout)
    allowed = {"socket(AF_UNIX)", "socket(AF_INET)"}
    assert {name for name, outcome in seen.items() if outcome == "allowed"} == allowed, seen
    denied = {name: outcome for name, outcome in seen.items() if name not in allowed}
    # EPERM is seccomp's answer (defaultErrnoRet 1); a syscall of a denied architecture kills with SIGSYS; gVisor
    # has no 32-bit entry point at all (int 0x80 ran getuid: "no socket").
    assert set(denied.values()) <= {"EPERM", "killed by signal 31", "no socket"}, denied
    assert_nothing_left(docker_api, node_label)


MEMFD_EXEC = """
import os
try:
    fd = os.memfd_create("elf")
except PermissionError:
    print("memfd_create denied")
else:
    os.write(fd, open("/bin/true", "rb").read())  # bytes of the program's choosing, in memory only
    child = os.fork()
    if child == 0:
        try:
            os.execv(f"/proc/self/fd/{fd}", ["true"])
        finally:
            os._exit(100)
    print("executed" if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0 else "not executed")
"""


async def test_a_native_elf_cannot_run_from_memory(docker_api: docker.APIClient, node_label: str) -> None:
    """/tmp is noexec, but an ELF written to a memfd ran: memfd_create is denied by the shipped profile."""
    result = await run_inside(node_label, MEMFD_EXEC)
    assert (result.ok, result.stdout) == (True, "memfd_create denied\n"), result.stderr
    assert_nothing_left(docker_api, node_label)


MASK_PROBE = """
import json, os
def look(path):
    if os.path.isdir(path):
        return sorted(os.listdir(path))
    try:
        return open(path, "rb").read(200).decode(errors="replace")
    except OSError as exc:
        return exc.strerror
paths = ["/proc/kallsyms", "/proc/cmdline", "/proc/sys/kernel/random/boot_id", "/proc/kcore", "/proc/keys",
         "/proc/timer_list", "/sys/firmware", "/sys/kernel", "/sys/module", "/sys/devices/virtual/dmi"]
net = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
print(json.dumps({path: look(path) for path in paths} | {"net": net}))
"""


async def test_what_the_container_does_not_need_is_masked(
    docker_api: docker.APIClient, node_label: str, tier: str
) -> None:
    host_boot_id = Path("/proc/sys/kernel/random/boot_id").read_text()
    host_cmdline = Path("/proc/cmdline").read_text().strip()
    result = await run_inside(node_label, MASK_PROBE)
    assert result.ok, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop("net") == ["lo"]  # what the canary reads stays readable
    if tier == "gvisor":  # gVisor's own kernel command line, a constant that says nothing of the host
        assert seen.pop("/proc/cmdline") == "BOOT_IMAGE=/vmlinuz-4.4.0-gvisor quiet\n"
        assert host_cmdline not in result.stdout
        # runsc of 2024 has a boot id of the Sentry's own, drawn as each sandbox starts: it links no two runs
        boot_id = seen.pop("/proc/sys/kernel/random/boot_id")
        if boot_id not in ("", "No such file or directory"):
            again = json.loads((await run_inside(node_label, MASK_PROBE)).stdout)
            assert uuid.UUID(boot_id.strip()) and again["/proc/sys/kernel/random/boot_id"] != boot_id
    # A masked file reads as empty (/dev/null is mounted on it), a masked directory lists nothing; a path this
    # kernel does not have (/proc/kcore here) stays absent.
    assert {path: value for path, value in seen.items() if value not in ("", [], "No such file or directory")} == {}
    assert host_boot_id not in result.stdout
    assert_nothing_left(docker_api, node_label)


async def test_resolv_conf_carries_nothing_of_the_hosts(docker_api: docker.APIClient, node_label: str) -> None:
    host = [line.split() for line in Path("/etc/resolv.conf").read_text().splitlines() if line.strip()]
    host_values = {word for words in host if words[0] in ("nameserver", "search", "domain") for word in words[1:]}
    result = await run_inside(node_label, "print(open('/etc/resolv.conf').read(), end='')")
    assert result.ok, result.stderr
    inside = result.stdout.split()
    assert host_values and not host_values & set(inside), (host_values, result.stdout)
    assert result.stdout == "nameserver 127.0.0.1\noptions ndots:1\n"
    assert_nothing_left(docker_api, node_label)


# -- isolation from other sandboxes -------------------------------------------------------------------------------

INOTIFY_HOG = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while (fd := libc.inotify_init1(0)) >= 0:
    held.append(fd)
libc.prctl(15, b"inotify-hog", 0, 0, 0)  # PR_SET_NAME: the host's readiness signal
time.sleep(60)
"""
INOTIFY_ONE = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
print("created" if libc.inotify_init1(0) >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def a_hog_holds_its_inotify_instances() -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "inotify-hog":
                return True
        except OSError:
            continue
    return False


@pytest.mark.runc_only("per-uid limits of runc's shared host kernel; under gVisor each sandbox has a kernel of its own")
async def test_one_sandbox_cannot_exhaust_per_user_limits_of_another(
    docker_api: docker.APIClient, node_label: str
) -> None:
    """Every sandbox ran as uid 65534, and per-uid limits (128 inotify instances) were shared between them."""
    async with executor(node_label, max_concurrent=2) as ex, trio.open_nursery() as nursery:
        nursery.start_soon(ex.run_code, ExecRequest("python", INOTIFY_HOG, limits=Limits(timeout_ms=20_000)))
        await wait_until(a_hog_holds_its_inotify_instances, timeout_s=20)
        other = await ex.run_code(ExecRequest("python", INOTIFY_ONE))
        ex.abort_all()
    assert (other.ok, other.stdout) == (True, "created\n"), other.stderr
    assert_nothing_left(docker_api, node_label)


async def test_every_sandbox_has_a_uid_of_its_own(docker_api: docker.APIClient, node_label: str) -> None:
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())"
    async with executor(node_label, max_concurrent=2) as ex:
        results = [await ex.run_code(ExecRequest("python", code)) for _ in range(3)]
    identities = [r.stdout.strip().split(maxsplit=2) for r in results]
    assert all(r.ok for r in results), [r.stderr for r in results]
    uids = [int(uid) for uid, _, _ in identities]
    assert len(set(uids)) == 3
    assert all(SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_COUNT for uid in uids), uids
    assert all(gid == uid and groups == f"[{uid}]" for uid, gid, groups in identities), identities
    assert_nothing_left(docker_api, node_label)
