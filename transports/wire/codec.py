"""Canonical msgpack and signed envelopes: exactly one byte string per value.

A signed message on the wire is the msgpack array `[body, signature]`, where `body` is the canonical msgpack
encoding of a map and `signature` is Ed25519 over `domain || 0x00 || body`. The signature covers the body bytes as
sent, so nothing is re-encoded before verification; canonical form is still enforced on decode so that one value has
one encoding (a content-addressed id then collapses duplicates, and no two wire forms carry the same offer).

The domain string keeps an offer's signature from ever passing as a result's, and both from passing as libp2p's
(which signs `libp2p-pubsub:` + message).
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from transports.wire.identity import SIGNATURE_SIZE, NodeIdentity, verify
from transports.wire.msgshape import check_shape
from transports.wire.reasons import Reason, Rejected

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024
MAX_DEPTH = 16  # nesting of user data (`input`); deeper is refused before any recursion can hurt us
# Nesting of any decoded message: user data plus the few levels of the message around it.
MAX_WIRE_DEPTH = MAX_DEPTH + 4


def now_ms() -> int:
    """The wire's clock: Unix time in milliseconds, as every signed message's timestamps are."""
    return time.time_ns() // 1_000_000


class Domain:
    OFFER = b"edgecoder-mesh/offer/v1"
    RESULT = b"edgecoder-mesh/result/v1"
    CLAIM = b"edgecoder-mesh/claim/v1"
    # Issue 23: the offerer's cancel of one offer, and a runner's signed word on a job's progress.
    CANCEL = b"edgecoder-mesh/cancel/v1"
    PROGRESS = b"edgecoder-mesh/progress/v1"


def canonical(value: Any) -> Any:
    """The same value with every map's keys in sorted order (msgpack already picks the shortest int form)."""
    kind = type(value)
    if kind is dict or (kind is not list and kind is not tuple and isinstance(value, Mapping)):
        return {k: canonical(value[k]) for k in sorted(value)}
    if kind is list or kind is tuple:
        return [canonical(v) for v in value]
    return value


def _sorted_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """msgpack's map hook on decode: keys must be strictly increasing, which also rules out duplicates."""
    keys = [pair[0] for pair in pairs]
    if not all(map(operator.lt, keys, keys[1:])):
        raise ValueError("map keys are not in canonical order")
    return dict(pairs)


def pack(value: Any) -> bytes:
    return msgpack.packb(canonical(value), use_bin_type=True)


def unpack_strict(data: bytes, *, max_size: int, max_depth: int = MAX_WIRE_DEPTH) -> Any:
    """Decode what a peer sent. Its shape is walked first (`transports.wire.msgshape`: depth, declared sizes against
    the bytes there are), so that decoding never allocates more than the input's own size; msgpack's limits then say
    the same to the C decoder."""
    if len(data) > max_size:
        raise Rejected(Reason.TOO_LARGE, f"{len(data)} bytes > cap {max_size}")
    check_shape(data, max_depth=max_depth)
    size = len(data)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_pairs_hook=_sorted_map,
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=0,  # no extension types at all
        )
    except Exception as exc:  # msgpack raises many kinds (ValueError, ExtraData, StackError, UnicodeDecodeError)
        raise Rejected(Reason.MALFORMED, f"not msgpack: {type(exc).__name__}") from None


def require_canonical(value: Any, data: bytes, what: str) -> None:
    """Decoding already refused unsorted maps; what remains is non-minimal lengths and int forms."""
    try:
        encoded = msgpack.packb(value, use_bin_type=True)
    except (RecursionError, ValueError):  # nesting deep enough to exhaust the packer
        raise Rejected(Reason.MALFORMED, f"{what} nests too deeply") from None
    if encoded != data:
        raise Rejected(Reason.MALFORMED, f"{what} is not in canonical encoding")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A signed message as received: the body still as bytes, its signature not yet checked."""

    domain: bytes
    body: bytes
    signature: bytes
    fields: dict[str, Any]

    def signature_valid(self, public_key: bytes) -> bool:
        return verify(public_key, self.signature, self.domain + b"\x00" + self.body)


def seal(domain: bytes, fields: Mapping[str, Any], identity: NodeIdentity) -> bytes:
    body = pack(fields)
    signature = identity.sign(domain + b"\x00" + body)
    return pack([body, signature])


def open_envelope(domain: bytes, raw: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> Envelope:
    """Size, then decode, then shape: everything short of the signature, cheapest first."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise Rejected(Reason.MALFORMED, "not bytes")
    raw = bytes(raw)
    if len(raw) > max_size:
        raise Rejected(Reason.TOO_LARGE, f"{len(raw)} bytes > cap {max_size}")
    outer = unpack_strict(raw, max_size=max_size)
    if (
        not isinstance(outer, list)
        or len(outer) != 2
        or not isinstance(outer[0], bytes)
        or not isinstance(outer[1], bytes)
    ):
        raise Rejected(Reason.MALFORMED, "envelope is not [body, signature]")
    body, signature = outer
    if len(signature) != SIGNATURE_SIZE:
        raise Rejected(Reason.MALFORMED, "signature is not 64 bytes")
    require_canonical(outer, raw, "envelope")
    fields = unpack_strict(body, max_size=max_size)
    if not isinstance(fields, dict):
        raise Rejected(Reason.MALFORMED, "body is not a map")
    require_canonical(fields, body, "body")
    return Envelope(domain, body, signature, fields)


