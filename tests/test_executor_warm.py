"""Warm start (executor/supervisor.py): a program run by an interpreter that was started before its code arrived
behaves exactly as one started on arrival, in both languages; the exit status stays unforgeable and every limit
holds on the new path.

Every comparison runs the same programs on four paths and demands identical results:

- "on arrival": `prestart=False`, the interpreter forked once the task is in (the path before warm start);
- "prestarted, cold": a cold container told its language first, its interpreter parked while the task comes;
- "warm pool": a pool container parked for the task's language long before the task (the warm path);
- "pool of the other language": the parked interpreter is killed and the task's started on arrival.
"""

from __future__ import annotations

import ast
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import docker
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import executor.sandbox
from executor.bootstrap import NOT_PARKED, PARKED, encode_header, encode_prestart
from executor.container_config import SANDBOX_UID_BASE, SANDBOX_UID_COUNT
from executor.containers import StartedContainer
from executor.contract import ErrorKind, ExecRequest, ExecResult, Language, Limits
from executor.output import FRAME_HEADER
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.supervisor import HEADER_SIZE, PRESTART_SIZE, PROGRAMS, ProtocolError, parse_header, parse_prestart
from tests.conftest import containers_of
from tests.docker_support import wait_pool_ready

PATHS = ("on arrival", "prestarted, cold", "warm pool", "pool of the other language")
OTHER: dict[Language, Language] = {"python": "javascript", "javascript": "python"}
LANGS: tuple[Language, ...] = ("python", "javascript")


def path_policy(path: str, language: Language, **changes: Any) -> ExecutorPolicy:
    paths: dict[str, dict[str, Any]] = {
        "on arrival": {"prestart": False, "pool_size": 0},
        "prestarted, cold": {"pool_size": 0},
        "warm pool": {"pool_size": 1, "pool_languages": (language,)},
        "pool of the other language": {"pool_size": 1, "pool_languages": (OTHER[language],)},
    }
    fields = paths[path]
    return ExecutorPolicy(subset_check=False, **fields, **changes)


def expected_take(path: str, language: Language) -> str:
    return {"warm pool": language, "pool of the other language": OTHER[language]}.get(path, "cold")


@asynccontextmanager
async def executor_on(path: str, language: Language, label: str, **changes: Any) -> AsyncIterator[Executor]:
    """An executor whose runs of `language` take `path`; on leaving, proof that every run did."""
    async with Executor.open(path_policy(path, language, **changes), node_label=label) as ex:
        taken: list[str] = []
        real_take = ex.pool.take

        def recording_take(limits: Limits, language: Language) -> StartedContainer | None:
            container = real_take(limits, language)
            taken.append("cold" if container is None else str(container.prestarted))
            return container

        ex.pool.take = recording_take  # type: ignore[method-assign]
        yield ex
    assert taken and set(taken) == {expected_take(path, language)}, (path, taken)


async def run_once(ex: Executor, request: ExecRequest) -> ExecResult:
    await wait_pool_ready(ex)  # a pool container is taken only once its interpreter is parked
    return await ex.run_code(request)


def comparable(result: ExecResult) -> tuple[Any, ...]:
    return (
        result.ok,
        result.stdout,
        result.stderr,
        result.exit_code,
        result.error_kind,
        result.stdout_truncated,
        result.stderr_truncated,
    )


async def on_every_path(language: Language, label: str, requests: list[ExecRequest]) -> dict[str, list[ExecResult]]:
    results = {}
    for path in PATHS:
        async with executor_on(path, language, label) as ex:
            results[path] = [await run_once(ex, request) for request in requests]
    return results


def assert_same_on_every_path(results: dict[str, list[ExecResult]]) -> None:
    reference = [comparable(r) for r in results["on arrival"]]
    for path, seen in results.items():
        assert [comparable(r) for r in seen] == reference, path


# -- the interpreter the program sees ----------------------------------------------------------------------------

