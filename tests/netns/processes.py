"""Real `edgecoder` processes inside a topology's namespaces: started, waited for by their JSON events, stopped.

- stdout carries the CLI's machine-readable JSON lines (`ready`, later `addrs`, `stopped`, a result). A reader thread
  collects them with their arrival time, so a test waits for an event (readiness), never sleeps.
- stderr goes to a file beside the test's other artefacts; a failure message quotes its tail.
- Every process registers its stop with the topology: SIGTERM, then SIGKILL after a grace, always.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.netns.topology import Namespace, in_ns, parse_proc_net_tcp
from transports.wire.identity import NodeIdentity

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mesh.cli"]
DEFAULT_PORT = 4001
READY_TIMEOUT = 60.0  # a node opens its executor (a warm sandbox pool) before it says ready
STOP_GRACE = 20.0


class ProcessFailed(AssertionError):
    """A process exited or said nothing in time. The message carries its stderr's tail."""


def make_key(path: Path) -> Path:
    """A node identity file (mode 0600), as `edgecoder keygen` writes it."""
    NodeIdentity.generate().save(path)
    return path


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Event:
    data: dict[str, Any]
    at: float  # time.monotonic() when the line arrived


class NetnsProcess:
    """A program running inside `where`'s namespace, with its stdout events and its stderr file."""

    def __init__(
        self,
        where: Namespace,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.where = where
        self.name = name or where.name
        self.argv = list(argv)
        self.log_path = log_path
        self._events: list[Event] = []
        self._other_stdout: list[str] = []
        self._changed = threading.Condition()
        self._stdout_closed = False
        full_env = {**os.environ, **(env or {})}
        self.started_at = time.monotonic()
        with open(log_path, "w") as stderr:
            self.popen = subprocess.Popen(
                in_ns(where.ns, *argv),
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=full_env,
                cwd=REPO,
            )
        self._reader = threading.Thread(target=self._read_stdout, name=f"stdout-{self.name}", daemon=True)
        self._reader.start()
        where.topology.processes.append(self)
        where.topology.on_close(self.stop)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.popen.pid}>"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        with self.popen.stdout as stdout:  # the only reader: closed at its end of file
            for line in stdout:
                now = time.monotonic()
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    data = None
                with self._changed:
                    if isinstance(data, dict):
                        self._events.append(Event(data, now))
                    else:
                        self._other_stdout.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._stdout_closed = True
            self._changed.notify_all()

    @property
    def events(self) -> list[Event]:
        with self._changed:
            return list(self._events)

    def stderr(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def failure(self, what: str) -> ProcessFailed:
        code = self.popen.poll()
        state = "still running" if code is None else f"exited {code}"
        return ProcessFailed(f"{self.name} ({state}): {what}\n--- stderr tail ({self.log_path}) ---\n"
                             f"{tail(self.stderr())}")  # fmt: skip

    def wait_event(self, match: Callable[[dict[str, Any]], bool] | str, *, timeout: float, after: int = 0) -> Event:
        """The first stdout event (from index `after` on) that matches: an `event` name or a predicate."""
        test = (lambda e: e.get("event") == match) if isinstance(match, str) else match
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self._events[after:]:
                    if test(event.data):
                        return event
                left = deadline - time.monotonic()
                if self._stdout_closed:
                    break
                if left <= 0:
                    raise self.failure(f"no stdout event matching {match!r} within {timeout:g} s")
                self._changed.wait(left)
        # stdout closed: the process is exiting; wait for its exit code so that the message can say it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        raise self.failure(f"stdout closed with no event matching {match!r}")

    def stop(self, sig: int = signal.SIGTERM, grace: float = STOP_GRACE) -> int:
        """`sig`, then SIGKILL when it has not exited after `grace` seconds. Returns the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._reader.join(timeout=5)
        return self.popen.returncode


class NodeProcess(NetnsProcess):
    """`edgecoder node` listening on this host's own address (never 0.0.0.0, which today is announced verbatim)."""

    def __init__(
        self,
        where: Namespace,
        key: Path,
        *args: str,
        port: int = DEFAULT_PORT,
        listen: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        log_path: Path,
        name: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
        wait: bool = True,
        metrics_port: int | None = 9100,
    ) -> None:
        listens = list(listen) if listen is not None else [f"/ip4/{where.address}/tcp/{port}"]
        argv = [*CLI, "node", "--key", str(key), "--log-json"]
        for maddr in listens:
            argv += ["--listen", maddr]
        # The metrics port is the node's own 127.0.0.1 inside its namespace: no other host can see it.
        self.metrics_port = metrics_port
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port)]
        super().__init__(where, [*argv, *args], log_path=log_path, env=env, name=name)
        self.key = key
        self._args, self._listens, self._env = args, listens, env
        self._ready: Event | None = None
        if wait:
            self.wait_ready(ready_timeout)

    def restart(self, *, wait: bool = True, log_path: Path | None = None) -> NodeProcess:
        """Stop this node (SIGTERM) and start it again with the same key, addresses and arguments: the same PeerID
        on the same port. The new process's stderr goes to `log_path` (default `<old stem>.restarted.log`)."""
        self.stop()
        log = log_path or self.log_path.with_name(f"{self.log_path.stem}.restarted.log")
        return NodeProcess(self.where, self.key, *self._args, listen=self._listens, env=self._env,
                           metrics_port=self.metrics_port, log_path=log, name=self.name, wait=wait)  # fmt: skip

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> Event:
        if self._ready is None:
            self._ready = self.wait_event("ready", timeout=timeout)
        return self._ready

    @property
    def is_ready(self) -> bool:
        return self._ready is not None

    @property
    def ready(self) -> Event:
        if self._ready is None:
            raise self.failure("not ready yet: call wait_ready() first")
        return self._ready

    def established(self) -> list[tuple[str, int, str, int]]:
        """Established TCP connections in this node's namespace, read from its own /proc (no process started)."""
        try:
            return parse_proc_net_tcp(Path(f"/proc/{self.pid}/net/tcp").read_text())
        except FileNotFoundError:
            raise self.failure("exited") from None

    def wait_connected(self, other: Namespace, *, timeout: float = 30.0, poll: float = 0.01) -> float:
        """Poll (every `poll` s) until a TCP connection with one of `other`'s addresses is established; return
        when it was first seen (time.monotonic()). A connection is a libp2p connection only after its handshake:
        compare with the node's own lines (`ready`, later `/status`) for that."""
        theirs = {str(i.address) for i in other.interfaces}
        deadline = time.monotonic() + timeout
        while True:
            if any(remote in theirs for _, _, remote, _ in self.established()):
                return time.monotonic()
            if time.monotonic() > deadline:
                raise self.failure(f"no TCP connection with {other.name} within {timeout:g} s")
            time.sleep(poll)

    @property
    def ready_after_s(self) -> float:
        """From spawn to the `ready` line: Python start, the executor and its pool, listening, and today's `--peer`
        dials (the node connects to each `--peer` before it says ready)."""
        return self.ready.at - self.started_at

    @property
    def peer_id(self) -> str:
        return str(self.ready.data["peerId"])

    @property
    def addrs(self) -> list[str]:
        return [str(a) for a in self.ready.data["addrs"]]

    @property
    def addr(self) -> str:
        return self.addrs[0]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The node's Prometheus samples, read from inside its namespace: {(name, sorted labels): value}."""
        if self.metrics_port is None:
            raise self.failure("started without a metrics port")
        status, body = self.where.http_get("127.0.0.1", self.metrics_port, "/metrics")
        if status != 200:
            raise self.failure(f"/metrics answered {status}")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value (0 when the series does not exist yet)."""
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def logs(self) -> list[dict[str, Any]]:
        """The JSON log records on stderr (`--log-json`); other stderr lines are skipped."""
        records = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return records

    def answered(self) -> list[dict[str, Any]]:
        """The node's "offer answered" records: one per offer it answered (ran, or refused with a signed result)."""
        return [r for r in self.logs() if r.get("event") == "offer answered"]

    def connected_to(self, other: Namespace) -> bool:
        """Whether a TCP connection between this node's host and `other`'s addresses is established now."""
        theirs = {str(i.address) for i in other.interfaces}
        return any(remote in theirs for _, _, remote, _ in self.established())


