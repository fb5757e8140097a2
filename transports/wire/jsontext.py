"""JSON from untrusted text, total: a bad or too deeply nested document is a `JsonError`, never a crash.

`json.loads` recurses once per nesting level and raises `RecursionError` near the interpreter's limit; anything that
later walks the value recursively (our canonical msgpack, say) would fail the same way at a smaller depth. So the
text is size-checked first, decoded with the recursion turned into a typed error, and the depth of the value is
checked iteratively against `max_depth` before anyone else touches it.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_MAX_DEPTH = 32


class JsonError(ValueError):
    """The text is not JSON we accept; the message says why, in words for a person."""


def parse_json(text: str | bytes, *, max_depth: int = DEFAULT_MAX_DEPTH, max_bytes: int | None = None) -> Any:
    if max_bytes is not None and len(text) > max_bytes:
        raise JsonError(f"{len(text)} bytes of JSON, more than {max_bytes}")
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonError("it nests too deeply") from None
    except UnicodeDecodeError as exc:
        raise JsonError(f"it is not UTF-8 text: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise JsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    depth = json_depth(value, limit=max_depth)
    if depth > max_depth:
        raise JsonError(f"it nests deeper than {max_depth} levels")
    return value


def json_depth(value: Any, *, limit: int) -> int:
    """The nesting depth of a decoded JSON value (a scalar is 0), counted without recursion; stops past `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest
