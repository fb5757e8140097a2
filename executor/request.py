"""A request made ready for the sandbox: its code and input as the bytes that travel into the container, within
the policy's sizes, or the result that says why not (nothing has been started then)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from executor.contract import ErrorKind, ExecRequest, ExecResult, Language
from executor.policy import ExecutorPolicy


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request whose sizes were checked: code and input as the bytes that travel into the sandbox."""

    language: Language
    code: bytes
    input_json: bytes


def prepare_request(request: ExecRequest | PreparedRequest, policy: ExecutorPolicy) -> PreparedRequest | ExecResult:
    """The request as bytes within the policy's sizes, or the result explaining why not.

    The code's length is judged before it is encoded (a str never encodes to fewer bytes than it has
    characters), and before anything parses it.
    """
    if isinstance(request, PreparedRequest):
        return request
    if len(request.code) > policy.max_code_bytes:
        return rejected(f"code is {len(request.code)} characters, more than {policy.max_code_bytes} bytes")
    code = request.code.encode("utf-8", errors="surrogatepass")
    if len(code) > policy.max_code_bytes:
        return rejected(f"code is {len(code)} bytes, more than {policy.max_code_bytes}")
    try:
        input_json = json.dumps(request.input, allow_nan=False).encode("utf-8")
    except RecursionError:
        return rejected("input nests too deeply to encode as JSON")
    except (TypeError, ValueError) as exc:
        return rejected(f"input is not JSON data: {exc}")
    if len(input_json) > policy.max_input_bytes:
        return rejected(f"input is {len(input_json)} bytes of JSON, more than {policy.max_input_bytes}")
    return PreparedRequest(request.language, code, input_json)


def rejected(why: str) -> ExecResult:
    return ExecResult(ok=False, stderr=why, error_kind=ErrorKind.EXECUTION_FAILED)
