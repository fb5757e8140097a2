"""What each isolation tier costs, side by side in one run: warm and cold runs of a trivial Python task under runc,
gVisor on systrap and gVisor on ptrace, and `docker run --rm` of each as the baseline.

    .venv/bin/python benchmarks/bench_isolation.py [--runs 20]

Needs a daemon with both registrations scripts/setup.sh makes (DOCKER_HOST picks the daemon): `runsc`, the gvisor
tier's (`--platform=systrap`), and `runsc-ptrace`, the same runsc on ptrace, which only this benchmark names. Each
gVisor path's platform is read from its canary's sandbox on the host (executor/canary.py), not taken from the
registration: a path that is not on its platform, or whose canary fails, did not run, and the benchmark exits 1.

The paths are interleaved: every round runs each path once, in the same order, so a slow moment of a shared machine
falls on all of them. Warm and cold are measured as the node sees them, `Executor.run_code` returning a result, in
steady state: every pool refilled and every removal finished before each run (as between offers), so a warm figure
is a pool hit and no run shares the machine with another path's refill. The target: warm gVisor (systrap) p50
within 2x of warm runc.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import trio
from cli_baseline import CODE, EXPECTED, INPUT, bench_cli, percentiles, print_figures  # benchmarks/ is sys.path[0]
from verdict import Verdict

from executor.backends import SandboxBackend, Tier
from executor.backends.gvisor import PTRACE_RUNTIME, RUNTIME, GvisorBackend
from executor.backends.runc import RuncBackend
from executor.contract import ExecRequest
from executor.policy import ExecutorPolicy
from executor.runner import Executor

TASK = ExecRequest("python", CODE, INPUT)
TARGET = 2.0  # warm gVisor (systrap) p50 / warm runc p50


@dataclass(frozen=True)
class Lane:
    name: str
    tier: Tier
    backend: SandboxBackend
    platform: str | None  # what the canary must read from the sandbox; None for runc


PATHS = (
    Lane("runc", "runc", RuncBackend(), None),
    Lane("gVisor-systrap", "gvisor", GvisorBackend(RUNTIME), "systrap"),
    Lane("gVisor-ptrace", "gvisor", GvisorBackend(PTRACE_RUNTIME), "ptrace"),
)


class TierDidNotRun(Exception):
    pass


async def steady(ex: Executor) -> None:
    with trio.fail_after(60):
        while (s := ex.stats()).pool_ready < s.pool_size or s.pending_removals:
            await trio.sleep(0.01)


async def timed_run(ex: Executor, path: Lane) -> float:
    await steady(ex)
    began = time.perf_counter()
    result = await ex.run_code(TASK)
    elapsed = time.perf_counter() - began
    if not (result.ok and result.stdout == EXPECTED):
        raise TierDidNotRun(f"{path.name}: a run failed: {result.error_kind}: {result.stderr[-300:]}")
    return elapsed


@contextlib.asynccontextmanager
async def proven(policy: ExecutorPolicy, path: Lane, pool_size: int) -> AsyncIterator[Executor]:
    """An executor of `path` alone, whose canary passed on the platform the path names."""
    alone = replace(policy, isolation=(path.tier,))
    label = f"bench-isolation-{path.name.lower()}-{'warm' if pool_size else 'cold'}"
    async with Executor.open(alone, node_label=label, pool_size=pool_size, backends={path.tier: path.backend}) as ex:
        health = await ex.health()
        canary = await ex.canary() if health.ok else health
        if not canary.ok:
            raise TierDidNotRun(f"{path.name}: {canary.reason}: {canary.detail[:500]}")
        if canary.platform != path.platform:
            raise TierDidNotRun(f"{path.name}: its sandbox ran on {canary.platform!r}, not {path.platform!r}")
        yield ex


async def bench(policy: ExecutorPolicy, runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        warm = {p.name: await stack.enter_async_context(proven(policy, p, 2)) for p in PATHS}
        cold = {p.name: await stack.enter_async_context(proven(policy, p, 0)) for p in PATHS}
        runners: dict[str, Callable[[], Coroutine[Any, Any, float]]] = {}
        for kind, executors in (("warm", warm), ("cold", cold)):
            for p in PATHS:
                runners[f"{kind} {p.name}"] = lambda ex=executors[p.name], p=p: timed_run(ex, p)  # type: ignore[misc]
        for p in PATHS:  # the first run of a process pays for what every later one reuses
            await timed_run(warm[p.name], p)
        for _ in range(runs):
            for name, run in runners.items():
                samples.setdefault(name, []).append(await run())
            for p in PATHS:
                for ex in (*warm.values(), *cold.values()):
                    await steady(ex)
                cli = await trio.to_thread.run_sync(lambda p=p: bench_cli(policy, 1, p.backend))
                samples.setdefault(f"docker run --rm {p.name}", []).extend(cli)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    policy = replace(ExecutorPolicy.from_env(), subset_check=True)
    verdict = Verdict()
    try:
        samples = trio.run(bench, policy, args.runs)
    except TierDidNotRun as exc:  # no side-by-side figure without every tier
        verdict.require(False, f"a tier did not run: {exc}")
        return verdict.finish()
    figures = {name: percentiles(values) for name, values in samples.items()}
    print(f"trivial Python task, {args.runs} interleaved rounds, warm pools of 2 per path; platforms read from each")
    print("gVisor path's canary sandbox: systrap and ptrace")
    print_figures(figures)
    p50 = {name: p50 for name, (p50, _) in figures.items()}
    for gvisor in ("gVisor-systrap", "gVisor-ptrace"):
        print(
            f"{gvisor} / runc p50: warm {p50[f'warm {gvisor}'] / p50['warm runc']:.2f}x, "
            f"cold {p50[f'cold {gvisor}'] / p50['cold runc']:.2f}x"
        )
    # Every run's output was checked as it came, and each path's canary and platform before the runs (else exit 1).
    verdict.target(
        "warm gVisor p50 within 2x of warm runc",
        p50["warm gVisor-systrap"] / p50["warm runc"],
        at_most=TARGET,
        unit="x",
    )
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
