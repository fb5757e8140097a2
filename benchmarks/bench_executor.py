"""Latency of a trivial task in Python and in JavaScript, every path side by side, interleaved run by run.

    .venv/bin/python benchmarks/bench_executor.py [--runs 30] [--status]

Rows, for each language:
- "warm": `Executor.run_code` on a pool container whose interpreter is parked for the task's language (the node's
  path since warm start: executor/supervisor.py);
- "pool, on arrival": the same pool with `prestart=False`: the interpreter starts once the task is in (the warm
  path before warm start);
- "cold": a container created for the run (its interpreter prestarted while the task is sent);
- "docker run --rm": the CLI, whole process, with every flag of the node's containers (benchmarks/cli_baseline.py).

One more row, "Python warm, empty program" (`pass`), shows what the executor and Docker's attach stream cost on
their own: the rest of a warm run is the program (the task's `import json` alone is most of it).

One round takes one sample of every row, in an order rotated round by round, so load that drifts over the run
(the machine is shared) falls on every row alike. Before each sample the executors are quiet: pools full (a pool
container counts only once its interpreter is parked) and removals done, as between offers. Only this benchmark
and its baseline shell out to the docker CLI; product code never does.

`--status` adds the two ways a run can learn its exit status (issue 10), on the same warm pool containers and with
the same primitives (no subset check, no result building): the supervisor's trailer, and end of stream + the
daemon's `wait`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import trio
from cli_baseline import (  # benchmarks/ is the script's directory
    CODE,
    EXPECTED,
    INPUT,
    JS_CODE,
    cli_command,
    percentiles,
    print_figures,
    run_cli_once,
)
from verdict import Verdict

from executor.bootstrap import encode_payload, new_nonce
from executor.contract import ExecRequest, Language
from executor.output import AttachDemuxer
from executor.policy import ExecutorPolicy
from executor.request import PreparedRequest, prepare_request
from executor.runner import Executor

TASKS: dict[Language, ExecRequest] = {
    "python": ExecRequest("python", CODE, INPUT),
    "javascript": ExecRequest("javascript", JS_CODE, INPUT),
}
NAMES: dict[Language, str] = {"python": "Python", "javascript": "JavaScript"}
PYTHON_TARGET, JAVASCRIPT_TARGET = 20.0, 5.0


async def quiet(executors: list[Executor]) -> None:
    """Steady state between offers: every pool refilled and parked, every removal finished."""
    with trio.fail_after(60):
        for ex in executors:
            while (stats := ex.stats()).pool_ready < stats.pool_size or stats.pending_removals:
                await trio.sleep(0.005)


async def executor_run(ex: Executor, language: Language, task: ExecRequest | None = None) -> float:
    began = time.perf_counter()
    result = await ex.run_code(task or TASKS[language])
    elapsed = time.perf_counter() - began
    assert result.ok and result.stdout == ("" if task else EXPECTED), result
    return elapsed


async def cli_run(command: list[str]) -> float:
    return await trio.to_thread.run_sync(run_cli_once, command)


def _wait(api: Any, *, container_id: str) -> int:
    return int(api.wait(container_id, timeout=30)["StatusCode"])


async def status_run(ex: Executor, *, from_docker: bool) -> float:
    """One pooled Python run by hand: send the task, then read to the trailers, or to end of stream and `wait`."""
    prepared = prepare_request(TASKS["python"], ex.policy)
    assert isinstance(prepared, PreparedRequest)
    began = time.perf_counter()
    started = ex.pool.take(ex.policy.pool_limits, "python")
    assert started is not None and started.prestarted == "python"
    nonce = new_nonce()
    output = AttachDemuxer(ex.policy.stdout_cap, ex.policy.stderr_cap, nonce=nonce)
    await started.stream.send_all(encode_payload("python", prepared.code, prepared.input_json, 5000, nonce))
    while (from_docker or output.exit_status is None) and (data := await started.stream.receive_some(65536)):
        output.feed(data)
    status: int | None = output.exit_status
    if from_docker:
        status = await ex.sandbox.docker.call(functools.partial(_wait, container_id=started.container_id))
    elapsed = time.perf_counter() - began
    started.close()
    ex.pool.returned(started)
    await ex.sandbox.dispose(started.container_id)
    assert status == 0 and output.stdout.text() == EXPECTED, (status, output.stdout.text())
    return elapsed


async def bench(policy: ExecutorPolicy, runs: int, with_status: bool) -> dict[str, list[float]]:
    async with AsyncExitStack() as stack:
        warm = await stack.enter_async_context(Executor.open(replace(policy, pool_size=2), node_label="bench-warm"))
        arrival = await stack.enter_async_context(
            Executor.open(replace(policy, pool_size=2, prestart=False), node_label="bench-arrival")
        )
        cold = await stack.enter_async_context(Executor.open(replace(policy, pool_size=0), node_label="bench-cold"))
        executors = [warm, arrival, cold]
        rows: dict[str, Callable[[], Awaitable[float]]] = {}
        for language, name in NAMES.items():
            rows[f"{name} warm"] = functools.partial(executor_run, warm, language)
            rows[f"{name} pool, on arrival"] = functools.partial(executor_run, arrival, language)
            rows[f"{name} cold"] = functools.partial(executor_run, cold, language)
            rows[f"{name} docker run --rm"] = functools.partial(cli_run, cli_command(policy, language))
        empty = ExecRequest("python", "pass")
        rows["Python warm, empty program"] = functools.partial(executor_run, warm, "python", empty)
        if with_status:
            rows["status: trailer"] = functools.partial(status_run, warm, from_docker=False)
            rows["status: Docker wait"] = functools.partial(status_run, warm, from_docker=True)
        samples: dict[str, list[float]] = {name: [] for name in rows}
        order = list(rows)
        for round_number in range(runs):
            shift = round_number % len(order)
            for name in order[shift:] + order[:shift]:
                await quiet(executors)
                samples[name].append(await rows[name]())
        return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--status", action="store_true", help="also the trailer vs Docker wait rows")
    args = parser.parse_args()
    policy = replace(ExecutorPolicy.from_env(), subset_check=True)
    samples = trio.run(bench, policy, args.runs, args.status)
    figures = {name: percentiles(values) for name, values in samples.items()}
    print(f"trivial task (read JSON from stdin, print a sum), {args.runs} interleaved rounds")
    print_figures(figures)
    print()
    ratios: dict[str, float] = {}
    for name in NAMES.values():
        warm_p50 = figures[f"{name} warm"][0]
        for other in ("docker run --rm", "cold", "pool, on arrival"):
            ratio = figures[f"{name} {other}"][0] / warm_p50
            ratios[f"{name} {other}"] = ratio
            print(f"{name}: {other} p50 / warm p50 = {ratio:.1f}x")
    js_vs_python_cli = figures["Python docker run --rm"][0] / figures["JavaScript warm"][0]
    print(f"JavaScript: Python's docker run --rm p50 / JavaScript warm p50 = {js_vs_python_cli:.1f}x")
    if args.status:
        extra = figures["status: Docker wait"][0] - figures["status: trailer"][0]
        print(f"status from Docker alone costs {extra:+.1f} ms p50")
    # Every run's output was checked as it came (a failed or wrong run stops the benchmark with exit 1).
    verdict = Verdict()
    verdict.target("Python: docker run --rm p50 / warm p50", ratios["Python docker run --rm"], at_least=PYTHON_TARGET,
                   unit="x")  # fmt: skip
    verdict.target("JavaScript: docker run --rm p50 / warm p50", ratios["JavaScript docker run --rm"],
                   at_least=JAVASCRIPT_TARGET, unit="x")  # fmt: skip
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