PYTHON_PROBE = r"""
import sys

modules = sorted(sys.modules)  # first: before this probe imports anything
import builtins, gc, json, os, re, resource, signal, stat, threading

main = sys.modules["__main__"]
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines())
def kind(fd):
    return stat.filemode(os.fstat(fd).st_mode)[0]
def target(fd):
    return re.sub(r"\[\d+\]", "[]", os.readlink(f"/proc/self/fd/{fd}"))
stdin_tell = sys.stdin.tell()
site = sys.modules["site"]
seen = {
    "modules": modules,
    "argv": sys.argv,
    "orig_argv": sys.orig_argv,
    "path": sys.path,
    "flags": repr(sys.flags),
    "executable": sys.executable,
    "prefixes": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.platlibdir],
    "site": [site.ENABLE_USER_SITE, site.getsitepackages(), site.USER_SITE],
    "main": [main is sys.modules[__name__], __name__, __file__, __package__, __spec__, type(__loader__).__name__,
             getattr(__loader__, "path", None), __cached__, __doc__, __builtins__ is builtins],
    "main_names": sorted(vars(main)),
    "importer_cache": sorted((key, type(value).__name__) for key, value in sys.path_importer_cache.items()),
    "stdin": [kind(0), target(0), sys.stdin.seekable(), sys.stdin.isatty(), sys.stdin.encoding, sys.stdin.errors,
              sys.stdin.line_buffering, sys.stdin.buffer.raw.name, type(sys.stdin.buffer).__name__, stdin_tell,
              sys.stdin.read()],
    "stdout": [kind(1), sys.stdout.encoding, sys.stdout.errors, sys.stdout.line_buffering, sys.stdout.write_through],
    "stderr": [kind(2), sys.stderr.encoding, sys.stderr.errors, sys.stderr.line_buffering],
    "fds": sorted((fd, target(int(fd))) for fd in os.listdir("/proc/self/fd") if fd != "3"),  # 3: listdir's own
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "umask": os.umask(0o22),
    "ids": [os.getuid() == os.geteuid(), os.getgid() == os.getegid(), os.getppid(), os.getpgrp(), os.getsid(0)],
    "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name[:7] == "RLIMIT_"},
    "status": {key: status[key] for key in ("SigIgn", "SigBlk", "SigCgt", "NoNewPrivs", "Seccomp", "CapEff")},
    "threads": status["Threads"],
    "oom_score_adj": open("/proc/self/oom_score_adj").read(),
    "signals": {sig.name: repr(signal.getsignal(sig)) for sig in signal.Signals},
    "interpreter": [sys.getrecursionlimit(), sys.getswitchinterval(), sys.dont_write_bytecode, sys.warnoptions,
                    sys._xoptions, gc.isenabled(), gc.get_threshold(), sys.getfilesystemencoding(),
                    threading.active_count(), sys.pycache_prefix],
}
print(json.dumps(seen, sort_keys=True))
"""

JAVASCRIPT_PROBE = r"""
const loaded = process.moduleLoadList.slice(); // first: before this probe loads anything
const fs = require('fs');
const status = Object.fromEntries(
  fs.readFileSync('/proc/self/status', 'utf8').trim().split('\n').map(line => line.split(':\t')));
const target = fd => fs.readlinkSync(`/proc/self/fd/${fd}`).replace(/\[\d+\]/, '[]');
const kind = fd => {
  const s = fs.fstatSync(fd);
  return s.isFile() ? 'file' : s.isFIFO() ? 'fifo' : s.isSocket() ? 'socket' : 'other';
};
const seen = {
  moduleLoadList: loaded,
  argv: process.argv, execArgv: process.execArgv, execPath: process.execPath, title: process.title,
  argv0: process.argv0, env: process.env, cwd: process.cwd(), umask: process.umask(), ppid: process.ppid,
  main: [require.main === module, module.id, module.filename, module.loaded, module.paths, __filename, __dirname,
         module.children.length, Object.keys(require.cache)],
  globals: Object.getOwnPropertyNames(globalThis).sort(),
  stdin: [kind(0), target(0), process.stdin.constructor.name, process.stdin.isTTY ?? null, process.stdin.fd,
          fs.readFileSync(0, 'utf8')],
  stdout: [kind(1), process.stdout.constructor.name, process.stdout._type, process.stdout.isTTY ?? null],
  stderr: [kind(2), process.stderr.constructor.name, process.stderr._type],
  fds: fs.readdirSync('/proc/self/fd').map(fd => {
    try { return [fd, target(fd)]; } catch (e) { return [fd, e.code]; }
  }),
  status: ['SigIgn', 'SigBlk', 'SigCgt', 'NoNewPrivs', 'Seccomp', 'CapEff', 'Threads'].map(k => [k, status[k]]),
  oomScoreAdj: fs.readFileSync('/proc/self/oom_score_adj', 'utf8'),
  limits: fs.readFileSync('/proc/self/limits', 'utf8'),
  listeners: ['exit', 'uncaughtException', 'unhandledRejection', 'SIGINT', 'SIGTERM', 'warning']
    .map(e => [e, process.listenerCount(e)]),
  versions: process.versions, features: process.features, exitCode: process.exitCode ?? null,
};
console.log(JSON.stringify(seen));
"""


