"""A second dockerd of the test's own, on its own socket, for daemon configurations the shared one must not get.

The machine's dockerd is shared and never restarted by tests. A private daemon is started the way scripts/setup.sh
starts one (scripts/start-dockerd.sh: runsc registered in its daemon.json), with its own socket, data root, exec root
and pid file, no bridge and no iptables rules. `hide_controllers` starts it in a mount namespace of its own where
those cgroup v1 hierarchies are unmounted: the daemon then cannot enforce their limits, as on a kernel without the
controller, and says so only in a create warning. The sandbox image is imported from the cached root file system
(executor/images.py), so no registry and no network is needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from executor.images import ROOTFS_TARBALL, build_image, cache_dir
from executor.policy import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parent.parent
START = ROOT / "scripts" / "start-dockerd.sh"


def private_dockerd_problem() -> str | None:
    """Why a private daemon cannot be started here, or None."""
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    for tool in ("dockerd", "unshare", "docker"):
        if shutil.which(tool) is None:
            return f"a private dockerd needs {tool} on PATH"
    if not (cache_dir() / ROOTFS_TARBALL).is_file():
        return f"no cached root file system {cache_dir() / ROOTFS_TARBALL} to import (run `edgecoder image build`)"
    return None


@dataclass
class PrivateDockerd:
    root: Path
    pid: int

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def daemon_json(self) -> Path:
        return self.root / "daemon.json"

    def api(self) -> docker.APIClient:
        return docker.APIClient(base_url=self.base_url, timeout=30)

    def reload(self, config: dict[str, Any]) -> None:
        """Write `config` as its daemon.json and have it reload (SIGHUP: runtimes reload without a restart)."""
        self.daemon_json.write_text(json.dumps(config))
        with self.api() as api:
            before = api.info()["Runtimes"]
            os.kill(self.pid, signal.SIGHUP)
            deadline = time.monotonic() + 20
            while api.info()["Runtimes"] == before and time.monotonic() < deadline:
                time.sleep(0.05)  # dockerd reloads in its own time; its `info` says when it has


@contextlib.contextmanager
def private_dockerd(
    *, daemon_json: dict[str, Any] | None = None, hide_controllers: tuple[str, ...] = ()
) -> Iterator[PrivateDockerd]:
    """A running private dockerd with the sandbox image, stopped and removed on exit."""
    # A short path: containerd's socket under the exec root must fit in a unix socket address (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="ecd-", dir="/tmp"))
    (root / "daemon.json").write_text(json.dumps(daemon_json or {}))
    command = [str(START), *_arguments(root)]
    if hide_controllers:
        unmount = " && ".join(f"umount /sys/fs/cgroup/{c}" for c in hide_controllers)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{unmount} && exec "$@"', "sh"]
        command += [str(START), *_arguments(root)]
    started = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"the private dockerd did not start: {started.stderr.strip()[-2000:]}")
    daemon = PrivateDockerd(root, int(started.stdout.split()[-1]))
    try:
        with daemon.api() as api:
            build_image(DEFAULT_IMAGE, progress=lambda _line: None, client=api)
        yield daemon
    finally:
        _stop(daemon)


def _arguments(root: Path) -> list[str]:
    """start-dockerd.sh's: the daemon.json, the log, and a daemon of its own in every respect."""
    return [
        str(root / "daemon.json"),
        str(root / "dockerd.log"),
        "--host",
        f"unix://{root / 'docker.sock'}",
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--pidfile",
        str(root / "docker.pid"),
        "--bridge",
        "none",
        "--iptables=false",
        "--ip-masq=false",
    ]


def _stop(daemon: PrivateDockerd) -> None:
    """SIGTERM to our own dockerd (by its pid), then its directories. It takes its containerd with it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{daemon.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if Path(f"/proc/{daemon.pid}").exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(daemon.pid, signal.SIGKILL)
    shutil.rmtree(daemon.root, ignore_errors=True)
