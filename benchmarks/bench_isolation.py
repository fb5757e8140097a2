"""What each isolation tier costs, side by side in one run: warm and cold runs of a trivial Python task under runc
and under gVisor, and `docker run --rm` of each as the baseline.

    .venv/bin/python benchmarks/bench_isolation.py [--runs 20]

Needs a daemon with runsc registered (scripts/setup.sh; DOCKER_HOST picks the daemon). The paths are interleaved:
every round runs each path once, in the same order, so a slow moment of a shared machine falls on all of them.
Warm and cold are measured as the node sees them, `Executor.run_code` returning a result, in steady state: every
pool refilled and every removal finished before each run (as between offers), so a warm figure is a pool hit and no
run shares the machine with another tier's refill. The target: warm gVisor p50 within 2x of warm runc.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import trio
from cli_baseline import CODE, EXPECTED, INPUT, bench_cli, percentiles, print_figures  # benchmarks/ is sys.path[0]
from verdict import Verdict

from executor.backends import TIERS, backend_for
from executor.contract import ExecRequest
from executor.policy import ExecutorPolicy
from executor.runner import Executor

TASK = ExecRequest("python", CODE, INPUT)
TARGET = 2.0  # warm gVisor p50 / warm runc p50


async def steady(ex: Executor) -> None:
    with trio.fail_after(60):
        while (s := ex.stats()).pool_ready < s.pool_size or s.pending_removals:
            await trio.sleep(0.01)


async def timed_run(ex: Executor, tier: str) -> float:
    await steady(ex)
    began = time.perf_counter()
    result = await ex.run_code(TASK, min_isolation=tier)
    elapsed = time.perf_counter() - began
    assert result.ok and result.stdout == EXPECTED, result
    return elapsed


async def bench(policy: ExecutorPolicy, runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    both = replace(policy, isolation=TIERS)
    async with (
        Executor.open(both, node_label="bench-isolation-warm", pool_size=2) as warm,
        Executor.open(both, node_label="bench-isolation-cold", pool_size=0) as cold,
    ):
        for ex in (warm, cold):
            for tier in TIERS:
                health = await ex.health(tier)
                assert health.ok, f"{tier}: {health.reason}: {health.detail}"
        paths: dict[str, Callable[[], Coroutine[Any, Any, float]]] = {}
        for tier in TIERS:
            paths[f"warm {tier}"] = lambda tier=tier: timed_run(warm, tier)  # type: ignore[misc]
        for tier in TIERS:
            paths[f"cold {tier}"] = lambda tier=tier: timed_run(cold, tier)  # type: ignore[misc]
        await timed_run(warm, "gvisor")  # the first run of a process pays for what every later one reuses
        for _ in range(runs):
            for name, path in paths.items():
                samples.setdefault(name, []).append(await path())
            for tier in TIERS:
                await steady(warm)
                await steady(cold)
                cli = await trio.to_thread.run_sync(lambda tier=tier: bench_cli(policy, 1, backend_for(tier)))
                samples.setdefault(f"docker run --rm {tier}", []).extend(cli)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    policy = replace(ExecutorPolicy.from_env(), subset_check=True)
    samples = trio.run(bench, policy, args.runs)
    figures = {name: percentiles(values) for name, values in samples.items()}
    print(f"trivial Python task, {args.runs} interleaved rounds, warm pools of 2 per tier")
    print_figures(figures)
    ratio = figures["warm gvisor"][0] / figures["warm runc"][0]
    print(f"warm gVisor / warm runc p50: {ratio:.2f}x")
    print(f"cold gVisor / cold runc p50: {figures['cold gvisor'][0] / figures['cold runc'][0]:.2f}x")
    print(f"cold - warm p50: runc {figures['cold runc'][0] - figures['warm runc'][0]:+.0f} ms, "
          f"gVisor {figures['cold gvisor'][0] - figures['warm gvisor'][0]:+.0f} ms")  # fmt: skip
    # Every run's output was checked as it came, and each tier's health before the runs (else exit 1).
    verdict = Verdict()
    verdict.target("warm gVisor p50 / warm runc p50", ratio, at_most=TARGET, unit="x")
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