async def test_python_sees_the_same_interpreter_on_every_path(docker_api: docker.APIClient, node_label: str) -> None:
    results = await on_every_path("python", node_label, [ExecRequest("python", PYTHON_PROBE, {"xs": [1, 2]})])
    assert all(r[0].ok for r in results.values()), {path: r[0].stderr for path, r in results.items()}
    assert_same_on_every_path(results)
    seen = json.loads(results["warm pool"][0].stdout)
    # ... and it is a plain `python3 /tmp/main.py`: site, the script's directory first, a fresh __main__.
    assert (seen["argv"], seen["orig_argv"], seen["path"][0]) == (
        ["/tmp/main.py"],
        ["/usr/bin/python3", "/tmp/main.py"],
        "/tmp",
    )
    assert "site" in seen["modules"] and "isolated=0" in seen["flags"] and "no_site=0" in seen["flags"]
    loader = ["SourceFileLoader", "/tmp/main.py"]
    assert seen["main"] == [True, "__main__", "/tmp/main.py", None, None, *loader, None, None, True]
    assert seen["stdin"][:3] == ["-", "/tmp/input.json", True] and seen["stdin"][-1] == '{"xs": [1, 2]}'
    assert seen["fds"] == [["0", "/tmp/input.json"], ["1", "pipe:[]"], ["2", "pipe:[]"]]
    assert seen["env"] == {"HOME": "/tmp", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}
    assert (seen["ids"][2:], seen["oom_score_adj"], seen["signals"]["SIGINT"]) == (
        [1, 1, 1],
        "1000\n",
        "<built-in function default_int_handler>",
    )
    assert containers_of(docker_api, node_label) == []


