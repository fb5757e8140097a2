"""Identity: one seed, the libp2p host key and the signing key at once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mesh.cli import main
from transports.wire.identity import KeyFileError, NodeIdentity, public_key_of_peer_id, verify


def test_keygen_writes_a_0600_seed_and_prints_the_peer_id(tmp_path: Path) -> None:
    out = tmp_path / "node.key"
    result = CliRunner().invoke(main, ["keygen", "--out", str(out)])
    assert result.exit_code == 0, result.output
    peer_id = result.output.strip()
    assert peer_id.startswith("12D3KooW")
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert NodeIdentity.load(out).peer_id == peer_id


def test_keygen_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "node.key"
    runner = CliRunner()
    first = runner.invoke(main, ["keygen", "--out", str(out)]).output.strip()
    again = runner.invoke(main, ["keygen", "--out", str(out)])
    assert again.exit_code != 0 and "--force" in again.output
    assert NodeIdentity.load(out).peer_id == first
    forced = runner.invoke(main, ["keygen", "--out", str(out), "--force"])
    assert forced.exit_code == 0 and forced.output.strip() != first


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (b"\x00" * 31, 0o600, "exactly a 32-byte"),
        (b"\x00" * 64, 0o600, "more than 32"),
        (b"\x00" * 32, 0o644, "loose permissions"),
        (b"\x00" * 32, 0o640, "loose permissions"),
    ],
)
def test_bad_key_files_give_a_clear_error(tmp_path: Path, content: bytes, mode: int, message: str) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match=message):
        NodeIdentity.load(path)


def test_missing_and_unreadable_key_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        NodeIdentity.load(tmp_path / "absent.key")
    with pytest.raises(KeyFileError, match="not a regular file"):
        (tmp_path / "dir.key").mkdir(mode=0o700)
        NodeIdentity.load(tmp_path / "dir.key")


def test_cli_reports_key_errors_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "loose.key"
    path.write_bytes(b"\x01" * 32)
    path.chmod(0o666)
    from mesh.cli import load_identity

    with pytest.raises(Exception) as info:
        load_identity(path)
    assert "chmod 600" in str(info.value)


def test_the_peer_id_is_the_verification_key() -> None:
    identity = NodeIdentity.generate()
    key = public_key_of_peer_id(identity.peer_id)
    assert key == identity.public_key
    assert verify(key, identity.sign(b"m"), b"m")


def test_libp2p_and_cryptography_sign_identically() -> None:
    identity = NodeIdentity.generate()
    keypair = identity.libp2p_keypair()
    assert keypair.private_key.sign(b"hello") == identity.sign(b"hello")


def test_repr_never_shows_the_seed() -> None:
    identity = NodeIdentity(b"\xab" * 32)
    assert "abab" not in repr(identity)
