"""Runtimes: declared by the operator as Debian package lists, built into labelled images, and the only images that
run (executor/runtimes.py, executor/images.py, executor/budget.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.budget import WarmBudget
from executor.policy import DEFAULT_IMAGE, ExecutorPolicy
from executor.runtimes import (
    BASE_PACKAGES,
    DIGEST_LABEL,
    PACKAGES_LABEL,
    Runtime,
    packages_digest,
    parse_runtime,
    runtime_info,
    science_runtime,
)


def test_built_in_runtimes_and_declared_package_lists_parse() -> None:
    assert parse_runtime("python") == Runtime("python")
    science = parse_runtime(" python-science ")
    assert science == science_runtime()
    assert {"python3-numpy", "python3-scipy", "python3-pandas"} <= set(science.packages)
    mine = parse_runtime("geo=python3-shapely  python3-pyproj")
    assert mine.name == "geo" and mine.packages == ("python3-pyproj", "python3-shapely")
    assert mine.all_packages == tuple(sorted({*BASE_PACKAGES, "python3-pyproj", "python3-shapely"}))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("unknown", "no built-in runtime"),
        ("python=python3-numpy", "built in"),
        ("geo=", "lists no package"),
        ("Geo=python3-yaml", "runtime name"),
        ("geo=python3-yaml;rm", "not a Debian package name"),
        ("geo=../../etc/passwd", "not a Debian package name"),
        ("geo=--allow-unauthenticated", "not a Debian package name"),
    ],
)
def test_bad_declarations_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_runtime(text)


def test_the_image_tag_names_the_package_list_so_a_changed_list_is_a_new_image() -> None:
    one = Runtime("geo", ("python3-shapely",))
    same = Runtime("geo", ("python3-shapely", "python3-shapely"))
    other = Runtime("geo", ("python3-shapely", "python3-pyproj"))
    assert one.image == same.image and one.image.startswith("edgecoder-sandbox:geo-")
    assert other.image != one.image


def test_the_policy_runs_only_declared_runtimes_and_only_the_image_differs() -> None:
    policy = ExecutorPolicy(runtimes=(science_runtime(),), max_memory_mb=256)
    assert policy.runtime_names == ("python", "python-science")
    assert policy.runtime("python") == Runtime("python", image=DEFAULT_IMAGE)
    assert policy.runtime("nope") is None
    science = policy.for_runtime("python-science")
    assert science.image == science_runtime().image
    assert (science.max_memory_mb, science.seccomp_profile, science.isolation) == (
        policy.max_memory_mb,
        policy.seccomp_profile,
        policy.isolation,
    )
    with pytest.raises(ValueError, match="not declared"):
        policy.for_runtime("nope")
    with pytest.raises(ValueError, match="policy's image"):
        ExecutorPolicy(runtimes=(Runtime("python", ("python3-numpy",)),))
    with pytest.raises(ValueError, match="distinct"):
        ExecutorPolicy(runtimes=(science_runtime(), science_runtime()))


def test_runtime_info_reads_the_labels_and_refuses_an_edited_list() -> None:
    runtime = science_runtime()
    packages = ["python3=3.11.2-1+b1", "nodejs=18.19.0+dfsg-6~deb12u2", "python3-numpy=1:1.24.2-1+deb12u1"]
    labels = {PACKAGES_LABEL: " ".join(packages), DIGEST_LABEL: packages_digest(packages)}
    info = runtime_info(runtime, {"Id": "sha256:abc", "Config": {"Labels": labels}})
    assert info is not None
    assert info.digest == packages_digest(sorted(packages)) and info.packages == tuple(sorted(packages))
    assert info.to_json(with_packages=False) == {"name": runtime.name, "digest": info.digest, "imageId": "sha256:abc"}
    edited = {**labels, PACKAGES_LABEL: labels[PACKAGES_LABEL] + " evil=1"}
    assert runtime_info(runtime, {"Id": "sha256:abc", "Config": {"Labels": edited}}) is None
    assert runtime_info(runtime, {"Id": "sha256:abc", "Config": {"Labels": None}}) is None


@given(st.lists(st.text(alphabet="abc=1.:+~", min_size=1, max_size=12), max_size=20))
def test_the_digest_is_of_the_set_not_of_its_order(packages: list[str]) -> None:
    assert packages_digest(packages) == packages_digest(list(reversed(packages)))


def test_the_warm_budget_follows_the_runtimes_in_use() -> None:
    budget = WarmBudget(2, ("python", "python-science", "geo"), idle_s=100)
    assert budget.shares() == {"python": 2, "python-science": 0, "geo": 0}
    assert budget.used("python", 1.0) is False
    assert budget.used("python-science", 2.0) is True
    assert budget.shares() == {"python": 1, "python-science": 1, "geo": 0}
    assert budget.used("geo", 3.0) is True
    # Three in use, two containers: the most recently used first.
    assert budget.shares() == {"python": 0, "python-science": 1, "geo": 1}
    assert budget.expire(102.5) is True  # python-science idle since 2.0
    assert budget.shares() == {"python": 1, "python-science": 0, "geo": 1}
    assert budget.expire(500.0) is True
    assert budget.shares() == {"python": 2, "python-science": 0, "geo": 0}


@given(st.integers(0, 16), st.lists(st.sampled_from(["python", "a", "b", "c"]), max_size=12))
def test_the_warm_budget_is_never_exceeded(total: int, uses: list[str]) -> None:
    budget = WarmBudget(total, ("python", "a", "b", "c"))
    for now, runtime in enumerate(uses):
        budget.used(runtime, float(now))
        shares = budget.shares()
        assert sum(shares.values()) == total
        assert all(shares[r] == 0 for r in shares if r not in budget.in_use)


def test_the_settings_declare_runtimes_and_refuse_bad_ones_with_the_key(tmp_path: object) -> None:
    from mesh.config import ConfigError, node_settings, resolve

    policy = node_settings(resolve({}, environ={"EDGECODER_RUNTIMES": "python,geo=python3-shapely"})).executor_policy
    assert policy.runtime_names == ("python", "geo")
    assert policy.runtime("geo") == Runtime("geo", ("python3-shapely",))
    with pytest.raises(ConfigError, match=r"executor\.runtimes"):
        resolve({}, environ={"EDGECODER_RUNTIMES": "geo=evil;rm"})
