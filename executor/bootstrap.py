"""The stdin protocol between the host and a sandbox container, and the supervisor that speaks it inside.

Nothing is mounted into a container: code and input travel over its standard input. The container's command is
`python3 -I -S -c BOOTSTRAP`; the bootstrap text lives here, in the node's code, not in the image, so the image
stays plain Debian and the protocol can change without a rebuild.

Wire format, host -> container stdin:

    header   HEADER_SIZE bytes of ASCII:
             b"EC2 <language:10> <code_len:10> <input_len:10> <timeout_ms:10> <nonce:32>\\n"
    code     code_len bytes of UTF-8 program text
    input    input_len bytes of JSON text

The bootstrap is PID 1 of the container and stays there as the run's supervisor:

1. At start-up, before any task can arrive, it makes itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): its
   /proc files then belong to root, so a program of the same uid can neither read its memory, environment or
   file descriptors, nor ptrace it (seccomp also denies ptrace and process_vm_readv: executor/seccomp.py).
   SIGINT is ignored; SIGALRM is its own timer and acts only once the deadline has really passed. As the init of
   its pid namespace, no other signal from inside the container reaches it.
2. It reads exactly the header, code and input (unbuffered os.read, so it never over-reads), writes
   /tmp/main.py or /tmp/main.js and /tmp/input.json (tmpfs; noexec does not matter because the interpreter reads
   the file), and forks the program: `python3 /tmp/main.py` or `node /tmp/main.js`, with stdin from the input
   file (so the program sees its input as JSON on stdin, with a real end of file) and oom_score_adj 1000 (a
   memory bomb is the OOM killer's choice, not the supervisor). The nonce exists only in the supervisor's
   memory: not in any argv, environment or file.
3. It reaps every process that ends (orphans are reparented to it), until the program itself has ended, or
   until the deadline: `timeout_ms` + DEADLINE_GRACE_MS after the program started. The host enforces the timeout
   itself and kills the container first; this deadline is what ends a run whose host process was killed.
4. Then it kills every process left in the container and reaps them all, so nothing the program started writes
   after, or outlives, it; and writes the trailer

       b"EC2END:<nonce>:<status:3>\\n"   on stdout AND on stderr

   (status as a shell reports it: 128+N for a death by signal N; TIMEOUT_STATUS at the deadline) and exits with
   the same status.

The trailer lets the host return as soon as the program has ended, without waiting ~35 ms for Docker to tear the
container down and close the attach stream, and without an extra `wait` request. Docker copies the two streams
independently, so a trailer on each is what proves that each stream has delivered all the program wrote.
Trailers are stripped from the output. If the trailer does not arrive (the supervisor itself was killed), the
host falls back to end of stream + `wait`.

The bootstrap writes nothing before the header arrives. That matters: the host reads the attach socket
directly, below the HTTP client's buffer, so any byte sent before the first request would be lost. And a pool
container waiting for its header ends when its owner's attach connection closes (the SDK creates containers with
StdinOnce), so a dead host leaves no container waiting forever.
"""

from __future__ import annotations

import secrets

from executor.contract import Language

MAGIC = "EC2"
HEADER_SIZE = 81
TRAILER_TAG = b"EC2END:"
TRAILER_SIZE = len(TRAILER_TAG) + 32 + 1 + 3 + 1
# Exit status of the bootstrap itself when the stream is malformed or ends early (never the program's own).
BOOTSTRAP_FAILED = 125
# What the supervisor reports when its own deadline ended the run (as timeout(1) does).
TIMEOUT_STATUS = 124
# The supervisor's deadline follows the host's: the host always times a run out first while it is alive.
DEADLINE_GRACE_MS = 500
# How long the supervisor goes on killing leftovers before it writes the trailer anyway.
REAP_LIMIT_S = 2.0

PROGRAMS: dict[Language, tuple[str, str]] = {
    "python": ("/tmp/main.py", "/usr/bin/python3"),
    "javascript": ("/tmp/main.js", "/usr/bin/node"),
}


def new_nonce() -> str:
    return secrets.token_hex(16)


