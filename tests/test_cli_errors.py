"""The CLI as a user meets it: bad input is one line and exit 2, a refusal exit 3, Ctrl-C exit 130, and no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.test_cli_process import CLI, NodeProcess, edgecoder, free_port


def keygen(path: Path) -> Path:
    assert edgecoder("keygen", "--out", str(path)).returncode == 0
    return path


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and words in result.stderr, result.stderr


def test_a_second_node_with_the_same_key_is_refused(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k")
    first = NodeProcess(key)
    try:
        second = edgecoder("node", "--key", str(key), "--listen", "/ip4/127.0.0.1/tcp/0", timeout=60)
        assert_one_line_error(second, 2, "another node is already running with this key")
        assert str(first.process.pid) in second.stderr
    finally:
        first.stop()


def test_a_port_already_in_use_is_refused(tmp_path: Path) -> None:
    port = free_port()
    first = NodeProcess(keygen(tmp_path / "a"), "--listen", f"/ip4/127.0.0.1/tcp/{port}")
    try:
        second = edgecoder(
            "node", "--key", str(keygen(tmp_path / "b")), "--listen", f"/ip4/127.0.0.1/tcp/{port}", timeout=60
        )
        assert_one_line_error(second, 2, f"port {port} on 127.0.0.1 is already in use")
    finally:
        first.stop()


def test_a_dead_bootstrap_peer_does_not_stop_the_node(tmp_path: Path) -> None:
    dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"
    node = NodeProcess(keygen(tmp_path / "k"), "--bootstrap", dead)
    try:
        assert node.ready["event"] == "ready"
    finally:
        assert node.stop() == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--listen", "/ip4/127.0.0.1/udp/4001"], "must be /ip4/ADDR/tcp/PORT"),
        (["--listen", "not-an-address"], "is not a multiaddr"),
        (["--listen", "/ip4/10.255.255.1/tcp/4001"], "is not an address of this machine"),
        (["--bootstrap", "/ip4/127.0.0.1/tcp/4001"], "not a dialable"),
        (["--peer", "127.0.0.1:4001"], "is not a multiaddr"),
    ],
)
def test_bad_node_addresses_are_one_line_errors(tmp_path: Path, args: list[str], words: str) -> None:
    result = edgecoder("node", "--key", str(keygen(tmp_path / "k")), *args, timeout=60)
    assert_one_line_error(result, 2, words)


def test_exec_refuses_a_huge_file_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "huge.py"
    with huge.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB that cost nothing to make, and would take minutes to parse
    # The error names the size limit: the file was judged by its size, before a byte of it was read (reading and
    # parsing it used to take 5 min 40 s and 23 GB; the helper's timeout is only a hang backstop).
    result = edgecoder("exec", "--language", "python", "--code-file", str(huge), "--sandbox", "host")
    assert_one_line_error(result, 2, "the limit is")


@pytest.mark.parametrize("depth", [18, 5000, 60_000])  # 17 nested arrays are as deep as an offer may carry
def test_deeply_nested_input_is_a_one_line_error(tmp_path: Path, depth: int) -> None:
    code = tmp_path / "p.py"
    code.write_text("print(1)")
    nested = "[" * depth + "]" * depth
    result = edgecoder("exec", "--language", "python", "--code-file", str(code), "--sandbox", "host", "--input", nested)
    assert_one_line_error(result, 2, "--input")


def test_an_oversized_offer_is_refused_before_dialling(tmp_path: Path) -> None:
    key = keygen(tmp_path / "k")
    code = tmp_path / "p.py"
    code.write_text("x = 1\n" * 30_000)  # 180,000 characters: more than an offer carries
    unreachable = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"
    result = edgecoder(
        "offer", "--key", str(key), "--to", unreachable, "--language", "python", "--code-file", str(code)
    )
    assert_one_line_error(result, 2, "an offer carries at most")


@pytest.mark.docker
def test_ctrl_c_on_offer_exits_130_and_the_node_stops_the_run(tmp_path: Path) -> None:
    """Ctrl-C sends the offer's signed cancel on its stream: the node counts a cancel, and the run ends."""
    metrics_port = free_port()
    node = NodeProcess(keygen(tmp_path / "node"), "--metrics-port", str(metrics_port))
    code = tmp_path / "sleep.py"
    code.write_text("import time\ntime.sleep(60)\n")

    def metric(name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        line = next(li for li in text.splitlines() if li.startswith(name + " "))
        return float(line.split()[1])

    try:
        offer = subprocess.Popen(
            [*CLI, "offer", "--key", str(keygen(tmp_path / "me")), "--to", node.addr, "--language", "python"]  # noqa: RUF005
            + ["--code-file", str(code), "--timeout-ms", "30000", "--wait-s", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        while metric("edgecoder_runs_in_flight") < 1:
            assert time.monotonic() < deadline and offer.poll() is None, offer.stderr
            time.sleep(0.1)
        offer.send_signal(signal.SIGINT)
        out, err = offer.communicate(timeout=30)
        assert offer.returncode == 130, (out, err)
        assert "Traceback" not in err and "interrupted" in err
        while metric("edgecoder_runs_in_flight") > 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert metric("edgecoder_jobs_cancelled_total") == 1
    finally:
        node.stop()


def test_an_unexpected_error_is_one_line_unless_debug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fault injection into the entry point: whatever escapes a command is one line and exit 1, or, with --debug,
    the traceback a developer needs."""
    from mesh import cli
    from transports.wire.identity import NodeIdentity

    def broken() -> NodeIdentity:
        raise RuntimeError("injected")

    monkeypatch.setattr(NodeIdentity, "generate", broken)
    with pytest.raises(SystemExit) as exit_info:
        cli.run(["keygen", "--out", str(tmp_path / "k")])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected error: RuntimeError: injected" in err and "--debug" in err
    monkeypatch.setattr(cli, "_debug", False)
    with pytest.raises(RuntimeError, match="injected"):
        cli.run(["--debug", "keygen", "--out", str(tmp_path / "k2")])
    monkeypatch.setattr(cli, "_debug", False)

    def broken_in_a_nursery() -> NodeIdentity:
        raise ExceptionGroup("Exceptions from Trio nursery", [ExceptionGroup("inner", [OSError("the link\nwent")])])

    monkeypatch.setattr(NodeIdentity, "generate", broken_in_a_nursery)
    with pytest.raises(SystemExit) as exit_info:
        cli.run(["keygen", "--out", str(tmp_path / "k3")])
    err = capsys.readouterr().err
    # The failure inside the nurseries, on one line, not the nursery's own wording.
    assert err.count("\n") == 1 and "unexpected error: OSError: the link went" in err, err


def test_a_directory_as_key_is_a_one_line_error(tmp_path: Path) -> None:
    assert_one_line_error(edgecoder("node", "--key", str(tmp_path)), 2, "is a directory")
