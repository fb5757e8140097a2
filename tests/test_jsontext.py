"""Untrusted JSON: every input is a value or a `JsonError`, however deep or broken."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.wire.jsontext import JsonError, json_depth, parse_json


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_a_typed_error_at_any_depth(depth: int) -> None:
    for opener, closer in (("[", "]"), ('{"a":', "}")):
        with pytest.raises(JsonError, match="nests"):
            parse_json(opener * depth + "1" + closer * depth)


def test_the_depth_limit_is_exact() -> None:
    assert parse_json("[" * 32 + "]" * 32) is not None
    with pytest.raises(JsonError):
        parse_json("[" * 33 + "]" * 33)


def test_size_is_checked_before_parsing() -> None:
    with pytest.raises(JsonError, match="more than"):
        parse_json(b"[" * 10_000_000, max_bytes=1000)


@given(st.binary(max_size=4000) | st.text(max_size=4000))
def test_any_text_is_a_value_or_a_json_error(text: str | bytes) -> None:
    try:
        parse_json(text)
    except JsonError:
        pass


@given(st.recursive(st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=30))
def test_depth_matches_a_recursive_count(value: object) -> None:
    def depth(v: object) -> int:
        children = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            return 0
        return 1 + max((depth(c) for c in children), default=0)

    assert json_depth(value, limit=10**6) == depth(value)
    assert parse_json(json.dumps(value), max_depth=10**6) == value