def encode_header(language: Language, code_len: int, input_len: int, timeout_ms: int, nonce: str) -> bytes:
    header = f"{MAGIC} {language:<10} {code_len:>10} {input_len:>10} {timeout_ms:>10} {nonce}\n".encode("ascii")
    assert len(header) == HEADER_SIZE, header
    return header


def encode_payload(language: Language, code: bytes, input_json: bytes, timeout_ms: int, nonce: str) -> bytes:
    return encode_header(language, len(code), len(input_json), timeout_ms, nonce) + code + input_json


def parse_trailer(tail: bytes, nonce: str) -> int | None:
    """The program's exit status if `tail` is exactly this run's trailer, else None."""
    prefix = TRAILER_TAG + nonce.encode("ascii") + b":"
    if len(tail) != TRAILER_SIZE or not tail.startswith(prefix) or not tail.endswith(b"\n"):
        return None
    digits = tail[len(prefix) : -1]
    return int(digits) if digits.isdigit() else None


BOOTSTRAP = f"""
import ctypes, os, signal, time
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: nothing in here may read or trace this process
signal.signal(signal.SIGINT, signal.SIG_IGN)
def fail(why):
    os.write(2, b"edgecoder bootstrap: " + why + b"\\n")
    os._exit({BOOTSTRAP_FAILED})
def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            fail(b"stdin ended early")
        data += chunk
    return data
def copy_to(path, n):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    while n:
        chunk = os.read(0, min(n, 65536))
        if not chunk:
            fail(b"stdin ended early")
        n -= len(chunk)
        while chunk:
            chunk = chunk[os.write(fd, chunk):]
    os.close(fd)
def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
fields = read_exact({HEADER_SIZE}).split()
if len(fields) != 6 or fields[0] != b"{MAGIC}" or not all(f.isdigit() for f in fields[2:5]):
    fail(b"bad header")
programs = {{{", ".join(f"b{lang!r}: ({path!r}, {interp!r})" for lang, (path, interp) in PROGRAMS.items())}}}
if fields[1] not in programs:
    fail(b"unknown language")
path, interpreter = programs[fields[1]]
code_len, input_len, timeout_ms, nonce = int(fields[2]), int(fields[3]), int(fields[4]), fields[5]
copy_to(path, code_len)
copy_to("/tmp/input.json", input_len)
program = os.fork()
if program == 0:
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # Dumpable again, or its own /proc files are root's. Safe: no other process than the supervisor exists yet,
        # and execve replaces this memory, the nonce with it.
        ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
        fd = os.open("/tmp/input.json", os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        os.execve(interpreter, [interpreter, path], {{"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}})
    except BaseException as exc:
        os.write(2, b"edgecoder bootstrap: cannot start the program: " + repr(exc).encode() + b"\\n")
    finally:
        os._exit(127)
deadline = time.monotonic() + (timeout_ms + {DEADLINE_GRACE_MS}) / 1000
expired = False
def on_alarm(signum, frame):
    global expired
    if time.monotonic() >= deadline:  # a SIGALRM sent from inside, before the deadline, changes nothing
        expired = True
        os.kill(-1, signal.SIGKILL)
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, deadline - time.monotonic(), 0.05)
status = None
while status is None:
    pid, wait_status = os.waitpid(-1, 0)  # orphans come to PID 1: reaped here too
    if pid == program:
        code = os.waitstatus_to_exitcode(wait_status)
        status = code if code >= 0 else 128 - code
signal.setitimer(signal.ITIMER_REAL, 0)
if expired:
    status = {TIMEOUT_STATUS}
give_up = time.monotonic() + {REAP_LIMIT_S}
while time.monotonic() < give_up:
    try:
        os.kill(-1, signal.SIGKILL)  # every process here but this one
    except ProcessLookupError:
        break
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:  # signalled, not yet reparented to us
        time.sleep(0.001)
trailer = b"{TRAILER_TAG.decode()}" + nonce + b":%03d\\n" % status
write_all(1, trailer)
write_all(2, trailer)
os._exit(status)
"""
