"""What a flood of fresh keys makes a coordinator hold: its RSS, its SQLite files and the Python heap, by phase.

    .venv/bin/python benchmarks/coordinator_growth.py [--keys 150] [--top 12]

The coordinator runs in this process (the real app on Hypercorn's trio worker, on loopback) with `tracemalloc`
tracing; the load comes from a subprocess of this script (`--load`), so the client's allocations are not counted.
Each phase is one kind of fresh-key traffic, run by `--keys` keys, each as fast as its own budget lets it:

- agents: each key registers and then pulls until refused (its per-agent burst), at most `PER_KEY` times;
- small offers, big offers: each key enqueues offers (trivial ones; then the largest the coordinator takes, 250 KiB of
  input) until refused, at most `PER_KEY`.

Every key runs at once, on a connection of its own.

After each phase it prints the growth of the RSS, of the database and its WAL on disk, and of the traced heap, with
the allocation sites that grew most. The issue's figure (+18.6 MB from 150 fresh keys in 2.6 s) was a process RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from verdict import Verdict  # benchmarks/ is the script's directory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mesh.coordinator.app import Settings  # noqa: E402
from mesh.coordinator.server import run_coordinator  # noqa: E402

PHASES = tuple(os.environ.get("GROWTH_PHASES", "agents,small offers,big offers").split(","))
# Requests a key makes at most (its burst is 20): a key the coordinator keeps accepting does not go on forever.
PER_KEY = 25


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def file_mb(path: Path) -> float:
    try:
        return path.stat().st_size / 1e6
    except FileNotFoundError:
        return 0.0


# -- the load, in a process of its own ----------------------------------------------------------------------------


def load(url: str, phase: str, keys: int) -> dict[str, Any]:
    """Every key at once, each on a connection of its own, until the coordinator refuses it."""
    import httpx

    from transports.wire import agent_requests as signing
    from transports.wire.identity import NodeIdentity
    from transports.wire.offers import TaskOffer

    counts: Counter[str] = Counter()

    async def one_key() -> None:
        identity = NodeIdentity.generate()
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def signed(path: str, body: dict[str, Any]) -> httpx.Response:
                raw = json.dumps(body).encode()
                return await http.post(path, content=raw, headers=signing.sign_request(identity, "POST", path, raw))

            if phase == "agents":
                answer = await signed("/agents/register", {"sandboxMode": "docker"})
                counts[f"register {answer.status_code}"] += 1
            for _ in range(PER_KEY):
                if phase == "agents":
                    answer = await signed("/pull", {"sandboxMode": "docker"})
                else:
                    size = 250 * 1024 if phase == "big offers" else 0
                    offer = TaskOffer.create(identity, language="python", code="print(1)", input="x" * size)
                    answer = await http.post("/tasks", content=offer.sign(identity))
                counts[str(answer.status_code)] += 1
                if answer.status_code >= 300:
                    return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(keys):
                nursery.start_soon(one_key)

    began = time.monotonic()
    trio.run(main)
    return {**counts, "seconds": round(time.monotonic() - began, 1)}


# -- the coordinator, traced --------------------------------------------------------------------------------------


async def measure(keys: int, top: int, settings: Settings, verdict: Verdict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "coordinator.sqlite"
        async with trio.open_nursery() as nursery:
            url = await nursery.start(run_coordinator, db, "127.0.0.1", 0, settings)
            await trio.sleep(0.2)
            gc.collect()
            print(f"coordinator on {url}; {keys} fresh keys a phase; RSS {rss_mb():.1f} MB")
            for phase in PHASES:
                gc.collect()
                before = tracemalloc.take_snapshot()
                tracemalloc.reset_peak()
                rss_before, db_before, wal_before = rss_mb(), file_mb(db), file_mb(db.with_name(db.name + "-wal"))
                command = [sys.executable, __file__, "--load", url, phase, str(keys)]
                done = await trio.run_process(command, capture_stdout=True)
                counts = json.loads(done.stdout.decode().strip().splitlines()[-1])
                # A phase the coordinator refused outright measured its refusals, not what fresh keys make it hold.
                accepted = sum(n for k, n in counts.items() if k != "seconds" and k.split()[-1].startswith("2"))
                verdict.require(accepted > 0, f"{phase}: the coordinator accepted nothing ({counts})")
                _, peak = tracemalloc.get_traced_memory()
                gc.collect()
                after = tracemalloc.take_snapshot()
                wal_after = file_mb(db.with_name(db.name + "-wal"))
                print(
                    f"\n{phase}: {counts} | RSS {rss_before:.1f} -> {rss_mb():.1f} MB | db {db_before:.1f} -> "
                    f"{file_mb(db):.1f} MB, wal {wal_before:.1f} -> {wal_after:.1f} MB"
                )
                stats = after.compare_to(before, "lineno")
                traced = sum(s.size_diff for s in stats)
                print(f"  traced heap {traced / 1e6:+.2f} MB (peak {peak / 1e6:.1f} MB); the sites that grew most:")
                for stat in stats[:top]:
                    frame = stat.traceback[0]
                    where = f"{Path(frame.filename).name}:{frame.lineno}"
                    print(f"  {stat.size_diff / 1e6:+8.2f} MB {stat.count_diff:+8d} blocks  {where}")
            nursery.cancel_scope.cancel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=150)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--load", nargs=3, metavar=("URL", "PHASE", "KEYS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        url, phase, keys = args.load
        print(json.dumps(load(url, phase, int(keys))), flush=True)
        return 0
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tracemalloc.start(1)
    verdict = Verdict()
    trio.run(measure, args.keys, args.top, Settings(), verdict)
    return verdict.finish()  # no target: tests/test_coordinator_growth.py holds the bounds


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