async def test_javascript_sees_the_same_runtime_on_every_path(docker_api: docker.APIClient, node_label: str) -> None:
    results = await on_every_path("javascript", node_label, [ExecRequest("javascript", JAVASCRIPT_PROBE, [1])])
    assert all(r[0].ok for r in results.values()), {path: r[0].stderr for path, r in results.items()}
    assert_same_on_every_path(results)
    seen = json.loads(results["warm pool"][0].stdout)
    assert (seen["argv"], seen["execArgv"], seen["env"]) == (
        ["/usr/bin/node", "/tmp/main.js"],
        [],
        {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"},
    )
    assert seen["main"][:3] == [True, ".", "/tmp/main.js"] and seen["main"][-1] == ["/tmp/main.js"]
    assert seen["stdin"] == ["file", "/tmp/input.json", "ReadStream", None, 0, "[1]"]
    assert seen["oomScoreAdj"] == "1000\n" and seen["ppid"] == 1
    assert containers_of(docker_api, node_label) == []


# -- exit statuses, tracebacks, signals, streams -------------------------------------------------------------------

PYTHON_CASES: list[tuple[str, Any, int]] = [
    ("import sys\nprint('out')\nprint('err', file=sys.stderr)", None, 0),
    ("import sys\nsys.exit(3)", None, 3),
    ("import sys\nsys.exit('a message')", None, 1),
    ("raise SystemExit", None, 0),
    ("def f():\n    raise ValueError('boom')\nf()", None, 1),  # the traceback quotes /tmp/main.py's lines
    ("def (:", None, 1),
    ("\ufeffprint('after a byte order mark')", None, 0),
    ("import import_nothing_of_that_name", None, 1),
    ("raise KeyboardInterrupt", None, 130),  # CPython ends itself with SIGINT
    ("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)", None, 130),
    ("import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)", None, 143),
    (
        "import os, signal, time\nsignal.signal(signal.SIGTERM, lambda *_: exit(5))\nos.kill(os.getpid(), 15)\n"
        "time.sleep(5)",
        None,
        5,
    ),
    ("import signal\nsignal.setitimer(signal.ITIMER_REAL, 0.05)\nsignal.pause()", None, 142),
    ("import ctypes\nctypes.string_at(0)", None, 139),
    ("import os\nos._exit(9)", None, 9),
    ("import atexit\natexit.register(print, 'bye')\nprint('hi')", None, 0),
    (
        "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.05), print('thread done'))).start()",
        None,
        0,
    ),
    ("import sys\nsys.stdout.write('x' * 100_000)", None, 0),  # unflushed at exit, beyond the cap
    ("import json, sys\nprint(json.load(sys.stdin), sys.stdin.read() == '')", {"k": ["v", 1]}, 0),
]

JAVASCRIPT_CASES: list[tuple[str, Any, int]] = [
    ("console.log('out'); console.error('err')", None, 0),
    ("process.exit(3)", None, 3),
    ("process.exitCode = 4", None, 4),
    ("function f() { throw new Error('boom'); }\nf();", None, 1),  # the trace quotes /tmp/main.js's line
    ("Promise.reject(new Error('rejected'))", None, 1),
    ("function (", None, 1),
    ("require('no-module-of-that-name')", None, 1),
    ("process.kill(process.pid, 'SIGTERM'); setTimeout(() => {}, 5000)", None, 143),
    ("process.kill(process.pid, 'SIGINT'); setTimeout(() => {}, 5000)", None, 130),
    (
        "process.on('SIGTERM', () => { console.log('caught'); process.exit(5); });\n"
        "process.kill(process.pid, 'SIGTERM'); setTimeout(() => {}, 5000)",
        None,
        5,
    ),
    ("process.on('exit', code => console.log('exit', code)); console.log('hi')", None, 0),
    (
        "process.on('uncaughtException', e => { console.log('handled', e.message); process.exitCode = 6; });\n"
        "throw new Error('late')",
        None,
        6,
    ),
    ("setTimeout(() => console.log('later'), 50)", None, 0),
    ("process.stdout.write('x'.repeat(100000))", None, 0),  # beyond the cap
    ("process.kill(process.pid, 'SIGKILL')", None, 137),  # (process.abort() prints addresses: ASLR)
    (
        "let s = ''; process.stdin.on('data', c => s += c).on('end', () => console.log(JSON.parse(s).k))",
        {"k": ["v", 1]},
        0,
    ),
]


@pytest.mark.parametrize("language", LANGS)
async def test_exits_tracebacks_signals_and_streams_are_the_same_on_every_path(
    docker_api: docker.APIClient, node_label: str, language: Language
) -> None:
    cases = PYTHON_CASES if language == "python" else JAVASCRIPT_CASES
    requests = [ExecRequest(language, code, data) for code, data, _ in cases]
    results = await on_every_path(language, node_label, requests)
    assert_same_on_every_path(results)
    # The cases do what they say (so "the same" is not "the same failure").
    assert [r.exit_code for r in results["warm pool"]] == [status for _, _, status in cases], [
        (r.exit_code, r.stderr[-300:]) for r in results["warm pool"]
    ]
    traced = results["warm pool"][4 if language == "python" else 3].stderr
    quoted = "raise ValueError('boom')" if language == "python" else "throw new Error('boom');"
    assert PROGRAMS[language][0] in traced and quoted in traced, traced
    assert containers_of(docker_api, node_label) == []


# -- the warm run really is the interpreter that waited ---------------------------------------------------------

WHO_AM_I = {
    "python": "import os\nprint(os.getpid(), open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])",
    "javascript": "const s = require('fs').readFileSync('/proc/self/stat', 'utf8');\n"
    "console.log(process.pid, s.slice(s.lastIndexOf(')') + 1).trim().split(' ')[19])",
}


def parked_interpreter(api: docker.APIClient, container_id: str, language: Language) -> tuple[int, str]:
    """(pid inside the container, start time) of the interpreter waiting in a pool container, seen from the host."""
    path = PROGRAMS[language][0]
    rows = api.top(container_id, ps_args="-o pid,args")["Processes"]
    [host_pid] = [int(row[0]) for row in rows if row[-1].endswith(" " + path)]
    with open(f"/proc/{host_pid}/status") as status:
        inner_pid = int(next(line for line in status if line.startswith("NSpid:")).split()[-1])
    with open(f"/proc/{host_pid}/stat") as stat:
        start_time = stat.read().rsplit(")", 1)[1].split()[19]
    return inner_pid, start_time


@pytest.mark.parametrize("language", LANGS)
async def test_a_warm_run_is_the_interpreter_that_waited_for_it(
    docker_api: docker.APIClient, node_label: str, language: Language
) -> None:
    """The host finds the parked interpreter in the pool container before the task is sent; the program then
    reports the same process (its pid inside, its start time), so it did not start on arrival."""
    async with executor_on("warm pool", language, node_label) as ex:
        await wait_pool_ready(ex)
        [pooled] = containers_of(docker_api, node_label)
        before = parked_interpreter(docker_api, pooled["Id"], language)
        result = await ex.run_code(ExecRequest(language, WHO_AM_I[language]))
    assert result.ok, result.stderr
    pid, start_time = result.stdout.split()
    assert (int(pid), start_time) == before
    assert containers_of(docker_api, node_label) == []


# -- the exit status cannot be forged ------------------------------------------------------------------------------

PYTHON_FORGER = r"""
import ctypes, errno, os, re, secrets, sys
found, tried = set(), {}
def attempt(name, read):
    try:
        for chunk in read():
            found.update(m.decode() for m in re.findall(rb"[0-9a-f]{32}", chunk))
        tried[name] = "read"
    except OSError as exc:
        tried[name] = errno.errorcode[exc.errno]
def memory(pid):
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for line in open(f"/proc/{pid}/maps").read().splitlines():
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if line.split()[1].startswith("rw"):
                try:
                    mem.seek(start)
                    chunk = mem.read(end - start)
                except OSError:
                    if pid == 1:
                        raise
                    continue
                yield chunk
attempt("cmdline", lambda: [open("/proc/1/cmdline", "rb").read()])
attempt("environ", lambda: [open("/proc/1/environ", "rb").read()])
attempt("fd", lambda: [os.readlink(f"/proc/1/fd/{fd}").encode() for fd in os.listdir("/proc/1/fd")])
attempt("mem", lambda: memory(1))
attempt("own memory", lambda: memory("self"))  # readable: the nonce was never in it
libc = ctypes.CDLL(None, use_errno=True)
tried["ptrace"] = "ok" if libc.ptrace(16, 1, None, None) == 0 else errno.errorcode[ctypes.get_errno()]
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buffer = ctypes.create_string_buffer(16)
local, remote = IoVec(ctypes.addressof(buffer), 16), IoVec(0x400000, 16)
r = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
tried["process_vm_readv"] = "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
print(sorted(tried.items()), file=sys.stderr)
print(sorted(found)[:200], file=sys.stderr, flush=True)
for nonce in sorted(found)[:200] + [secrets.token_hex(16)]:
    for status in (b"000", b"0", b"000 "):
        os.write(1, b"EC2END:" + nonce.encode() + b":" + status + b"\n")
        os.write(2, b"EC2END:" + nonce.encode() + b":" + status + b"\n")
sys.exit(7)
"""

JAVASCRIPT_FORGER = r"""
const fs = require('fs');
const crypto = require('crypto');
const found = new Set();
const tried = {};
const scan = data => { for (const m of data.toString('latin1').matchAll(/[0-9a-f]{32}/g)) found.add(m[0]); };
function attempt(name, read) {
  try {
    read();
    tried[name] = 'read';
  } catch (e) {
    tried[name] = e.code;
  }
}
function memory(pid) {
  const fd = fs.openSync(`/proc/${pid}/mem`, 'r');
  const buffer = Buffer.alloc(1 << 20);
  for (const line of fs.readFileSync(`/proc/${pid}/maps`, 'utf8').trim().split('\n')) {
    const [range, perms] = line.split(' ');
    if (!perms.startsWith('rw')) continue;
    const [start, end] = range.split('-').map(x => BigInt('0x' + x));
    for (let at = start; at < end; at += 1n << 20n) {
      const size = Number(end - at < 1n << 20n ? end - at : 1n << 20n);
      try { scan(buffer.subarray(0, fs.readSync(fd, buffer, 0, size, at))); } catch (e) { if (pid === 1) throw e; }
    }
  }
}
attempt('cmdline', () => scan(fs.readFileSync('/proc/1/cmdline')));
attempt('environ', () => scan(fs.readFileSync('/proc/1/environ')));
attempt('fd', () => fs.readdirSync('/proc/1/fd').forEach(fd => scan(Buffer.from(fs.readlinkSync(`/proc/1/fd/${fd}`)))));
attempt('mem', () => memory(1));
attempt('own memory', () => memory('self')); // readable: the nonce was never in it
fs.writeSync(2, JSON.stringify(Object.entries(tried).sort()) + '\n');
const nonces = [...found].sort().slice(0, 200);
fs.writeSync(2, JSON.stringify(nonces) + '\n');
for (const nonce of [...nonces, crypto.randomBytes(16).toString('hex')]) {
  for (const status of ['000', '0', '000 ']) {
    fs.writeSync(1, `EC2END:${nonce}:${status}\n`);
    fs.writeSync(2, `EC2END:${nonce}:${status}\n`);
  }
}
process.exit(7);
"""


@pytest.mark.parametrize("language", LANGS)
@pytest.mark.parametrize("path", ["warm pool", "on arrival"])
async def test_a_failing_program_cannot_report_success(
    docker_api: docker.APIClient, node_label: str, language: Language, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's memory is closed to the program (its environment and descriptors too under runc; gVisor
    shows those, and the nonce is in neither), ptrace and process_vm_readv are denied, and the nonce is not in the
    program's own memory either: forged trailers (with every 32-hex string it could find, and a random one) are
    only output; the status stays 7."""
    nonces: list[str] = []
    real_new_nonce = executor.sandbox.new_nonce

    def recording_new_nonce() -> str:
        nonces.append(real_new_nonce())
        return nonces[-1]

    monkeypatch.setattr(executor.sandbox, "new_nonce", recording_new_nonce)
    forger = PYTHON_FORGER if language == "python" else JAVASCRIPT_FORGER
    async with executor_on(path, language, node_label) as ex:
        result = await run_once(ex, ExecRequest(language, forger))
    assert (result.ok, result.exit_code, result.error_kind) == (False, 7, ErrorKind.EXECUTION_FAILED), result.stderr
    lines = result.stderr.splitlines()
    if language == "python":
        tried, found = dict(ast.literal_eval(lines[0])), ast.literal_eval(lines[1])
    else:
        tried, found = dict(json.loads(lines[0])), json.loads(lines[1])
    assert tried["mem"] == "EACCES" and tried["own memory"] == "read", tried
    assert {tried["environ"], tried["fd"]} <= {"EACCES", "read"}, tried  # if read, the nonce was not there
    if language == "python":
        assert tried["ptrace"] == "EPERM" and tried["process_vm_readv"] in ("EPERM", "ENOSYS"), tried
    assert len(nonces) == 1 and nonces[0] not in found and nonces[0] not in result.stdout + result.stderr
    assert result.stdout.count("EC2END:") == 3 * (len(found) + 1)  # every forged trailer is plain output
    assert containers_of(docker_api, node_label) == []


SIGNALLERS = {
    "python": """
import os, signal, sys
for sig in sorted(signal.valid_signals()):
    if sig in (signal.SIGRTMIN - 2, signal.SIGRTMIN - 1):  # the C library's own
        continue
    os.kill(1, sig)  # the supervisor
print("still here")
sys.exit(7)
""",
    "javascript": """
const { constants } = require('os');
for (const [name, number] of Object.entries(constants.signals).sort((a, b) => a[1] - b[1])) {
  process.kill(1, number); // the supervisor
}
console.log('still here');
process.exit(7);
""",
}


@pytest.mark.parametrize("language", LANGS)
async def test_no_signal_from_the_program_reaches_the_supervisor(
    docker_api: docker.APIClient, node_label: str, language: Language
) -> None:
    """Every signal, SIGKILL and SIGSTOP included, sent to PID 1: the run still ends with the program's status.
    Under runc PID 1 is the init of its pid namespace, which gets no signal from inside without a handler; the
    supervisor ignores every other one it can, for runtimes that deliver them (gVisor)."""
    async with executor_on("warm pool", language, node_label) as ex:
        result = await run_once(ex, ExecRequest(language, SIGNALLERS[language]))
    assert (result.exit_code, result.stdout, result.stderr) == (7, "still here\n", "")
    assert containers_of(docker_api, node_label) == []


# -- the limits hold on the warm path ------------------------------------------------------------------------------

FORK_BOMBS = {
    "python": """
import os, sys
def cgroup(name):
    for path in (f"/sys/fs/cgroup/pids/{name}", f"/sys/fs/cgroup/{name}"):
        if os.path.exists(path):
            return open(path).read().strip()
origin = os.getpid()
while True:
    try:
        os.fork()
    except BlockingIOError as exc:  # every process forks on; the first one reports where it was stopped
        if os.getpid() == origin:
            print(exc.strerror, cgroup("pids.current"), cgroup("pids.max"), flush=True)
            sys.exit(0)
""",
    # Each child spawns the next as soon as it exists: a chain that grows until fork() fails at the ceiling.
    "javascript": """
const { spawn } = require('child_process');
const fs = require('fs');
const cgroup = name => {
  for (const path of [`/sys/fs/cgroup/pids/${name}`, `/sys/fs/cgroup/${name}`]) {
    try { return fs.readFileSync(path, 'utf8').trim(); } catch (e) {}
  }
};
(function more() {
  const child = spawn('/bin/sleep', ['60'], { stdio: 'ignore' });
  child.on('spawn', more);
  child.on('error', e => { console.log(e.code, cgroup('pids.current'), cgroup('pids.max')); process.exit(0); });
})();
""",
}
MEMORY_BOMBS = {
    "python": "hoard = []\nwhile True:\n    hoard.append(bytearray(10**6))",
    "javascript": "const hoard = [];\nfor (;;) hoard.push(Buffer.alloc(1 << 20, 1));",
}
BUSY_LOOPS = {"python": "while True:\n    pass", "javascript": "for (;;) {}"}
FLOODS = {
    "python": "import sys\nwhile True:\n    sys.stdout.write('A' * 65536)",
    # Each write waits for the pipe: a loop that never yields would queue its writes in memory (an OOM kill).
    "javascript": "const a = 'A'.repeat(65536);\n(function more() { process.stdout.write(a, more); })();",
}
# The facts of the node's canary that a program reads from inside, in each language (the node's canary itself,
# executor/canary.py, reads more: limits, the runtime, the host's cgroup; it runs on arrival, not warm).
PYTHON_CANARY = """
import errno, json, os
status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().strip().split('\\n'))
try:
    open('/edgecoder-canary', 'w').close()
    root_read_only = False
