"""The in-container supervisor: PID 1 of every sandbox, run as `python3 -I -S -c <the text of this file>`.

Standard library only, and nothing from the image's site-packages or the environment steers it (-I -S). The host
side of the protocol (encoding, the trailer's parser, the reasons behind it) is executor/bootstrap.py; what follows
is what happens inside.

1. Before any task can arrive: `prctl(PR_SET_DUMPABLE, 0)`, so that its /proc files belong to root and a program of
   the same uid can read neither its memory, environment nor file descriptors, nor ptrace it (seccomp also denies
   ptrace and process_vm_readv). It ignores every signal it can but SIGCHLD and SIGALRM, its own timer, which acts
   only once the deadline has passed: as the init of its pid namespace, no other signal sent from inside would
   reach it under runc anyway, but gVisor delivers them (runsc 20221219: a program of the same uid could end the
   supervisor with SIGTERM; SIGKILL and SIGSTOP cannot be ignored, see docs/executor.md). The program gets the
   dispositions it always had: SIGPIPE and SIGXFSZ ignored (Python's, inherited), every other one the default.
2. Optionally, a prestart line names the task's language before the task: the supervisor then starts the
   program's interpreter at once, `python3 /tmp/main.py` or `node /tmp/main.js`, exactly as it would start it for
   the task, except that the main file is a FIFO. The interpreter initialises (site, the standard streams, node's
   whole bootstrap) and opens its main file; the supervisor opens the FIFO's other end once it is there, and
   answers the prestart line with PARKED on stdout (NOT_PARKED if the interpreter died first). The interpreter
   now waits in read(). It was forked before the header (and so the nonce) was read: the nonce never exists in
   the program's address space.
3. It reads exactly the header, code and input (unbuffered os.read, never more). With a parked interpreter of the
   task's language, the code goes to a staging file and the input into /tmp/input.json, which is already the
   interpreter's stdin; then it renames the staging file over the FIFO and writes the code into the FIFO. The
   interpreter reads it to end of file and runs it, as it would have run the regular file: it is the program's
   own process, `python3 /tmp/main.py`, with nothing emulated. Without one (no prestart line, a prestart for the
   other language, or an interpreter that died), it writes the files and forks the interpreter now.
4. It reaps every process that ends (orphans come to PID 1) until the program has ended, or until the deadline:
   the timeout + DEADLINE_GRACE_MS after the code was handed over. Then it kills every process left, reaps them,
   writes the trailer `EC2END:<nonce>:<status:3>\\n` on stdout and on stderr (status as a shell reports it: 128+N
   for a death by signal N; TIMEOUT_STATUS at the deadline) and exits with the status.

A container runs one program and is then removed: a parked interpreter is never handed a second task.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import signal
import time
from typing import Any

MAGIC = "EC2"
# b"EC2 <language:10> <code_len:10> <input_len:10> <timeout_ms:10> <nonce:32>\n"
HEADER_SIZE = 81
# b"EC2P <language:10>\n"
PRESTART_TAG = b"EC2P"
PRESTART_SIZE = 16
# The answer to a prestart line, on stdout, before anything else: the interpreter is parked, or it is not (it died
# while it initialised, and the task's interpreter will start on arrival).
PARKED = b"EC2R1\n"
NOT_PARKED = b"EC2R0\n"
TRAILER_TAG = b"EC2END:"
NONCE_HEX = 32
# Exit status of the supervisor itself when the stream is malformed or ends early (never the program's own).
BOOTSTRAP_FAILED = 125
# What the supervisor reports when its own deadline ended the run (as timeout(1) does).
TIMEOUT_STATUS = 124
# The supervisor's deadline follows the host's: the host always times a run out first while it is alive.
DEADLINE_GRACE_MS = 500
# How long the supervisor goes on killing leftovers before it writes the trailer anyway.
REAP_LIMIT_S = 2.0
# How often it looks whether a prestarted interpreter has reached its main file yet: python3 takes about 10 ms of
# CPU to get there, node 80 to 150 ms, both under the container's CPU quota.
PARK_POLL_S = (0.001, 0.005)
PARK_POLL_SWITCH_S = 0.05

PROGRAMS: dict[str, tuple[str, str]] = {
    "python": ("/tmp/main.py", "/usr/bin/python3"),
    "javascript": ("/tmp/main.js", "/usr/bin/node"),
}
INPUT_PATH = "/tmp/input.json"
PROGRAM_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
PR_SET_DUMPABLE = 4


class ProtocolError(ValueError):
    """The bytes on stdin are not the protocol."""


def parse_prestart(line: bytes) -> str:
    """The language a prestart line names. Raises ProtocolError."""
    fields = line.split()
    if len(line) != PRESTART_SIZE or not line.endswith(b"\n") or len(fields) != 2 or fields[0] != PRESTART_TAG:
        raise ProtocolError("bad prestart line")
    language = fields[1].decode("ascii", "replace")
    if language not in PROGRAMS:
        raise ProtocolError("unknown language")
    return language


def parse_header(header: bytes) -> tuple[str, int, int, int, bytes]:
    """(language, code_len, input_len, timeout_ms, nonce) of a task header. Raises ProtocolError."""
    fields = header.split()
    if len(header) != HEADER_SIZE or len(fields) != 6 or fields[0] != MAGIC.encode():
        raise ProtocolError("bad header")
    if not all(field.isdigit() for field in fields[2:5]):
        raise ProtocolError("bad header")
    nonce = fields[5]
    if len(nonce) != NONCE_HEX or nonce.strip(b"0123456789abcdef"):
        raise ProtocolError("bad header")
    language = fields[1].decode("ascii", "replace")
    if language not in PROGRAMS:
        raise ProtocolError("unknown language")
    return language, int(fields[2]), int(fields[3]), int(fields[4]), nonce


def main() -> None:
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing in here may read or trace this process
    spawn = Spawner(libc, ignore_signals())
    try:
        run(spawn)
    except ProtocolError as exc:
        fail(str(exc).encode())


def ignore_signals() -> dict[int, bool]:
    """Ignore every signal that can be but SIGCHLD (its default is what makes waitpid work) and SIGALRM (the
    deadline's). Returns, for each, whether it was ignored before: what the program inherits."""
    before: dict[int, bool] = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGALRM):
            continue
        try:
            before[sig] = signal.signal(sig, signal.SIG_IGN) == signal.SIG_IGN
        except (OSError, ValueError):  # the C library's own real-time signals
            continue
    return before


