"""Who owns a container, and whether that owner is still alive: so that every executor can sweep what a dead one
left, and never touches what a living one (a second node with the same key, say) is using.

Every container carries `edgecoder.owner=<boot id>/<pid namespace>/<pid>/<start time>` of the process whose
executor made it. On this machine's boot, in this pid namespace, the owner is alive exactly when a process with
that pid exists and started at that time (clock ticks since boot, /proc/<pid>/stat field 22), so a recycled pid
is not mistaken for it. An owner elsewhere (another machine on the same daemon, another pid namespace, a
previous boot) cannot be judged from here: its containers are left alone while they run (each one ends by
itself: a waiting pool container when its owner's attach connection closes, a run at its deadline), and removed
once they have been stopped for longer than STOPPED_GRACE_S (a living owner removes its stopped containers within
seconds, after reading their status).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

OWNER_LABEL = "edgecoder.owner"
STOPPED_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class Owner:
    boot_id: str
    pid_namespace: str
    pid: int
    start_ticks: int

    @property
    def label(self) -> str:
        return f"{self.boot_id}/{self.pid_namespace}/{self.pid}/{self.start_ticks}"

    @classmethod
    def parse(cls, label: str | None) -> Owner | None:
        parts = (label or "").split("/")
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            return None
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))

    def alive(self, here: Owner) -> bool | None:
        """True or False when `here` (this process) can tell, None when the owner lives where it cannot see."""
        if (self.boot_id, self.pid_namespace) != (here.boot_id, here.pid_namespace):
            return None
        return _start_ticks(self.pid) == self.start_ticks


def this_process() -> Owner:
    return owner_of(os.getpid())  # by pid: a forked child is an owner of its own


@functools.cache
def owner_of(pid: int) -> Owner:
    start = _start_ticks(pid)
    assert start is not None
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return Owner(boot_id, os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]"), pid, start)


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of the whole line: start time, in clock ticks since boot