except OSError as e:
    root_read_only = e.errno == errno.EROFS
print(json.dumps({
    'interfaces': sorted(os.listdir('/sys/class/net')), 'root_read_only': root_read_only, 'uid': os.getuid(),
    'gid': os.getgid(), 'groups': os.getgroups(), 'cap_eff': status['CapEff'].strip(),
    'no_new_privs': status['NoNewPrivs'].strip(),
}))
"""
JAVASCRIPT_CANARY = """
const fs = require('fs');
const status = Object.fromEntries(
  fs.readFileSync('/proc/self/status', 'utf8').trim().split('\\n').map(line => line.split(':\\t')));
let rootReadOnly;
try {
  fs.writeFileSync('/edgecoder-canary', '');
  rootReadOnly = false;
} catch (e) {
  rootReadOnly = e.code === 'EROFS';
}
console.log(JSON.stringify({
  interfaces: fs.readdirSync('/sys/class/net').sort(), root_read_only: rootReadOnly, uid: process.getuid(),
  gid: process.getgid(), groups: process.getgroups(), cap_eff: status.CapEff.trim(),
  no_new_privs: status.NoNewPrivs.trim(),
}));
"""


@pytest.mark.parametrize("language", LANGS)
async def test_limits_hold_on_the_warm_path(docker_api: docker.APIClient, node_label: str, language: Language) -> None:
    """A forked or spawned child shares the container's cgroup: the pids ceiling, the memory limit, the wall-clock
    limit and the output cap hold as they do on arrival; the canary's facts (only lo, read-only root, a uid of
    the sandbox range with its own group only, no capabilities, no new privileges) hold in both languages."""
    async with executor_on("warm pool", language, node_label) as ex:
        bomb = await run_once(ex, ExecRequest(language, FORK_BOMBS[language], limits=Limits(timeout_ms=20_000)))
        memory = await run_once(ex, ExecRequest(language, MEMORY_BOMBS[language], limits=Limits(timeout_ms=20_000)))
        busy = await run_once(ex, ExecRequest(language, BUSY_LOOPS[language], limits=Limits(timeout_ms=1000)))
        flood = await run_once(ex, ExecRequest(language, FLOODS[language], limits=Limits(timeout_ms=1000)))
        canary = await run_once(ex, ExecRequest(language, PYTHON_CANARY if language == "python" else JAVASCRIPT_CANARY))
        after = await run_once(ex, ExecRequest(language, "print(1)" if language == "python" else "console.log(1)"))
    assert bomb.ok, bomb.stderr
    why, current, ceiling = bomb.stdout.rsplit(maxsplit=2)
    assert why in ("Resource temporarily unavailable", "EAGAIN") and ceiling == "50" and int(current) <= 50
    assert (memory.error_kind, memory.exit_code, memory.queue_reason) == (
        ErrorKind.MEMORY_EXCEEDED,
        137,
        "memory_exceeded",
    )
    assert (busy.error_kind, busy.exit_code) == (ErrorKind.TIMEOUT, 124)
    assert (flood.error_kind, flood.stdout_truncated, len(flood.stdout)) == (ErrorKind.TIMEOUT, True, 65536)
    assert canary.ok, canary.stderr
    seen = json.loads(canary.stdout)
    uid = seen["uid"]
    assert SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_COUNT
    assert seen == {
        "interfaces": ["lo"],
        "root_read_only": True,
        "uid": uid,
        "gid": uid,
        "groups": [uid],
        "cap_eff": "0000000000000000",
        "no_new_privs": "1",
    }
    assert (after.ok, after.stdout) == (True, "1\n")
    assert containers_of(docker_api, node_label) == []


# -- the pool's mix of languages -----------------------------------------------------------------------------------


async def test_the_pool_keeps_one_container_per_language_and_prefers_the_runs_own(
    docker_api: docker.APIClient, node_label: str
) -> None:
    policy = ExecutorPolicy(subset_check=False, pool_size=2)  # pool_languages: python, javascript
    async with Executor.open(policy, node_label=node_label) as ex:
        await wait_pool_ready(ex)
        assert sorted(map(str, ex.pool.ready_languages)) == ["javascript", "python"]
        for language in ("javascript", "javascript", "python"):
            await wait_pool_ready(ex)
            taken = ex.pool.take(policy.pool_limits, language)
            assert taken is not None and taken.prestarted == language
            taken.close()
            ex.pool.returned(taken)
            await ex.sandbox.dispose(taken.container_id)
        await wait_pool_ready(ex)
        assert sorted(map(str, ex.pool.ready_languages)) == ["javascript", "python"]
        # Two runs of one language at once: the second takes the other container, its interpreter started on
        # arrival, and the mix is restored.
        async with trio.open_nursery() as nursery:
            results: list[ExecResult] = []

            async def one() -> None:
                results.append(await ex.run_code(ExecRequest("python", "import time\ntime.sleep(0.3)\nprint(2)")))

            nursery.start_soon(one)
            nursery.start_soon(one)
        assert [(r.ok, r.stdout) for r in results] == [(True, "2\n")] * 2
        await wait_pool_ready(ex)
        assert sorted(map(str, ex.pool.ready_languages)) == ["javascript", "python"]
    assert containers_of(docker_api, node_label) == []


async def test_without_prestart_pool_containers_wait_for_any_language(
    docker_api: docker.APIClient, node_label: str
) -> None:
    policy = ExecutorPolicy(subset_check=False, pool_size=1, prestart=False)
    async with Executor.open(policy, node_label=node_label) as ex:
        await wait_pool_ready(ex)
        assert ex.pool.ready_languages == [None]
        result = await ex.run_code(ExecRequest("javascript", "console.log(typeof require)"))
    assert (result.ok, result.stdout) == (True, "function\n")
    assert containers_of(docker_api, node_label) == []


# -- the protocol's rejections ---------------------------------------------------------------------------------------


async def test_a_bad_prestart_line_ends_the_container_with_the_reason(
    docker_api: docker.APIClient, node_label: str
) -> None:
    async with Executor.open(ExecutorPolicy(subset_check=False, pool_size=0), node_label=node_label) as ex:
        for line, why in ((b"EC2P cobol     \n", b"unknown language"), (b"EC2P python   x\n", b"bad prestart line")):
            started = await ex.sandbox.start(ex.policy.pool_limits, role="cold")
            try:
                await started.stream.send_all(line)
                output = b""
                while data := await started.stream.receive_some(4096):
                    output += data
                status = docker_api.wait(started.container_id, timeout=10)["StatusCode"]
            finally:
                started.close()
                await ex.sandbox.dispose(started.container_id)
            assert status == 125
            assert output[FRAME_HEADER.size :] == b"edgecoder bootstrap: " + why + b"\n"
    assert containers_of(docker_api, node_label) == []


def test_prestart_lines_and_headers_round_trip() -> None:
    for language in LANGS:
        assert parse_prestart(encode_prestart(language)) == language
        header = encode_header(language, 12, 3456, 5000, "0123456789abcdef" * 2)
        assert parse_header(header) == (language, 12, 3456, 5000, b"0123456789abcdef" * 2)


@pytest.mark.parametrize(
    "line",
    [b"EC2P python    ", b"EC2Q python    \n", b"EC2P ruby      \n", b"EC2P  python   \n" + b"x", b"", b"EC2P\n"],
)
def test_malformed_prestart_lines_are_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_prestart(line)


@pytest.mark.parametrize(
    "change",
    [
        lambda h: h.replace(b"EC2 ", b"EC3 "),
        lambda h: h.replace(b"python", b"perl  "),
        lambda h: h.replace(b"12 ", b"1x "),
        lambda h: h.replace(b"0123456789abcdef0123456789abcdef", b"0123456789ABCDEF0123456789abcdef"),
        lambda h: h[:-2] + b"\n",
    ],
)
def test_malformed_headers_are_refused(change: Any) -> None:
    header = encode_header("python", 12, 3456, 5000, "0123456789abcdef" * 2)
    with pytest.raises(ProtocolError):
        parse_header(change(header))


async def test_an_answer_other_than_parked_is_a_lost_container() -> None:
    """The host reads exactly the supervisor's answer to the prestart line, and refuses anything else."""
    for sent, outcome in (
        (FRAME_HEADER.pack(1, len(PARKED)) + PARKED, "python"),
        (FRAME_HEADER.pack(1, len(NOT_PARKED)) + NOT_PARKED, None),
        (FRAME_HEADER.pack(2, len(PARKED)) + PARKED, "refused"),
        (FRAME_HEADER.pack(1, 6) + b"hello\n", "refused"),
        (FRAME_HEADER.pack(1, 6) + b"EC", "refused"),  # ended early
    ):
        ours, theirs = socket.socketpair()
        container = StartedContainer(
            "c" * 64, Limits(), trio.SocketStream(trio.socket.from_stdlib_socket(ours)), ours, "python", True
        )
        theirs.sendall(sent + b"program output")
        theirs.shutdown(socket.SHUT_WR)
        try:
            await container.wait_parked()
            seen: str | None = container.prestarted
        except trio.BrokenResourceError:
            seen = "refused"
        assert seen == outcome, sent
        if outcome != "refused":
            assert not container.parking
            assert await container.stream.receive_some(100) == b"program output"  # not one byte more was read
        container.close()
        theirs.close()


