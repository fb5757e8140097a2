"""Settings: which source wins, what each value becomes, and that a bad value is refused, never clamped."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.config import (
    BY_KEY,
    SETTINGS,
    ConfigError,
    FloatRange,
    IntRange,
    Setting,
    node_settings,
    resolve,
)
from transports.wire.identity import NodeIdentity


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edgecoder.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_node_s_own(tmp_path: Path) -> None:
    from executor.policy import ExecutorPolicy
    from executor.runtimes import science_runtime
    from mesh.intake import IntakePolicy

    settings = node_settings(resolve({}, environ={}))
    # A node declares python-science by default; the executor's own default is the python runtime alone.
    assert settings.executor_policy == ExecutorPolicy(runtimes=(science_runtime(),))
    assert settings.intake_policy == IntakePolicy()
    assert all(source.kind == "default" for _, _, source in resolve({}, environ={}).rows())


def test_flags_beat_env_beat_file_beat_defaults(tmp_path: Path) -> None:
    config = write(tmp_path, "[executor]\nconcurrency = 3\npool_size = 1\n[intake]\nqueue_size = 10\n")
    env = {"EDGECODER_CONCURRENCY": "4", "EDGECODER_POOL_SIZE": "0"}
    resolved = resolve({"executor.concurrency": ("5", "--concurrency")}, config=config, environ=env)
    assert (
        resolved["executor.concurrency"] == 5 and str(resolved.sources["executor.concurrency"]) == "flag --concurrency"
    )
    assert (
        resolved["executor.pool_size"] == 0 and str(resolved.sources["executor.pool_size"]) == "env EDGECODER_POOL_SIZE"
    )
    assert resolved["intake.queue_size"] == 10 and str(resolved.sources["intake.queue_size"]) == f"file {config}"
    assert resolved["limits.max_memory_mb"] == 512 and str(resolved.sources["limits.max_memory_mb"]) == "default"


def test_the_file_is_found_through_the_environment(tmp_path: Path) -> None:
    config = write(tmp_path, '[log]\nlevel = "debug"\n')
    resolved = resolve({}, environ={"EDGECODER_CONFIG": str(config)})
    assert resolved["log.level"] == "debug" and resolved.file == config


def test_relative_paths_in_the_file_are_relative_to_it(tmp_path: Path) -> None:
    config = write(tmp_path, '[node]\nkey = "node.key"\nstate_dir = "/var/lib/edgecoder"\n')
    resolved = resolve({}, config=config, environ={})
    assert resolved["node.key"] == tmp_path / "node.key"
    assert resolved["node.state_dir"] == Path("/var/lib/edgecoder")


def test_offerer_lists_become_the_intake_s_key_sets(tmp_path: Path) -> None:
    alice, bob = NodeIdentity.generate(), NodeIdentity.generate()
    config = write(tmp_path, f'[intake]\nallow_offerers = ["{alice.peer_id}"]\ndeny_offerers = ["{bob.peer_id}"]\n')
    intake = node_settings(resolve({}, config=config, environ={})).intake_policy
    assert intake.allow_offerers == frozenset({alice.public_key})
    assert intake.deny_offerers == frozenset({bob.public_key})
    env_list = resolve({}, environ={"EDGECODER_DENY_OFFERERS": f"{alice.peer_id}, {bob.peer_id}"})
    assert env_list["intake.deny_offerers"] == (alice.peer_id, bob.peer_id)


def test_executor_settings_reach_the_policy_and_the_pool_fits_the_ceilings() -> None:
    flags = {
        "executor.concurrency": ("6", "--concurrency"),
        "limits.max_memory_mb": ("64", "--max-memory-mb"),
        "limits.max_cpus": ("0.25", "--max-cpus"),
        "limits.max_timeout_ms": ("2000", "--max-timeout-ms"),
    }
    policy = node_settings(resolve(flags, environ={})).executor_policy
    assert (policy.max_concurrent, policy.max_memory_mb, policy.max_cpus, policy.max_timeout_ms) == (6, 64, 0.25, 2000)
    assert policy.pool_limits == policy.clamp(policy.pool_limits)


def test_legacy_variables_still_work() -> None:
    resolved = resolve({}, environ={"SANDBOX_MODE": "none", "SANDBOX_SECCOMP_PROFILE": "/etc/p.json"})
    assert resolved["node.sandbox_mode"] == "none" and str(resolved.sources["node.sandbox_mode"]) == "env SANDBOX_MODE"
    assert resolved["executor.seccomp_profile"] == Path("/etc/p.json")


def test_an_empty_variable_counts_as_unset() -> None:
    assert resolve({}, environ={"EDGECODER_CONCURRENCY": "  "}).sources["executor.concurrency"].kind == "default"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[executor]\nconcurrency = 0\n", "executor.concurrency from file"),
        ("[executor]\nconcurrency = 1.5\n", "1.5 is a float"),
        ("[executor]\nconcurrency = true\n", "True is a boolean"),
        ('[node]\nrelay_service = "yes"\n', "node.relay_service"),
        ('[node]\nmdns = "sometimes"\n', 'true, false or "auto"'),
        ('[node]\nlisten = "/ip4/127.0.0.1/udp/1"\n', "must be /ip4/ADDR/tcp/PORT"),
        ("[node]\nbootstrap = [1]\n", "item 1"),
        ("[intake]\nlanguages = []\n", "intake.languages"),
        ("[intake]\nqueue_size = 4\nqueue_per_offerer = 5\n", "it must be 1 to 4"),
        ('[metrics]\nbind = "9464"\n', "HOST:PORT"),
        ('[coordinator]\nkey = "12D3KooWnope"\n', "coordinator.key"),
        ('[coordinator]\nurl = "http://x/?a=1"\n', "query or fragment"),
        ("[nodes]\nlisten = []\n", "did you mean"),
        ("listen = []\n", "must be a [section]"),
    ],
)
def test_bad_file_values_name_the_key_and_what_it_must_be(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        resolve({}, config=write(tmp_path, text), environ={})
    assert words in str(info.value)


# queue_per_offerer is also bounded by queue_size: test_bad_file_values_name_the_key_and_what_it_must_be has it.
RANGED = [s for s in SETTINGS if isinstance(s.kind, IntRange | FloatRange) and s.key != "intake.queue_per_offerer"]


@pytest.mark.parametrize("setting", RANGED, ids=[s.key for s in RANGED])
@given(data=st.data())
def test_a_number_is_kept_exactly_or_refused_never_clamped(setting: Setting, data: st.DataObject) -> None:
    kind = setting.kind
    assert isinstance(kind, IntRange | FloatRange)
    value: float
    if isinstance(kind, IntRange):
        value = data.draw(st.integers(kind.low - 1000, kind.high + 1000))
    else:
        value = data.draw(st.floats(kind.low - 10, kind.high + 10, allow_nan=False))
    inside = kind.low <= value <= kind.high
    for source in ("flag", "env"):
        flags = {setting.key: (repr(value), "--x")} if source == "flag" else {}
        env = {setting.env_names[0]: repr(value)} if source == "env" else {}
        if inside:
            assert resolve(flags, environ=env)[setting.key] == value
        else:
            with pytest.raises(ConfigError) as info:
                resolve(flags, environ=env)
            assert setting.key in str(info.value) and "out of range" in str(info.value)
            assert kind.describe() in str(info.value)


def test_the_config_reference_and_the_example_file_are_generated_from_the_table() -> None:
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    check = subprocess.run(
        [sys.executable, str(root / "scripts" / "gen_reference.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    reference = (root / "docs" / "reference" / "config.md").read_text()
    assert all(f"`{key}`" in reference for key in BY_KEY)


def test_the_example_file_is_valid_with_every_key_uncommented(tmp_path: Path) -> None:
    """Uncommenting the example's defaults gives a file the node accepts, with the defaults' values."""
    root = Path(__file__).parent.parent
    lines = []
    for line in (root / "edgecoder.toml.example").read_text().splitlines():
        if line.startswith("# ") and " = " in line and "(unset" not in line:
            lines.append(line.removeprefix("# "))
        elif line.startswith("["):
            lines.append(line)
    resolved = resolve({}, config=write(tmp_path, "\n".join(lines) + "\n"), environ={})
    for key, value, source in resolved.rows():
        assert value == BY_KEY[key].default or (isinstance(value, tuple) and list(value) == list(BY_KEY[key].default))
        assert source.kind in ("file", "default")
