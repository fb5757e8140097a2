"""Registering runsc with dockerd: the `runtimes` entry of daemon.json, merged into whatever the file holds.

    python -m executor.backends.registration [--daemon-json /etc/docker/daemon.json]

Why daemon.json and not `dockerd --add-runtime runsc=/usr/bin/runsc`: the flag takes a name and a path only, and
the gVisor tier needs runtime arguments (`--network=none --oci-seccomp`, executor/backends/gvisor.py), which only
the file can carry (`runtimeArgs`). The same file serves both cases of scripts/setup.sh: a dockerd it starts itself
reads it at start; a daemon it did not start reads it on its next reload (SIGHUP: `runtimes` is one of the
settings dockerd reloads without a restart), which the operator does, never setup.sh.

The merge keeps every other key. An existing `runsc` entry with other arguments is left alone (it is the
operator's) and reported: the gVisor tier's health check says what it lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from executor.backends.gvisor import REQUIRED_ARGS, RUNSC_PATH, RUNTIME, RUNTIME_ARGS

DAEMON_JSON = Path("/etc/docker/daemon.json")
Verdict = Literal["added", "present", "conflict"]


def entry() -> dict[str, Any]:
    return {"path": RUNSC_PATH, "runtimeArgs": list(RUNTIME_ARGS)}


def merged(config: dict[str, Any]) -> tuple[dict[str, Any], Verdict]:
    """`config` with the runsc runtime registered, and what was done: added, already present, or a conflicting
    entry of the operator's left as it is."""
    runtimes = config.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise ValueError(f"'runtimes' in daemon.json is {type(runtimes).__name__}, not an object")
    existing = (runtimes or {}).get(RUNTIME)
    if existing is not None:
        args = (existing.get("runtimeArgs") or []) if isinstance(existing, dict) else []
        ok = isinstance(existing, dict) and all(arg in args for arg in REQUIRED_ARGS)
        return config, "present" if ok else "conflict"
    return {**config, "runtimes": {**(runtimes or {}), RUNTIME: entry()}}, "added"


def register(path: Path) -> Verdict:
    """Merge the runsc runtime into the daemon.json at `path` (created if absent), atomically."""
    try:
        config = json.loads(path.read_text()) if path.exists() else {}
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc}): fix it by hand, nothing was changed") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds {type(config).__name__}, not a JSON object: nothing was changed")
    new, verdict = merged(config)
    if verdict == "added":
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".daemon.json.")
        with os.fdopen(handle, "w") as out:
            json.dump(new, out, indent=2)
            out.write("\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m executor.backends.registration", description=__doc__)
    parser.add_argument("--daemon-json", type=Path, default=DAEMON_JSON)
    args = parser.parse_args(argv)
    try:
        verdict = register(args.daemon_json)
    except (OSError, ValueError) as exc:
        print(f"cannot register runsc in {args.daemon_json}: {exc}", file=sys.stderr)
        return 1
    said = {
        "added": f"registered {RUNTIME} ({RUNSC_PATH} {' '.join(RUNTIME_ARGS)}) in {args.daemon_json}",
        "present": f"{RUNTIME} is already registered in {args.daemon_json}",
        "conflict": (
            f"{args.daemon_json} registers {RUNTIME} without {' '.join(REQUIRED_ARGS)}; left as it is: the gVisor "
            f"tier needs runtimeArgs {list(RUNTIME_ARGS)}"
        ),
    }[verdict]
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
