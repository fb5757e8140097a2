"""Registering runsc with dockerd: the `runtimes` entries of daemon.json, merged into whatever the file holds.

    python -m executor.backends.registration [--daemon-json /etc/docker/daemon.json]

Why daemon.json and not `dockerd --add-runtime runsc=/usr/bin/runsc`: the flag takes a name and a path only, and
the gVisor tier needs runtime arguments (`--platform=systrap --network=none --oci-seccomp`,
executor/backends/gvisor.py), which only the file can carry (`runtimeArgs`). The same file serves both cases of
scripts/setup.sh: a dockerd it starts itself reads it at start; a running daemon reads it on a reload (SIGHUP:
`runtimes` is one of the settings dockerd reloads without a restart).

Two entries: `runsc`, the gVisor tier's, and `runsc-ptrace`, the same binary on the ptrace platform, which only
benchmarks/bench_isolation.py names (its side-by-side figures). The merge keeps every other key. The `runsc` entry
that setup.sh wrote before systrap (`--platform=ptrace`, the only platform of bookworm's own runsc) is replaced;
any other existing entry with other arguments is left alone (it is the operator's) and reported: the gVisor tier's
health check says what it lacks, and the canary reads the platform it really runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from executor.backends.gvisor import PTRACE_ARGS, PTRACE_RUNTIME, REQUIRED_ARGS, RUNSC_PATH, RUNTIME, RUNTIME_ARGS

DAEMON_JSON = Path("/etc/docker/daemon.json")
DOCKERD_PIDFILE = Path("/var/run/docker.pid")  # dockerd's default --pidfile, which start-dockerd.sh keeps
Verdict = Literal["added", "updated", "present", "conflict"]


def entry() -> dict[str, Any]:
    """The gVisor tier's registration."""
    return {"path": RUNSC_PATH, "runtimeArgs": list(RUNTIME_ARGS)}


def ptrace_entry() -> dict[str, Any]:
    """The comparison registration of benchmarks/bench_isolation.py."""
    return {"path": RUNSC_PATH, "runtimeArgs": list(PTRACE_ARGS)}


def merged(config: dict[str, Any]) -> tuple[dict[str, Any], Verdict]:
    """`config` with both runsc runtimes registered, and what was done to the tier's entry: added, updated (setup's
    ptrace entry of before), already present, or a conflicting entry of the operator's left as it is."""
    runtimes = config.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise ValueError(f"'runtimes' in daemon.json is {type(runtimes).__name__}, not an object")
    new = dict(runtimes or {})
    existing = new.get(RUNTIME)
    if existing is None:
        verdict: Verdict = "added"
        new[RUNTIME] = entry()
    elif existing == ptrace_entry():
        verdict = "updated"
        new[RUNTIME] = entry()
    else:
        args = (existing.get("runtimeArgs") or []) if isinstance(existing, dict) else []
        ok = isinstance(existing, dict) and all(arg in args for arg in REQUIRED_ARGS)
        verdict = "present" if ok else "conflict"
    new.setdefault(PTRACE_RUNTIME, ptrace_entry())
    if new == (runtimes or {}) and runtimes is not None:
        return config, verdict
    return {**config, "runtimes": new}, verdict


def register(path: Path) -> Verdict:
    """Merge the runsc runtimes into the daemon.json at `path` (created if absent), atomically."""
    try:
        config = json.loads(path.read_text()) if path.exists() else {}
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}): fix it by hand, nothing was changed") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object: nothing was changed")
    new, verdict = merged(config)
    if new != config or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".daemon.json.")
        with os.fdopen(handle, "w") as out:
            json.dump(new, out, indent=2)
            out.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    return verdict


def setup_daemon_pid(path: Path, pidfile: Path = DOCKERD_PIDFILE) -> int | None:
    """The pid of the running dockerd when scripts/start-dockerd.sh started it on `path` (it runs
    `dockerd --config-file <path>`), else None: a daemon of the operator's is never signalled."""
    try:
        pid = int(pidfile.read_text().strip())
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except (OSError, ValueError):
        return None
    if Path(argv[0]).name != "dockerd" or "--config-file" not in argv[:-1]:
        return None
    given = Path(argv[argv.index("--config-file") + 1])
    return pid if given.resolve() == path.resolve() else None


def reload_setup_daemon(path: Path, *, timeout: float = 20.0) -> str:
    """Bring the running daemon's runsc runtimes in line with `path`: nothing when they are, a reload (SIGHUP,
    which re-reads `runtimes` without a restart) when setup started that daemon, else a note for the operator."""
    import docker

    wanted = {name: spec for name, spec in (json.loads(path.read_text()).get("runtimes") or {}).items()}
    wanted = {name: wanted[name] for name in (RUNTIME, PTRACE_RUNTIME) if name in wanted}

    def current() -> dict[str, Any]:
        with docker.APIClient(**docker.utils.kwargs_from_env(), timeout=10) as api:
            runtimes = api.info().get("Runtimes") or {}
        return {name: runtimes.get(name) for name in wanted}

    if current() == wanted:
        return f"the running dockerd has the runsc runtimes of {path}"
    pid = setup_daemon_pid(path)
    if pid is None:
        return (
            f"the running dockerd lacks the runsc runtimes of {path} and was not started by scripts/setup.sh: reload "
            "it to read them (runtimes reload without a restart: kill -HUP <dockerd pid>, or systemctl reload "
            "docker). Until then gVisor tests skip (or fail under EDGECODER_REQUIRE_GVISOR=1)."
        )
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while (seen := current()) != wanted:
        if time.monotonic() > deadline:
            return f"reloaded dockerd (pid {pid}), but after {timeout:g} s it still has {seen}; see its log"
        time.sleep(0.1)
    return f"reloaded dockerd (pid {pid}, started by setup on {path}): it now has {sorted(wanted)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m executor.backends.registration", description=__doc__)
    parser.add_argument("--daemon-json", type=Path, default=DAEMON_JSON)
    parser.add_argument(
        "--reload-setup-daemon",
        action="store_true",
        help="then bring the running dockerd in line: SIGHUP when scripts/start-dockerd.sh started it on that file",
    )
    args = parser.parse_args(argv)
    try:
        verdict = register(args.daemon_json)
    except (OSError, ValueError) as exc:
        print(f"cannot register runsc in {args.daemon_json}: {exc}", file=sys.stderr)
        return 1
    said = {
        "added": f"registered {RUNTIME} ({RUNSC_PATH} {' '.join(RUNTIME_ARGS)}) in {args.daemon_json}",
        "updated": f"{RUNTIME} in {args.daemon_json} now has {' '.join(RUNTIME_ARGS)} (was {' '.join(PTRACE_ARGS)})",
        "present": f"{RUNTIME} is already registered in {args.daemon_json}",
        "conflict": (
            f"{args.daemon_json} registers {RUNTIME} without {' '.join(REQUIRED_ARGS)}; left as it is: the gVisor "
            f"tier needs runtimeArgs {list(RUNTIME_ARGS)}"
        ),
    }[verdict]
    print(said)
    if args.reload_setup_daemon:
        print(reload_setup_daemon(args.daemon_json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
