"""Offer v3's needs (transports/wire/needs.py): a runtime by name and digest, minimum resources, and nothing that
could choose an image, a mount or a package."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.wire.codec import Domain, seal
from transports.wire.identity import NodeIdentity
from transports.wire.needs import Capabilities, Needs, Resources
from transports.wire.offers import TaskOffer, open_offer
from transports.wire.reasons import Reason, Rejected

OFFERER = NodeIdentity(bytes(range(32)))
DIGEST = "0123456789abcdef" * 4


def signed(fields: dict[str, Any]) -> bytes:
    return seal(Domain.OFFER, fields, OFFERER)


def base_fields(version: int = 3, **needs: Any) -> dict[str, Any]:
    offer = TaskOffer.create(OFFERER, language="python", code="print(1)")
    return {**dataclasses.replace(offer, version=version).to_wire_fields(), **needs}


def test_needs_round_trip_and_an_offer_without_them_is_python_anywhere() -> None:
    needs = Needs("python-science", DIGEST, Resources(cores=4, memory_mb=2048, arch="aarch64", gpu=True))
    offer = TaskOffer.create(OFFERER, language="python", code="import numpy", needs=needs)
    assert open_offer(offer.sign(OFFERER)).offer.needs == needs
    plain = open_offer(TaskOffer.create(OFFERER, language="python", code="1").sign(OFFERER)).offer
    assert plain.needs == Needs() and plain.needs.runtime_name == "python"


@pytest.mark.parametrize(
    "extra",
    [
        {"runtime": None},
        {"runtime": "Python"},
        {"runtime": "x" * 33},
        {"runtime": "edgecoder-sandbox:bookworm"},
        {"runtime": 7},
        {"runtimeDigest": "AB" * 32},
        {"runtimeDigest": "ab" * 31},
        {"minResources": {}},
        {"minResources": {"gpu": False}},
        {"minResources": {"cores": 0}},
        {"minResources": {"memoryMb": -1}},
        {"minResources": {"image": "debian"}},
        # What an offer can never name: an image, a mount, a package.
        {"image": "debian:bookworm"},
        {"mounts": ["/:/host"]},
        {"packages": ["python3-numpy"]},
        {"binds": ["/var/run/docker.sock:/s"]},
    ],
)
def test_malformed_needs_and_anything_naming_an_image_mount_or_package_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(Rejected) as refused:
        open_offer(signed(base_fields(**extra)))
    assert refused.value.args[0].startswith(Reason.MALFORMED)


def test_older_versions_carry_no_needs() -> None:
    for version in (1, 2):
        fields = base_fields(version, runtime="python-science")
        if version == 1:
            fields = {k: v for k, v in fields.items() if k not in ("audience", "minIsolation")}
        with pytest.raises(Rejected, match="unknown field 'runtime'"):
            open_offer(signed(fields))
    with pytest.raises(ValueError, match="no runtime"):
        dataclasses.replace(
            TaskOffer.create(OFFERER, language="python", code="1"), version=2, needs=Needs("python-science")
        ).sign(OFFERER)


CAPS = Capabilities({"python": "aa" * 32, "python-science": DIGEST}, cores=2, memory_mb=4096, arch="x86_64")


@pytest.mark.parametrize(
    ("needs", "reason"),
    [
        (Needs(), None),
        (Needs("python-science"), None),
        (Needs("python-science", DIGEST), None),
        (Needs("python-science", "ff" * 32), Reason.RUNTIME_UNAVAILABLE),
        (Needs("geo"), Reason.RUNTIME_UNAVAILABLE),
        (Needs(resources=Resources(cores=2, memory_mb=4096, arch="x86_64")), None),
        (Needs(resources=Resources(cores=3)), Reason.RESOURCES_INSUFFICIENT),
        (Needs(resources=Resources(memory_mb=4097)), Reason.RESOURCES_INSUFFICIENT),
        (Needs(resources=Resources(arch="aarch64")), Reason.RESOURCES_INSUFFICIENT),
        (Needs(resources=Resources(gpu=True)), Reason.RESOURCES_INSUFFICIENT),
    ],
)
def test_a_node_judges_needs_with_a_typed_reason(needs: Needs, reason: Reason | None) -> None:
    unmet = CAPS.unmet(needs)
    assert (unmet[0] if unmet else None) == reason


def test_capabilities_round_trip_and_junk_is_no_advertisement() -> None:
    assert Capabilities.from_json(CAPS.to_json()) == CAPS
    junks: list[object] = [
        None,
        [],
        {"runtimes": "python"},
        {"runtimes": [{"name": "X", "digest": DIGEST}], "resources": {}},
    ]
    for junk in junks:
        assert Capabilities.from_json(junk) is None


@given(st.dictionaries(st.text(max_size=12), st.none() | st.integers() | st.text(max_size=70), max_size=4))
def test_needs_refuse_with_malformed_only(extra: dict[str, Any]) -> None:
    fields = {k: v for k, v in extra.items() if k in ("runtime", "runtimeDigest", "minResources")}
    try:
        Needs.from_wire(fields)
    except Rejected as rejected:
        assert rejected.args[0].startswith(Reason.MALFORMED)
