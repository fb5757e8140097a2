"""The bad-input table: every command, fed what a new user gets wrong, answers in one line with the right exit code.

Exit 2 is usage or bad input, 1 a run that failed (here: nobody answered), 3 a typed refusal; no traceback ever.
Each row runs the real entry point (`mesh.cli.run`) in this process, so a row costs milliseconds unless the command
gets as far as opening a node (those rows use `--sandbox-mode none`, which needs no Docker). The processes that
must be separate (Ctrl-C, a second node on one key) are in tests/test_cli_errors.py.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mesh import cli
from transports.wire.identity import NodeIdentity

# A PeerID that is a sha256 multihash (an RSA key's form): it embeds no Ed25519 key, so it cannot sign offers.
RSA_STYLE_PEER_ID = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT")
SOME_PEER_ID = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]
    code: int
    words: str  # part of the message that says what is wrong, or how to fix it
    env: tuple[tuple[str, str], ...] = ()
    stream: str = "err"  # refusals (exit 3) are a JSON line on stdout


def row(*args: str, code: int = 2, words: str, env: dict[str, str] | None = None, stream: str = "err") -> Row:
    return Row(tuple(args), code, words, tuple((env or {}).items()), stream)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Commands configure structlog for the process; later tests in this process must not inherit it."""
    import structlog

    yield
    structlog.reset_defaults()


