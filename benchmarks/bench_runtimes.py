"""Runtimes side by side: warm and cold p50 of `python` and `python-science`, the image build cached, and the memory
of a warm pool holding both (docs/runtimes.md).

    .venv/bin/python benchmarks/bench_runtimes.py [--runs 15]

Rows:
- "python warm" / "python cold": the trivial task (read JSON from stdin, print a sum), as benchmarks/bench_executor.py;
- "python-science warm" / "python-science cold": a numpy matrix product of the JSON input (numpy is imported by the
  parked interpreter on the warm path: executor/images.py's preload).

Warm runs use one executor whose pool budget (2 containers) both runtimes share once both are in use
(executor/budget.py); cold runs an executor without a pool. Rounds alternate the rows, and each sample starts with
the pools full and no removal pending. The cold build is not repeated here (it takes minutes: docs/runtimes.md has
the figure); the cached build is `edgecoder image build --if-missing`'s check, timed. Needs python-science built:
`edgecoder image build --runtime python-science`.

Target: warm python-science p50 within 1.5x of warm python's.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

import docker
import trio
from cli_baseline import CODE, INPUT, percentiles, print_figures  # benchmarks/ is the script's directory
from verdict import Verdict

from executor.container_config import NODE_LABEL
from executor.contract import ExecRequest
from executor.images import runtime_built
from executor.policy import ExecutorPolicy
from executor.runner import Executor
from executor.runtimes import science_runtime

SCIENCE = science_runtime()
MATMUL = """
import json, sys
import numpy as np
a = np.array(json.load(sys.stdin)["a"], dtype=float)
print(float((a @ a.T).sum()))
"""
MATRIX = {"a": [[float(i * 8 + j) for j in range(8)] for i in range(8)]}
ROWS = {
    "python": ExecRequest("python", CODE, INPUT),
    SCIENCE.name: ExecRequest("python", MATMUL, MATRIX),
}


async def quiet(executor: Executor) -> None:
    with trio.fail_after(120):
        while (stats := executor.stats()).pool_ready < stats.pool_size or stats.pending_removals:
            await trio.sleep(0.02)


async def sample(executor: Executor, runtime: str) -> float:
    started = time.perf_counter()
    result = await executor.run_code(ROWS[runtime], runtime=runtime)
    elapsed = time.perf_counter() - started
    if not result.ok:
        raise RuntimeError(f"{runtime}: {result.error_kind}: {result.stderr[-300:]}")
    return elapsed


def pool_memory_mib(label: str) -> dict[str, float]:
    """The memory charged to each runtime's warm containers now (the cgroup's usage, as `docker stats` reads it)."""
    api = docker.APIClient(**docker.utils.kwargs_from_env())
    try:
        usage: dict[str, float] = {}
        for container in api.containers(filters={"label": f"{NODE_LABEL}={label}"}):
            stats = api.stats(container["Id"], stream=False)
            image = container["Image"]
            usage[image] = usage.get(image, 0.0) + stats["memory_stats"].get("usage", 0) / (1 << 20)
        return usage
    finally:
        api.close()


async def main(runs: int) -> int:
    verdict = Verdict()
    policy = ExecutorPolicy(subset_check=False, runtimes=(SCIENCE,), pool_size=2, pool_languages=("python",))
    started = time.perf_counter()
    built = {name: runtime_built(policy.runtime(name)) for name in policy.runtime_names}  # type: ignore[arg-type]
    cached_s = time.perf_counter() - started
    verdict.require(all(built.values()), f"not built: {built}: edgecoder image build --all")
    if not all(built.values()):
        return verdict.finish()
    print(f"image build, cached (the --if-missing check of both runtimes): {cached_s * 1000:.0f} ms")
    samples: dict[str, list[float]] = {f"{r} {path}": [] for r in ROWS for path in ("warm", "cold")}
    label = f"bench-runtimes-{uuid.uuid4().hex[:8]}"
    memory: dict[str, float] = {}
    async with (
        Executor.open(policy, node_label=label) as warm,
        Executor.open(policy, node_label=f"{label}-cold", pool_size=0) as cold,
    ):
        await sample(warm, SCIENCE.name)  # puts python-science in use: the budget is now one container each
        for round_ in range(runs):
            for runtime in ROWS if round_ % 2 == 0 else reversed(list(ROWS)):
                await quiet(warm)
                samples[f"{runtime} warm"].append(await sample(warm, runtime))
                samples[f"{runtime} cold"].append(await sample(cold, runtime))
        await quiet(warm)
        shares: dict[str, Any] = {name: warm.runtime_pools["runc", name].size for name in policy.runtime_names}
        memory = pool_memory_mib(label)
    figures = {name: percentiles(values) for name, values in samples.items()}
    print_figures(figures)
    print(f"warm pool with two runtimes (containers per runtime {shares}):")
    for image, mib in memory.items():
        print(f"  {image}: {mib:.1f} MiB")
    print(f"  in all: {sum(memory.values()):.1f} MiB")
    ratio = figures[f"{SCIENCE.name} warm"][0] / figures["python warm"][0]
    print(f"python-science warm p50 / python warm p50: {ratio:.2f}x")
    verdict.target("warm python-science p50 over warm python p50", ratio, at_most=1.5, unit="x")
    return verdict.finish()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    sys.exit(trio.run(main, parser.parse_args().runs))