def run(spawn: Spawner) -> None:
    tag = read_exact(len(PRESTART_TAG))
    parked: Parked | None = None
    input_fd: int | None = None
    if tag == PRESTART_TAG:
        language = parse_prestart(tag + read_exact(PRESTART_SIZE - len(tag)))
        input_fd = create(INPUT_PATH)  # empty: the parked interpreter's stdin, filled when the task comes
        parked = Parked.start(spawn, language)
        write_all(1, PARKED if parked is not None else NOT_PARKED)
        tag = read_exact(len(PRESTART_TAG))
    language, code_len, input_len, timeout_ms, nonce = parse_header(tag + read_exact(HEADER_SIZE - len(tag)))
    path, interpreter = PROGRAMS[language]
    if parked is not None and parked.language != language:
        parked.discard()  # a pool container made for the other language: start this one's on arrival
        parked = None
    if input_fd is None:
        input_fd = create(INPUT_PATH)
    staging = path + ".part"
    code_fd = create(staging if parked is not None else path)
    copy_from_stdin(code_fd, code_len)
    os.close(code_fd)
    copy_from_stdin(input_fd, input_len)
    os.close(input_fd)
    deadline = Deadline(timeout_ms)
    if parked is not None:
        parked.deliver(staging)
        program = parked.pid
    else:
        program = spawn(interpreter, path)
    status: int | None = None
    while status is None:
        pid, wait_status = os.waitpid(-1, 0)  # orphans come to PID 1: reaped here too
        if pid == program:
            code = os.waitstatus_to_exitcode(wait_status)
            status = code if code >= 0 else 128 - code
    deadline.cancel()
    if deadline.expired:
        status = TIMEOUT_STATUS
    kill_everything_else()
    trailer = TRAILER_TAG + nonce + b":%03d\n" % status
    write_all(1, trailer)
    write_all(2, trailer)
    os._exit(status)


