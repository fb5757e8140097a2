"""The stdin protocol between the host and a sandbox container (the supervisor inside is executor/supervisor.py).

Nothing is mounted into a container: code and input travel over its standard input. The container's command is
`python3 -I -S -c BOOTSTRAP`, BOOTSTRAP being the supervisor's source; it lives in the node's code, not in the
image, so the image stays plain Debian and the protocol can change without a rebuild.

Wire format, host -> container stdin:

    prestart PRESTART_SIZE bytes of ASCII, optional: b"EC2P <language:10>\\n"
    header   HEADER_SIZE bytes of ASCII:
             b"EC2 <language:10> <code_len:10> <input_len:10> <timeout_ms:10> <nonce:32>\\n"
    code     code_len bytes of UTF-8 program text
    input    input_len bytes of JSON text

A pool container is sent its prestart line as soon as it has started, and its task later; a cold container is
sent both at once. The prestart line has the supervisor start the program's interpreter before the task comes,
parked where it opens its main file (executor/supervisor.py, docs/executor.md "Warm start"). A task for another
language than the prestarted one, or one without a prestart line, starts its interpreter on arrival.

The supervisor ends each run with the trailer

    b"EC2END:<nonce>:<status:3>\\n"   on stdout AND on stderr

and exits with the same status. The trailer lets the host return as soon as the program has ended, without
waiting ~35 ms for Docker to tear the container down and close the attach stream, and without an extra `wait`
request. Docker copies the two streams independently, so a trailer on each is what proves that each stream has
delivered all the program wrote. Trailers are stripped from the output. If the trailer does not arrive (the
supervisor itself was killed), the host falls back to end of stream + `wait`. The nonce lives only in the
non-dumpable supervisor's memory: in no argv, environment or file, and never in the program's address space (a
prestarted interpreter is forked before the header is read; one started on arrival is replaced by execve).

The supervisor writes nothing before the header arrives, and neither does a parked interpreter. That matters: the
host reads the attach socket directly, below the HTTP client's buffer, so any byte sent before the first request
would be lost, and a pool container is alive only while its attach stream is silent. A pool container waiting for
its header ends when its owner's attach connection closes (the SDK creates containers with StdinOnce), so a dead
host leaves no container waiting forever.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from executor import supervisor
from executor.contract import Language
from executor.supervisor import (
    BOOTSTRAP_FAILED,
    DEADLINE_GRACE_MS,
    HEADER_SIZE,
    MAGIC,
    NOT_PARKED,
    PARKED,
    PRESTART_SIZE,
    PRESTART_TAG,
    PROGRAMS,
    REAP_LIMIT_S,
    TIMEOUT_STATUS,
    TRAILER_TAG,
)

__all__ = [
    "BOOTSTRAP",
    "BOOTSTRAP_FAILED",
    "DEADLINE_GRACE_MS",
    "HEADER_SIZE",
    "NOT_PARKED",
    "PARKED",
    "PROGRAMS",
    "REAP_LIMIT_S",
    "TIMEOUT_STATUS",
    "TRAILER_SIZE",
    "encode_header",
    "encode_payload",
    "encode_prestart",
    "new_nonce",
    "parse_trailer",
]

TRAILER_SIZE = len(TRAILER_TAG) + 32 + 1 + 3 + 1
# The container command's program: the supervisor's source, run by the image's python3 (executor/supervisor.py).
BOOTSTRAP = Path(supervisor.__file__).read_text(encoding="utf-8")


def new_nonce() -> str:
    return secrets.token_hex(16)


def encode_prestart(language: Language) -> bytes:
    """The line that has a container start `language`'s interpreter before its task arrives."""
    line = PRESTART_TAG + f" {language:<10}\n".encode("ascii")
    assert len(line) == PRESTART_SIZE, line
    return line


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
