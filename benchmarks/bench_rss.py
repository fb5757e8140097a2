"""Resident memory of mesh nodes: one idle node in a fresh process, and the cost of each extra node in one process.

    .venv/bin/python benchmarks/bench_rss.py [--settle 12]

Each configuration runs in a fresh Python process (so one measurement's garbage cannot inflate another): it imports
everything a node needs, records that baseline, opens the nodes on loopback (each dialling up to three earlier
ones, as in `simulations/`), lets heartbeats and the GossipSub mesh settle, and reports VmRSS. `none` nodes isolate
the mesh's cost (libp2p host, Noise, yamux, pubsub); one `docker` node adds the executor and its Docker client
(its warm containers' memory is the containers', not this process's, and is not counted here).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

from verdict import Verdict  # benchmarks/ is the script's directory

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = [("none", 1), ("none", 5), ("none", 10), ("docker", 1)]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(mode: str, count: int, settle: float) -> None:
    import structlog
    import trio

    from executor.policy import ExecutorPolicy
    from mesh.node import MeshNode  # noqa: F401  (imported before the baseline: the code is not a node's cost)
    from simulations.cluster import open_cluster  # not simulations.scenario: it imports matplotlib

    if mode == "docker":
        import executor.runner  # noqa: F401

    logging.getLogger().setLevel(logging.ERROR)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    baseline = rss_mb()

    async def run() -> float:
        async with open_cluster(policy=ExecutorPolicy.from_env()) as cluster:
            for _ in range(count):
                await cluster.add("runner" if mode == "docker" else "refuser")
            await trio.sleep(settle)
            return rss_mb()

    print(json.dumps({"baseline_mb": baseline, "rss_mb": trio.run(run)}))


def measure(mode: str, count: int, settle: float) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", mode, str(count), "--settle", str(settle)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, check=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--settle", type=float, default=12.0, help="seconds the nodes run before RSS is read")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.settle)
        return 0
    print(f"RSS after {args.settle:g} s idle; baseline = the same fresh process with everything imported, no node")
    print(f"{'mode':<8}{'nodes':>6}{'baseline MB':>13}{'RSS MB':>9}{'per node MB':>13}")
    one_none = None
    verdict = Verdict()
    for mode, count in CONFIGS:
        figures = measure(mode, count, args.settle)
        per_node = (figures["rss_mb"] - figures["baseline_mb"]) / count
        # A node that holds nothing beyond the bare process did not start: its figure would be a false zero.
        verdict.require(per_node > 0, f"{count} {mode} node(s) added {per_node:.1f} MB to the baseline")
        print(f"{mode:<8}{count:>6}{figures['baseline_mb']:>13.1f}{figures['rss_mb']:>9.1f}{per_node:>13.1f}")
        if mode == "none" and count == 1:
            one_none = figures["rss_mb"]
        elif mode == "none" and one_none is not None:
            print(f"{'':<8}{'':>6}  each node beyond the first: {(figures['rss_mb'] - one_none) / (count - 1):.1f} MB")
    return verdict.finish()  # no target: docs/simulations.md quotes these figures


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: `simulations` is not an installed package
    sys.exit(main())