class Parked:
    """An interpreter started before its task, waiting in read() on its main file, a FIFO, until the code comes.

    Its stdin is /tmp/input.json, already open; the supervisor fills that file before handing over the code, so
    the program reads its whole input with a real end of file, as it would from a file written beforehand.
    """

    def __init__(self, language: str, path: str, pid: int, fifo: int) -> None:
        self.language = language
        self.path = path
        self.pid = pid
        self.fifo = fifo  # our end, open for writing

    @classmethod
    def start(cls, spawn: Spawner, language: str) -> Parked | None:
        """Start the interpreter and wait until it has opened its main file. None if it ended first (reaped)."""
        path, interpreter = PROGRAMS[language]
        os.mkfifo(path, 0o600)
        pid = spawn(interpreter, path)
        # Opening a FIFO to write without O_NONBLOCK blocks until a reader opens it: forever, if the interpreter
        # died. Non-blocking, ENXIO means no reader yet: look again until it gets there or ends.
        began = time.monotonic()
        while True:
            try:
                fifo = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            if os.waitpid(pid, os.WNOHANG)[0]:
                os.unlink(path)
                return None
            time.sleep(PARK_POLL_S[time.monotonic() - began > PARK_POLL_SWITCH_S])
        os.set_blocking(fifo, True)
        return cls(language, path, pid, fifo)

    def deliver(self, staging: str) -> None:
        """Hand the code over: the interpreter reads it to end of file, then runs it."""
        try:
            with open(staging, "rb", buffering=0) as code:
                # Renamed before the end of file, so whatever opens the path once the program runs (a traceback's
                # source lines, the program itself) finds the regular file; the interpreter holds the FIFO.
                os.rename(staging, self.path)
                while chunk := code.read(65536):
                    write_all(self.fifo, chunk)
        except BrokenPipeError:
            pass  # it ended while reading (the OOM killer): its status is the run's
        finally:
            os.close(self.fifo)

    def discard(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)  # gone, its memory uncharged from the cgroup, before the program starts
        os.close(self.fifo)
        os.unlink(self.path)


class Spawner:
    """Forks the program's interpreter, in the same way whether it is prestarted or started on arrival."""

    def __init__(self, libc: Any, ignored_before: dict[int, bool]) -> None:
        self._libc = libc
        self._ignored_before = ignored_before

    def __call__(self, interpreter: str, path: str) -> int:
        """Fork `interpreter path`: stdin from the input file, the program's environment, oom_score_adj 1000."""
        pid = os.fork()
        if pid:
            return pid
        try:
            for sig, ignored in self._ignored_before.items():
                signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
            # Dumpable again, or its own /proc files are root's. Safe: no process but the supervisor exists (a
            # parked interpreter of the other language has been killed and reaped), and execve replaces this memory.
            self._libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            with open("/proc/self/oom_score_adj", "w") as adj:
                adj.write("1000")  # a memory bomb is the OOM killer's choice, not the supervisor
            fd = os.open(INPUT_PATH, os.O_RDONLY)
            os.dup2(fd, 0)
            os.close(fd)
            os.execve(interpreter, [interpreter, path], PROGRAM_ENV)
        except BaseException as exc:
            os.write(2, b"edgecoder bootstrap: cannot start the program: " + repr(exc).encode() + b"\n")
        finally:
            os._exit(127)


class Deadline:
    """The run's own deadline, from the moment its code is handed over; SIGALRM every 50 ms once armed."""

    def __init__(self, timeout_ms: int) -> None:
        self.at = time.monotonic() + (timeout_ms + DEADLINE_GRACE_MS) / 1000
        self.expired = False
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(self.at - time.monotonic(), 0.001), 0.05)

    def _on_alarm(self, signum: int, frame: object) -> None:
        if time.monotonic() < self.at:
            return  # a SIGALRM sent from inside, before the deadline, changes nothing
        self.expired = True
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.at = math.inf


def kill_everything_else() -> None:
    """Kill and reap every process but this one, so nothing the program started writes after the trailer."""
    give_up = time.monotonic() + REAP_LIMIT_S
    while time.monotonic() < give_up:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:  # signalled, not yet reparented to us
            time.sleep(0.001)


def fail(why: bytes) -> None:
    os.write(2, b"edgecoder bootstrap: " + why + b"\n")
    os._exit(BOOTSTRAP_FAILED)


def read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            fail(b"stdin ended early")
        data += chunk
    return data


def create(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def copy_from_stdin(fd: int, n: int) -> None:
    while n:
        chunk = os.read(0, min(n, 65536))
        if not chunk:
            fail(b"stdin ended early")
        n -= len(chunk)
        write_all(fd, chunk)


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


if __name__ == "__main__":
    main()