@dataclass(frozen=True)
class OfferRun:
    returncode: int
    result: dict[str, Any] | None  # the last JSON line on stdout
    stdout: str  # its JSON lines
    stderr: str
    elapsed_s: float  # spawn to exit: Python start, connecting, publishing or sending, the run, the verified result

    def describe(self) -> str:
        return f"exit {self.returncode}, result {self.result}\n--- stderr tail ---\n{tail(self.stderr)}"


class OfferProcess(NetnsProcess):
    """`edgecoder offer` from inside `where`, in the background (say, offers on both sides of a partition at once).
    `args` says where to: `--to MADDR` or `--gossip --peer MADDR`. `finish()` waits for its result."""

    def __init__(
        self,
        where: Namespace,
        key: Path,
        code: Path,
        *args: str,
        log_path: Path,
        language: str = "python",
        input_json: str | None = None,
        env: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        argv = [*CLI, "offer", "--key", str(key), "--language", language, "--code-file", str(code), *args]
        if input_json is not None:
            argv += ["--input", input_json]
        super().__init__(where, argv, log_path=log_path, env=env, name=name or f"offer-{where.name}")

    def finish(self, timeout: float = 120) -> OfferRun:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise self.failure(f"no exit within {timeout:g} s") from None
        self._reader.join(timeout=5)
        events = self.events
        # Timed to the result line's arrival, so a late `finish()` does not count.
        ended = events[-1].at if events else time.monotonic()
        stdout = "\n".join(json.dumps(e.data) for e in events)
        return OfferRun(self.popen.returncode, events[-1].data if events else None, stdout, self.stderr(),
                        ended - self.started_at)  # fmt: skip


def run_offer(
    where: Namespace,
    key: Path,
    code: Path,
    *args: str,
    log_path: Path | None = None,
    timeout: float = 120,
    **options: Any,
) -> OfferRun:
    """An `OfferProcess` to completion. Its stderr is kept in `log_path`, or only in the returned `OfferRun`."""
    with tempfile.TemporaryDirectory(prefix="ecn-offer-") as scratch:
        process = OfferProcess(where, key, code, *args, log_path=log_path or Path(scratch) / "offer.log", **options)
        return process.finish(timeout)


class DelayRelay:
    """A delay relay running in `where`, listening on its address, forwarding to `target` with `delay_ms` each way.

    Dial `relay.multiaddr(node)` instead of `node.addr` to reach the node through it (Noise authenticates the PeerID,
    not the IP, so a relayed dial is a dial of the same node)."""

    def __init__(
        self,
        where: Namespace,
        target: tuple[str, int],
        delay_ms: int,
        *,
        log_path: Path,
        port: int = 0,
        ready_timeout: float = 20.0,
    ) -> None:
        self.where = where
        self.delay_ms = delay_ms
        argv = [sys.executable, "-m", "tests.netns.delay_relay", "--listen", f"{where.address}:{port}",
                "--to", f"{target[0]}:{target[1]}", "--delay-ms", str(delay_ms)]  # fmt: skip
        self.process = NetnsProcess(where, argv, log_path=log_path, name=f"relay-{where.name}")
        ready = self.process.wait_event("ready", timeout=ready_timeout).data
        host, _, port_text = str(ready["listen"]).rpartition(":")
        self.address, self.port = host, int(port_text)

    def multiaddr(self, node_peer_id: str) -> str:
        return f"/ip4/{self.address}/tcp/{self.port}/p2p/{node_peer_id}"

    def stop(self) -> int:
        return self.process.stop()
