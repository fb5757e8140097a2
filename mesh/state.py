"""A node's state directory: one per identity, locked while the node runs.

    <state root>/<PeerID>/node.lock      flock held for the node's lifetime; holds the owner's pid
    <state root>/<PeerID>/replay         the replay memory's journal (see `mesh.replay`)
    <state root>/<PeerID>/offerers       the offerers this node has served (see `mesh.standing`)

The lock is what keeps a second node with the same key from starting: it would share the first one's PeerID (peers
could not tell them apart) and its container label (its start-up sweep would delete the first node's containers).
The root is `$EDGECODER_STATE_DIR`, else `$XDG_STATE_HOME/edgecoder`, else `~/.local/state/edgecoder`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class StateDirError(Exception):
    """The state directory cannot be used; the message says why and what to do."""


def default_state_root(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("EDGECODER_STATE_DIR"):
        return Path(env["EDGECODER_STATE_DIR"])
    base = Path(env["XDG_STATE_HOME"]) if env.get("XDG_STATE_HOME") else Path.home() / ".local" / "state"
    return base / "edgecoder"


@dataclass(frozen=True, slots=True)
class StateDir:
    path: Path

    @property
    def replay_journal(self) -> Path:
        return self.path / "replay"

    @property
    def standing_journal(self) -> Path:
        return self.path / "offerers"

    @classmethod
    @contextlib.contextmanager
    def locked(cls, root: Path, peer_id: str) -> Iterator[StateDir]:
        path = root / peer_id
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path / "node.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateDirError(f"cannot use state directory {path}: {exc.strerror}; set --state-dir") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                raise StateDirError(
                    f"another node is already running with this key (PeerID {peer_id}, pid {owner}); "
                    "stop it first, or give this node its own key (edgecoder keygen)"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield cls(path)
        finally:
            os.close(fd)  # closing releases the lock
