"""Latency of a trivial Python task: warm pool vs cold SDK container vs `docker run --rm` (CLI baseline).

    .venv/bin/python benchmarks/bench_executor.py [--runs 30]

Only this benchmark shells out to the docker CLI, as the comparison baseline; product code never does.
Both executor figures are measured the way the node sees them: `Executor.run_code` returning a result, in
steady state (pool refilled and the previous container removed between runs, as between offers), so the warm
figure measures a pool hit, not a refill race.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import trio
from cli_baseline import (  # benchmarks/ is the script's directory
    CODE,
    EXPECTED,
    INPUT,
    bench_cli,
    percentiles,
    print_figures,
)

from executor.contract import ExecRequest
from executor.policy import ExecutorPolicy
from executor.runner import Executor

TASK = ExecRequest("python", CODE, INPUT)


async def bench_executor(policy: ExecutorPolicy, runs: int, pooled: bool) -> list[float]:
    samples = []
    label = f"bench-{'warm' if pooled else 'cold'}"
    async with Executor.open(policy, node_label=label, pool_size=2 if pooled else 0) as ex:
        for _ in range(runs):
            with trio.fail_after(30):
                # Steady state between offers: pool refilled, the previous container's removal finished.
                while ex.stats().pool_ready < ex.stats().pool_size or ex.stats().pending_removals:
                    await trio.sleep(0.01)
            began = time.perf_counter()
            result = await ex.run_code(TASK)
            samples.append(time.perf_counter() - began)
            assert result.ok and result.stdout == EXPECTED, result
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    policy = replace(ExecutorPolicy.from_env(), subset_check=True)
    warm = trio.run(bench_executor, policy, args.runs, True)
    cold = trio.run(bench_executor, policy, args.runs, False)
    cli = bench_cli(policy, args.runs)
    figures = {"warm pool": percentiles(warm), "cold SDK": percentiles(cold), "docker run --rm": percentiles(cli)}
    print(f"trivial Python task, {args.runs} runs each")
    print_figures(figures)
    warm_p50 = figures["warm pool"][0]
    print(f"cold / warm p50: {figures['cold SDK'][0] / warm_p50:.1f}x")
    print(f"CLI / warm p50:  {figures['docker run --rm'][0] / warm_p50:.1f}x")
    print(f"targets: warm p50 <= 50 ms: {warm_p50 <= 50}; >= 6x faster than CLI: "
          f"{figures['docker run --rm'][0] / warm_p50 >= 6}")  # fmt: skip


if __name__ == "__main__":
    main()
