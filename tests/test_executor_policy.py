"""Policy: clamping requested limits and reading the environment."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor import seccomp
from executor.contract import Limits
from executor.policy import DEFAULT_IMAGE, MIN_CPUS, ExecutorPolicy

POLICY = ExecutorPolicy()


@given(
    timeout_ms=st.integers(min_value=-(10**12), max_value=10**12),
    memory_mb=st.integers(min_value=-(10**9), max_value=10**9),
    cpus=st.floats(allow_nan=True, allow_infinity=True),
)
def test_clamped_limits_always_lie_inside_the_policy(timeout_ms: int, memory_mb: int, cpus: float) -> None:
    clamped = POLICY.clamp(Limits(timeout_ms=timeout_ms, memory_mb=memory_mb, cpus=cpus))
    assert 1 <= clamped.timeout_ms <= POLICY.max_timeout_ms
    assert POLICY.min_memory_mb <= clamped.memory_mb <= POLICY.max_memory_mb
    assert MIN_CPUS <= clamped.cpus <= POLICY.max_cpus
    assert math.isfinite(clamped.cpus)
    assert POLICY.clamp(clamped) == clamped  # idempotent


def test_limits_inside_the_policy_are_kept() -> None:
    assert POLICY.clamp(Limits(2000, 64, 0.25)) == Limits(2000, 64, 0.25)


@pytest.mark.parametrize(
    ("asked", "granted"),
    [
        (Limits(10**9, 10**6, 64.0), Limits(30_000, 512, 1.0)),
        (Limits(0, 1, 0.0), Limits(1, 32, 0.01)),
        (Limits(5000, 128, math.nan), Limits(5000, 128, 1.0)),
        (Limits(5000, 128, math.inf), Limits(5000, 128, 1.0)),
    ],
)
def test_out_of_range_limits_are_clamped(asked: Limits, granted: Limits) -> None:
    assert POLICY.clamp(asked) == granted


def test_defaults_match_the_design() -> None:
    p = ExecutorPolicy()
    assert (p.image, p.max_timeout_ms, p.max_memory_mb, p.min_memory_mb, p.max_cpus) == (
        DEFAULT_IMAGE,
        30_000,
        512,
        32,
        1.0,
    )
    assert (p.allow_network, p.subset_check, p.stdout_cap, p.stderr_cap, p.seccomp_profile) == (
        False,
        True,
        65536,
        65536,
        str(seccomp.PROFILE_PATH),
    )
    assert (p.max_concurrent, p.max_waiting, p.pool_size) == (2, 16, 2)
    assert (p.prestart, p.pool_languages) == (True, ("python", "javascript"))
    assert p.clamp(p.pool_limits) == p.pool_limits


def test_from_env_reads_image_subset_switch_and_seccomp_profile() -> None:
    assert ExecutorPolicy.from_env({}) == ExecutorPolicy()
    policy = ExecutorPolicy.from_env(
        {"EDGECODER_IMAGE": "x:1", "EDGECODER_SUBSET_CHECK": "0", "SANDBOX_SECCOMP_PROFILE": "/p.json"}
    )
    assert (policy.image, policy.subset_check, policy.seccomp_profile) == ("x:1", False, "/p.json")
    assert ExecutorPolicy.from_env({"EDGECODER_SUBSET_CHECK": "1"}).subset_check is True


def test_pool_limits_outside_the_policy_are_rejected() -> None:
    with pytest.raises(ValueError, match="pool_limits"):
        ExecutorPolicy(pool_limits=Limits(5000, 4096, 0.5))


@pytest.mark.parametrize("languages", [(), ("ruby",), ("python", "cobol")])
def test_pool_languages_outside_the_executors_are_rejected(languages: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="pool_languages"):
        ExecutorPolicy(pool_languages=languages)  # type: ignore[arg-type]