# -- strict field readers: every type is checked, bool is never an int ------------------------------------------


class Fields:
    """Reads typed fields out of a decoded map, rejecting anything unexpected with `malformed`."""

    def __init__(self, data: dict[str, Any], allowed: frozenset[str], what: str) -> None:
        unknown = set(data) - allowed
        if unknown:
            raise Rejected(Reason.MALFORMED, f"{what}: unknown field {sorted(unknown)[0]!r}")
        self.data = data
        self.what = what

    def _get(self, name: str) -> Any:
        try:
            return self.data[name]
        except KeyError:
            raise Rejected(Reason.MALFORMED, f"{self.what}: missing field {name!r}") from None

    def _bad(self, name: str, expected: str) -> Rejected:
        return Rejected(Reason.MALFORMED, f"{self.what}: {name!r} must be {expected}")

    def opt_integer(self, name: str, lo: int = 0, hi: int = 2**63 - 1, *, optional: bool = True) -> int | None:
        value = self._get(name)
        if value is None and optional:
            return None
        if type(value) is not int or not lo <= value <= hi:
            raise self._bad(name, f"an integer in [{lo}, {hi}]")
        return value

    def integer(self, name: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
        value = self.opt_integer(name, lo, hi, optional=False)
        assert value is not None
        return value

    def boolean(self, name: str) -> bool:
        value = self._get(name)
        if type(value) is not bool:
            raise self._bad(name, "a boolean")
        return value

    def opt_binary(self, name: str, size: int) -> bytes | None:
        value = self._get(name)
        if value is None:
            return None
        if type(value) is not bytes or len(value) != size:
            raise self._bad(name, f"{size} bytes or null")
        return value

    def binary(self, name: str, size: int) -> bytes:
        value = self._get(name)
        if type(value) is not bytes or len(value) != size:
            raise self._bad(name, f"{size} bytes")
        return value

    def opt_text(self, name: str, max_len: int, *, optional: bool = True, choices: tuple[str, ...] = ()) -> str | None:
        value = self._get(name)
        if value is None and optional:
            return None
        if type(value) is not str or len(value) > max_len or (choices and value not in choices):
            raise self._bad(name, f"one of {choices}" if choices else f"a string of at most {max_len} chars")
        return value

    def text(self, name: str, max_len: int, *, choices: tuple[str, ...] = ()) -> str:
        value = self.opt_text(name, max_len, optional=False, choices=choices)
        assert value is not None
        return value

    def map(self, name: str) -> dict[str, Any]:
        value = self._get(name)
        if type(value) is not dict:
            raise self._bad(name, "a map")
        return value

    def str_list(self, name: str, max_items: int, max_len: int) -> tuple[str, ...]:
        value = self._get(name)
        if (
            type(value) is not list
            or len(value) > max_items
            or any(type(v) is not str or len(v) > max_len for v in value)
        ):
            raise self._bad(name, f"a list of at most {max_items} strings")
        return tuple(value)

    def json_data(self, name: str) -> Any:
        value = self._get(name)
        check_json_data(value, f"{self.what}.{name}")
        return value


def check_json_data(value: Any, where: str) -> None:
    """User data must be JSON-compatible: it reaches the program as JSON on stdin."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Rejected(Reason.MALFORMED, f"{where} nests deeper than {MAX_DEPTH}")
        if item is None or type(item) in (bool, int, str):
            if type(item) is int and not -(2**63) <= item < 2**64:
                raise Rejected(Reason.MALFORMED, f"{where} holds an integer out of range")
            continue
        if type(item) is float:
            if not math.isfinite(item):
                raise Rejected(Reason.MALFORMED, f"{where} holds a non-finite float")
            continue
        if type(item) is list:
            stack.extend((v, depth + 1) for v in item)
            continue
        if type(item) is dict:
            if any(type(k) is not str for k in item):
                raise Rejected(Reason.MALFORMED, f"{where} has a map key that is not a string")
            stack.extend((v, depth + 1) for v in item.values())
            continue
        raise Rejected(Reason.MALFORMED, f"{where} holds {type(item).__name__}, which JSON cannot carry")