@given(st.binary(max_size=2 * HEADER_SIZE))
def test_parse_header_refuses_with_protocol_error_only(data: bytes) -> None:
    try:
        language, code_len, input_len, timeout_ms, nonce = parse_header(data)
    except ProtocolError:
        return
    # Whatever it accepts is a header the host could have sent, field for field.
    again = encode_header(cast(Language, language), code_len, input_len, timeout_ms, nonce.decode())
    assert again.split() == data.split()


@given(
    st.sampled_from(LANGS),
    st.integers(0, 10**10 - 1),
    st.integers(0, 10**10 - 1),
    st.integers(0, 10**10 - 1),
    st.binary(min_size=16, max_size=16),
)
def test_every_header_the_host_sends_parses_to_its_fields(
    language: Language, code_len: int, input_len: int, timeout_ms: int, nonce: bytes
) -> None:
    header = encode_header(language, code_len, input_len, timeout_ms, nonce.hex())
    assert parse_header(header) == (language, code_len, input_len, timeout_ms, nonce.hex().encode())


@given(st.binary(max_size=2 * PRESTART_SIZE))
def test_parse_prestart_refuses_with_protocol_error_only(data: bytes) -> None:
    try:
        language = parse_prestart(data)
    except ProtocolError:
        return
    assert language in LANGS and encode_prestart(language).split() == data.split()
