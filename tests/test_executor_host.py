"""The host runner (origin local only): scrubbed environment, rlimits, wall timeout, bounded output."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from executor.contract import ErrorKind, ExecRequest, ExecResult, Limits
from executor.host import run_on_host
from executor.policy import ExecutorPolicy

POLICY = ExecutorPolicy(stdout_cap=1000, stderr_cap=1000)


async def host(
    code: str, *, language: str = "python", input: object = None, limits: Limits | None = None
) -> ExecResult:
    request = ExecRequest(language, code, input)  # type: ignore[arg-type]
    return await run_on_host(request, POLICY.clamp(limits or Limits()), POLICY)


async def test_input_arrives_as_json_on_stdin_and_stdout_comes_back() -> None:
    result = await host("import json, sys\nd = json.load(sys.stdin)\nprint(sum(d['xs']))", input={"xs": [1, 2, 3]})
    assert (result.ok, result.stdout, result.exit_code, result.error_kind) == (True, "6\n", 0, None)


async def test_javascript_runs_too() -> None:
    code = "let s='';process.stdin.on('data',c=>s+=c).on('end',()=>console.log(JSON.parse(s).n*2))"
    result = await host(code, language="javascript", input={"n": 21})
    assert (result.ok, result.stdout) == (True, "42\n"), result.stderr


async def test_environment_is_scrubbed_to_path_home_and_lang() -> None:
    result = await host("import json, os\nprint(json.dumps(dict(os.environ)))")
    env = json.loads(result.stdout)
    assert set(env) == {"PATH", "HOME", "LANG"}
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"].startswith("/tmp/") or "edgecoder-host-" in env["HOME"]


async def test_rlimits_are_set_before_the_program_starts() -> None:
    code = (
        "import resource as r\n"
        "print(r.getrlimit(r.RLIMIT_NOFILE), r.getrlimit(r.RLIMIT_AS), r.getrlimit(r.RLIMIT_CPU),"
        " r.getrlimit(r.RLIMIT_CORE))"
    )
    result = await host(code, limits=Limits(timeout_ms=2500, memory_mb=200, cpus=0.5))
    assert result.stdout.strip() == f"(256, 256) ({200 << 20}, {200 << 20}) (4, 4) (0, 0)"


async def test_memory_limit_stops_an_allocation() -> None:
    result = await host("x = bytearray(400 * 1024 * 1024)", limits=Limits(memory_mb=100))
    assert result.error_kind is ErrorKind.EXECUTION_FAILED
    assert "MemoryError" in result.stderr


def alive(pid: int, start_ticks: str) -> bool:
    """The process `pid` that started at `start_ticks` still runs (a zombie has died; a new pid is another one)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start_ticks


async def test_wall_timeout_kills_the_process_group_with_exit_124() -> None:
    """The program's own child (same process group) dies with it: it would otherwise sleep on for a minute."""
    code = (
        "import os, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, open(f'/proc/{child}/stat').read().rsplit(')', 1)[1].split()[19], flush=True)\n"
        "time.sleep(60)"
    )
    result = await host(code, limits=Limits(timeout_ms=1000))
    assert (result.ok, result.exit_code, result.error_kind, result.queue_reason) == (
        False,
        124,
        ErrorKind.TIMEOUT,
        "timeout",
    )
    pid, start_ticks = result.stdout.split()
    with trio.fail_after(10):
        while alive(int(pid), start_ticks):
            await trio.sleep(0.02)


async def test_a_busy_loop_also_times_out() -> None:
    result = await host("while True:\n    pass", limits=Limits(timeout_ms=300))
    assert (result.exit_code, result.error_kind) == (124, ErrorKind.TIMEOUT)


async def test_output_is_capped_and_flagged() -> None:
    code = "import sys\nsys.stdout.write('o' * 5_000_000)\nsys.stderr.write('e' * 5_000)"
    result = await host(code)
    assert result.ok
    assert (len(result.stdout), result.stdout_truncated) == (1000, True)
    assert (len(result.stderr), result.stderr_truncated) == (1000, True)


async def test_failure_keeps_its_exit_code_and_stderr() -> None:
    result = await host("import sys\nprint('bad', file=sys.stderr)\nsys.exit(7)")
    assert (result.ok, result.exit_code, result.error_kind, result.stderr) == (
        False,
        7,
        ErrorKind.EXECUTION_FAILED,
        "bad\n",
    )
    assert result.queue_for_cloud is False


async def test_signal_death_reads_as_128_plus_signal() -> None:
    result = await host("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert result.exit_code == 128 + 15


async def test_input_that_is_not_json_is_refused_before_any_process() -> None:
    result = await host("print(1)", input={1, 2})
    assert (result.ok, result.error_kind, result.exit_code) == (False, ErrorKind.EXECUTION_FAILED, None)
