"""The stdin protocol between the host and a sandbox container, and the bootstrap that speaks it inside.

Nothing is mounted into a container: code and input travel over its standard input. The container's command is
`python3 -I -S -c BOOTSTRAP`; the bootstrap text lives here, in the node's code, not in the image, so the image
stays plain Debian and the protocol can change without a rebuild.

Wire format, host -> container stdin:

    header   HEADER_SIZE bytes of ASCII: b"EC1 <language:10> <code_len:10> <input_len:10> <nonce:32>\\n"
    code     code_len bytes of UTF-8 program text
    input    input_len bytes of JSON text

The bootstrap reads exactly these bytes (unbuffered os.read, so it never over-reads), writes the code to
/tmp/main.py or /tmp/main.js and the input to /tmp/input.json (tmpfs; noexec does not matter because the
interpreter reads the file) and execs a one-line `/bin/sh` supervisor, which runs `python3 /tmp/main.py` or
`node /tmp/main.js` with stdin redirected from the input file (so the program sees its input as JSON on stdin,
with a real end of file, whatever the attach connection does), then writes the trailer

    b"EC1END:<nonce>:<status:3>\\n"   on stdout AND on stderr   (status as the shell reports it: 128+N for N)

and exits with the program's status. The trailer lets the host return as soon as the program has ended,
without waiting ~35 ms for Docker to tear the container down and close the attach stream, and without an
extra `wait` request. Docker copies the two streams independently, so a trailer on each is what proves that
each stream has delivered all the program wrote. Trailers are stripped from the output. The nonce is fresh per
run, so no output can end with it by accident; a program that learns it (from /proc) can only misreport its own
result, which it controls anyway.
If the trailer does not arrive (the supervisor was killed), the host falls back to end of stream + `wait`.

The bootstrap writes nothing before the header arrives. That matters: the host reads the attach socket
directly, below the HTTP client's buffer, so any byte sent before the first request would be lost.
"""

from __future__ import annotations

import secrets

from executor.contract import Language

HEADER_SIZE = 70
MAGIC = "EC1"
TRAILER_TAG = b"EC1END:"
TRAILER_SIZE = len(TRAILER_TAG) + 32 + 1 + 3 + 1
# Exit status of the bootstrap itself when the stream is malformed (never the program's own status).
BOOTSTRAP_FAILED = 125

PROGRAMS: dict[Language, tuple[str, str]] = {
    "python": ("/tmp/main.py", "/usr/bin/python3"),
    "javascript": ("/tmp/main.js", "/usr/bin/node"),
}


def new_nonce() -> str:
    return secrets.token_hex(16)


def encode_header(language: Language, code_len: int, input_len: int, nonce: str) -> bytes:
    header = f"{MAGIC} {language:<10} {code_len:>10} {input_len:>10} {nonce}\n".encode("ascii")
    assert len(header) == HEADER_SIZE, header
    return header


def encode_payload(language: Language, code: bytes, input_json: bytes, nonce: str) -> bytes:
    return encode_header(language, len(code), len(input_json), nonce) + code + input_json


def parse_trailer(tail: bytes, nonce: str) -> int | None:
    """The program's exit status if `tail` is exactly this run's trailer, else None."""
    prefix = TRAILER_TAG + nonce.encode("ascii") + b":"
    if len(tail) != TRAILER_SIZE or not tail.startswith(prefix) or not tail.endswith(b"\n"):
        return None
    digits = tail[len(prefix) : -1]
    return int(digits) if digits.isdigit() else None


# $1 nonce, $2 interpreter, $3 program. dash keeps running as the parent, so it sees the status.
# printf is a dash builtin: writing the trailers forks nothing (a fork can fail once pids are exhausted).
SUPERVISOR = (
    '"$2" "$3" </tmp/input.json; s=$?; '
    'printf "EC1END:%s:%03d\\n" "$1" "$s"; printf "EC1END:%s:%03d\\n" "$1" "$s" >&2; exit "$s"'
)


BOOTSTRAP = f"""
import os
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
fields = read_exact({HEADER_SIZE}).split()
if len(fields) != 5 or fields[0] != b"{MAGIC}":
    fail(b"bad header")
programs = {{{", ".join(f"b{lang!r}: ({path!r}, {interp!r})" for lang, (path, interp) in PROGRAMS.items())}}}
if fields[1] not in programs:
    fail(b"unknown language")
path, interpreter = programs[fields[1]]
copy_to(path, int(fields[2]))
copy_to("/tmp/input.json", int(fields[3]))
fd = os.open("/tmp/input.json", os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
os.execve(
    "/bin/sh",
    ["sh", "-c", {SUPERVISOR!r}, "sh", fields[4].decode(), interpreter, path],
    {{"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}},
)
"""
