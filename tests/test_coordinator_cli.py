"""The `coordinator` click command's argument handling (serving itself is tested through the real process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mesh.coordinator.cli import coordinator, parse_listen
from transports.wire.identity import NodeIdentity


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:8700", ("127.0.0.1", 8700)), ("[::1]:0", ("::1", 0)), ("localhost:1", ("localhost", 1))],
)
def test_listen_parses(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["8700", "127.0.0.1:", ":8700", "127.0.0.1:99999", "127.0.0.1:http"])
def test_bad_listen_is_a_usage_error(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(coordinator, ["--db", str(tmp_path / "s.db"), "--listen", value])
    assert result.exit_code == 2
    assert "HOST:PORT" in result.output


def test_loose_key_file_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    key = tmp_path / "k"
    NodeIdentity.generate().save(key)
    os.chmod(key, 0o644)
    result = CliRunner().invoke(
        coordinator, ["--db", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0", "--key", str(key)]
    )
    assert result.exit_code == 2  # a key file that cannot be used is bad input, as for every command
    assert "chmod 600" in result.output
    assert not (tmp_path / "s.db").exists()


def test_the_coordinator_table_and_the_nodes_share_no_variable() -> None:
    from mesh.config import SETTINGS
    from mesh.coordinator.settings import COORDINATOR_SETTINGS

    node = {name for s in SETTINGS for name in s.env_names}
    service = {name for s in COORDINATOR_SETTINGS for name in s.env_names}
    assert node.isdisjoint(service)
    assert all(s.flag is not None for s in COORDINATOR_SETTINGS)  # each setting is an option of the command


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["--lease", "0"], {}, "coordinator.lease_s from flag --lease: 0 is out of range"),
        ([], {"EDGECODER_COORDINATOR_LEASE_S": "soon"}, "from env EDGECODER_COORDINATOR_LEASE_S: 'soon' is not a"),
        (["--trusted-offerer", "12D3KooWnope"], {}, "coordinator.trusted_offerers from flag --trusted-offerer"),
    ],
)
def test_a_bad_value_is_refused_with_its_key_and_source(
    tmp_path: Path, args: list[str], env: dict[str, str], words: str
) -> None:
    base = ["--db", str(tmp_path / "s.db"), "--listen", "127.0.0.1:0"]
    result = CliRunner().invoke(coordinator, [*base, *args], env=env)
    assert result.exit_code == 2
    assert words in result.output
    assert not (tmp_path / "s.db").exists()