@pytest.fixture
def place(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The files and ports a row may name, as {placeholders}."""
    key = tmp_path / "node.key"
    NodeIdentity.generate().save(key)
    loose = tmp_path / "loose.key"
    NodeIdentity.generate().save(loose)
    loose.chmod(0o644)
    short = tmp_path / "short.key"
    short.write_bytes(b"\x01" * 31)
    short.chmod(0o600)
    code = tmp_path / "job.py"
    code.write_text("print(1)\n")
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00print(1)")
    huge_code = tmp_path / "huge.py"
    huge_code.write_text("x = 1\n" * 30_000)
    not_dir = tmp_path / "a-file"
    not_dir.write_text("")
    configs = {
        "bad.toml": "[node\nlisten = 1\n",
        "unknown.toml": "[executor]\nconcurency = 4\n",
        "wrongtype.toml": '[executor]\nconcurrency = "four"\n',
        "flat.toml": "concurrency = 4\n",
        "range.toml": "[limits]\nmax_memory_mb = 8\n",
        "port0.toml": '[metrics]\nbind = "127.0.0.1:0"\n',
    }
    for name, text in configs.items():
        (tmp_path / name).write_text(text)
    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
        free.close()
        yield {
            "tmp": str(tmp_path),
            "key": str(key),
            "loose": str(loose),
            "short": str(short),
            "code": str(code),
            "binary": str(binary),
            "huge_code": str(huge_code),
            "not_dir": str(not_dir),
            "busy": str(busy.getsockname()[1]),
            "free": str(free_port),
            "dead_peer": f"/ip4/127.0.0.1/tcp/{free_port}/p2p/{SOME_PEER_ID}",
            "big_input": '{"xs": "' + "a" * 300_000 + '"}',
            "deep_input": "[" * 60 + "]" * 60,
        }


NODE = ("node", "--key", "{key}", "--sandbox-mode", "none", "--state-dir", "{tmp}/state")
OFFER = ("offer", "--key", "{key}", "--language", "python", "--code-file", "{code}")
SUBMIT = ("coordinator", "submit", "--url", "http://127.0.0.1:{free}", "--key", "{key}", "--language", "python")

TABLE = [
    # -- anything ---------------------------------------------------------------------------------------------
    row("nodes", words="No such command 'nodes'"),
    row("node", "--bogus", words="No such option '--bogus'"),
    # -- keygen -----------------------------------------------------------------------------------------------
    row("keygen", words="Missing option '--out'"),
    row("keygen", "--out", "{key}", words="already exists; pass --force"),
    row("keygen", "--out", "{tmp}/no/such/dir/k", words="cannot write"),
    # -- node: the key ------------------------------------------------------------------------------------------
    row("node", "--sandbox-mode", "none", words="no key file: give --key PATH"),
    row("node", "--key", "{tmp}", words="is a directory; give the key file"),
    row("node", "--key", "{loose}", words="chmod 600"),
    row("node", "--key", "{short}", words="exactly a 32-byte Ed25519 seed"),
    row("node", "--key", "{tmp}/missing.key", words="cannot read key file"),
    # -- node: addresses ----------------------------------------------------------------------------------------
    row(*NODE, "--listen", "/ip4/127.0.0.1/udp/4001", words="must be /ip4/ADDR/tcp/PORT"),
    row(*NODE, "--listen", "not-an-address", words="is not a multiaddr"),
    row(*NODE, "--listen", "/ip4/10.255.255.1/tcp/4001", words="is not an address of this machine"),
    row(*NODE, "--listen", "/ip4/127.0.0.1/tcp/{busy}", words="is already in use"),
    row(*NODE, "--bootstrap", "/ip4/127.0.0.1/tcp/4001", words="not a dialable"),
    row(*NODE, "--peer", "127.0.0.1:4001", words="is not a multiaddr"),
    row(*NODE, "--announce", "203.0.113.7:4001", words="node.announce from flag --announce"),
    # -- node: numbers out of range, never clamped ------------------------------------------------------------
    row(*NODE, "--concurrency", "0", words="executor.concurrency from flag --concurrency: 0 is out of range"),
    row(*NODE, "--concurrency", "many", words="a whole number from 1 to 64"),
    row(*NODE, "--queue-size", "0", words="intake.queue_size"),
    row(*NODE, "--queue-per-offerer", "50", words="intake.queue_per_offerer = 50"),
    row(*NODE, "--max-memory-mb", "16", words="limits.max_memory_mb from flag --max-memory-mb: 16 is out of range"),
    row(*NODE, "--max-cpus", "nan", words="limits.max_cpus"),
    row(*NODE, "--max-timeout-ms", "-5", words="limits.max_timeout_ms"),
    row(*NODE, "--heartbeat-interval", "0.5", words="a number from 1 to 300 seconds"),
    row(*NODE, "--pool-size", "100", words="executor.pool_size"),
    # -- node: choices and lists ----------------------------------------------------------------------------------
    row(*NODE, "--isolation", "kata", words="one of runc, gvisor"),
    row(*NODE, "--log-level", "loud", words="log.level"),
    row(*NODE, "--log-format", "xml", words="one of console, json"),
    row(*NODE, "--sandbox-mode", "maybe", words="node.sandbox_mode"),
    row(*NODE, "--language", "cobol", words="is not one of python, javascript"),
    row(*NODE, "--allow-offerer", "alice", words="intake.allow_offerers"),
    row(*NODE, "--deny-offerer", RSA_STYLE_PEER_ID, words="does not embed an Ed25519 public key"),
    # -- node: coordinator and metrics ------------------------------------------------------------------------
    row(*NODE, "--coordinator", "ftp://127.0.0.1:8700", words="is not an http:// or https:// URL"),
    row(*NODE, "--coordinator", "http://", words="names no host"),
    row(*NODE, "--coordinator", "http://127.0.0.1:99999", words="coordinator.url"),
    row(*NODE, "--coordinator-key", "zz", words="neither 64 hex digits nor an Ed25519 PeerID"),
    row(*NODE, "--metrics", "127.0.0.1:99999", words="HOST:PORT with a port from 0 to 65535"),
    row(*NODE, "--metrics-port", "70000", words="70000 is not in the range"),
    row(*NODE, "--metrics-port", "1", "--metrics", "127.0.0.1:2", words="give one of them"),
    row(*NODE, "--metrics-port", "{busy}", words="the port is already in use; pick another --metrics-port"),
    row(*NODE, "--metrics", "10.255.255.1:9464", words="not an address of this machine"),
    # -- node: BLE and state ------------------------------------------------------------------------------------
    row(*NODE, "--ble-hci", "bogus:0", words="node.ble_hci"),
    row(*NODE, "--ble-hci", "usb:0", "--ble-sim", words="two different radios"),
    row("node", "--key", "{key}", "--sandbox-mode", "none", "--state-dir", "{not_dir}", words="cannot use state dir"),
    # -- node: the config file and the environment ----------------------------------------------------------------
    row(*NODE, "--config", "{tmp}/missing.toml", words="does not exist: fix --config or EDGECODER_CONFIG"),
    row(*NODE, "--config", "{tmp}", words="is a directory"),
    row(*NODE, "--config", "{tmp}/bad.toml", words="is not valid TOML"),
    row(*NODE, "--config", "{tmp}/unknown.toml", words="did you mean executor.concurrency?"),
    row(*NODE, "--config", "{tmp}/wrongtype.toml", words="'four' is a string"),
    row(*NODE, "--config", "{tmp}/flat.toml", words="must be a [section]"),
    row(*NODE, "--config", "{tmp}/range.toml", words="limits.max_memory_mb from file"),
    row(*NODE, words="from env EDGECODER_CONFIG", env={"EDGECODER_CONFIG": "{tmp}/missing.toml"}),
    row(*NODE, words="executor.concurrency from env EDGECODER_CONCURRENCY", env={"EDGECODER_CONCURRENCY": "100"}),
    row("node", "--key", "{key}", words="node.sandbox_mode from env SANDBOX_MODE", env={"SANDBOX_MODE": "vm"}),
    # -- offer ----------------------------------------------------------------------------------------------------
    row(*OFFER, words="give exactly one of --to MULTIADDR"),
    row(*OFFER, "--to", "127.0.0.1:4001", words="is not a multiaddr"),
    row(*OFFER, "--gossip", words="--gossip needs at least one --peer"),
    row(*OFFER, "--to", "{dead_peer}", "--peer", "{dead_peer}", words="--peer is for --gossip"),
    row(*OFFER, "--to", "{dead_peer}", "--input", "{{nope", words="--input is not JSON"),
    row(*OFFER, "--to", "{dead_peer}", "--input", "{deep_input}", words="--input"),
    row(*OFFER, "--to", "{dead_peer}", "--input", "{big_input}", words="a node takes at most"),
    row(*OFFER, "--to", "{dead_peer}", "--timeout-ms", "0", words="0 is not in the range"),
    row(*OFFER, "--to", "{dead_peer}", "--sandbox", "vm", words="'vm' is not one of"),
    row(*OFFER, "--ble", words="not supported"),
    row(*OFFER, "--to", "{dead_peer}", "--ble-link-model", "ios", words="give --ble-hci too"),
    row(*OFFER, "--ble-hci", "bogus:0", words="--ble-hci"),
    row(*OFFER, "--to", "{dead_peer}", code=3, words='"refusal":"unreachable"', stream="out"),
    row(
        "offer",
        "--key",
        "{key}",
        "--language",
        "python",
        "--code-file",
        "{huge_code}",
        "--to",
        "{dead_peer}",
        words="an offer carries at most",
    ),
    row(
        "offer",
        "--key",
        "{key}",
        "--language",
        "python",
        "--code-file",
        "{binary}",
        "--to",
        "{dead_peer}",
        words="is not UTF-8 text",
    ),
    row(
        "offer",
        "--key",
        "{key}",
        "--language",
        "cobol",
        "--code-file",
        "{code}",
        "--to",
        "{dead_peer}",
        words="'cobol' is not one of",
    ),
    # -- exec -----------------------------------------------------------------------------------------------------
    row("exec", "--language", "python", "--code-file", "{tmp}/missing.py", words="cannot read"),
    row("exec", "--language", "python", "--code-file", "{code}", "--sandbox", "vm", words="'vm' is not one of"),
    row("exec", "--language", "python", "--code-file", "{code}", "--input", "[1,", words="--input is not JSON"),
    row("exec", "--language", "python", "--code-file", "{code}", "--isolation", "kata", words="'kata' is not one of"),
    row(
        "exec",
        "--language",
        "python",
        "--code-file",
        "{code}",
        "--sandbox",
        "host",
        "--isolation",
        "gvisor",
        words="--sandbox host runs no container",
    ),
    row(
        "exec",
        "--language",
        "python",
        "--code-file",
        "{code}",
        words="unknown isolation tier 'kata'",
        env={"EDGECODER_ISOLATION": "kata"},
    ),
    row("exec", "--code-file", "{code}", words="Missing option '--language'"),
    # -- config show ------------------------------------------------------------------------------------------------
    row("config", "show", "--concurrency", "0", words="executor.concurrency from flag --concurrency"),
    row("config", "show", "--config", "{tmp}/unknown.toml", words="unknown setting executor.concurency"),
    row("config", "bogus", words="No such command 'bogus'"),
    # -- status, peers, jobs --------------------------------------------------------------------------------------
    row("status", "--metrics", "127.0.0.1:{free}", code=1, words="no node answers at http://127.0.0.1:"),
    row("peers", "--metrics", "nowhere", words="is not HOST:PORT"),
    row("jobs", "--metrics", "127.0.0.1:0", words="port 0 is picked at start"),
    row("status", "--config", "{tmp}/port0.toml", words="give --metrics HOST:PORT with the port"),
    row("status", "--config", "{tmp}/missing.toml", words="does not exist"),
    # -- coordinator --------------------------------------------------------------------------------------------
    row("coordinator", words="to serve, give --db FILE and --listen HOST:PORT"),
    row("coordinator", "--db", "{tmp}/c.db", "--listen", "8700", words="expected HOST:PORT"),
    row("coordinator", "--db", "{tmp}/no/such/dir/c.db", "--listen", "127.0.0.1:0", words="does not exist"),
    row("coordinator", "--db", "{tmp}", "--listen", "127.0.0.1:0", words="is a directory"),
    row("coordinator", "--db", "{tmp}/c.db", "--listen", "127.0.0.1:{busy}", words="pick another --listen"),
    row("coordinator", "--db", "{tmp}/c.db", "--listen", "127.0.0.1:0", "--key", "{loose}", words="chmod 600"),
    row("coordinator", "--db", "{tmp}/c.db", "submit", words="give them without a subcommand"),
    row(*SUBMIT, "--code-file", "{code}", code=1, words="no coordinator answers at http://127.0.0.1:"),
    row(
        "coordinator",
        "submit",
        "--url",
        "ftp://x",
        "--key",
        "{key}",
        "--language",
        "python",
        "--code-file",
        "{code}",
        words="--url: 'ftp://x' is not an http:// or https:// URL",
    ),
    row(*SUBMIT, "--code-file", "{tmp}/missing.py", words="cannot read"),
    row(*SUBMIT, "--code-file", "{code}", "--input", "{{", words="--input is not JSON"),
    row(*SUBMIT, "--code-file", "{huge_code}", words="an offer carries at most"),
    row(*SUBMIT, "--code-file", "{code}", "--input", "{big_input}", words="a coordinator takes at most"),
    row(*SUBMIT[:-2], "--code-file", "{code}", words="Missing option '--language'"),
    # -- doctor ---------------------------------------------------------------------------------------------------
    row("doctor", "--config", "{tmp}/unknown.toml", words="did you mean executor.concurrency?"),
    row("doctor", words="node.sandbox_mode from env SANDBOX_MODE", env={"SANDBOX_MODE": "vm"}),
    # -- demo ---------------------------------------------------------------------------------------------------
    row("demo", "--nodes", "1", words="1 is not in the range 2<=x<=16"),
]


def test_the_table_is_large_and_covers_every_command() -> None:
    commands = {r.args[0] if r.args[0] not in ("coordinator", "config") else " ".join(r.args[:2]) for r in TABLE}
    assert len(TABLE) >= 40
    assert {"keygen", "node", "offer", "exec", "status", "peers", "jobs", "demo", "config show"} <= commands
    assert {"coordinator submit"} <= commands


@pytest.mark.parametrize("case", TABLE, ids=[" ".join(r.args)[:70] for r in TABLE])
def test_bad_input_is_one_line_and_the_right_exit_code(
    case: Row, place: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("EDGECODER_") or n.startswith("SANDBOX_")]:
        monkeypatch.delenv(name)
    for name, value in case.env:
        monkeypatch.setenv(name, value.format(**place))
    monkeypatch.setattr(cli, "_debug", False)
    argv = [arg.format(**place) for arg in case.args]
    with pytest.raises(SystemExit) as exit_info:
        cli.run(argv)
    out, err = capsys.readouterr()
    assert exit_info.value.code == case.code, (out, err)
    assert "Traceback" not in err and "Traceback" not in out
    said = out if case.stream == "out" else err
    assert case.words in said, said
    # The node's own log lines (a timestamp first) may come before the refusal; the refusal itself is one line.
    lines = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    if case.code == 3:  # a typed refusal is data: one JSON line on stdout, and nothing alarming on stderr
        assert len([line for line in out.splitlines() if line.strip()]) == 1, out
    else:
        assert len(lines) == 1, err
