"""Whether wall-clock limits hold: wall time / timeout for programs that misbehave in four ways.

    .venv/bin/python benchmarks/bench_limits.py [--timeout-ms 3000] [--runs 3]

Each case runs through `Executor.run_code` with a pooled container and with a cold one, and the figure is the
wall time from the call to the result, divided by the timeout. The contract: every run ends within its timeout
plus 2 s, whatever it writes.
- flood: writes 64 KiB chunks to stdout forever (the attach stream is never idle);
- sleep: prints a line, then sleeps forever;
- fork bomb: forks forever, ignoring every failed fork (the pids limit, 50, holds it);
- memory bomb: allocates until the memory limit (OOM kill: it ends well before its timeout).

It fails (exit 1) when the run was broken: a case that did not end as it must (a timeout, or memory_exceeded for the
memory bomb) measured a program that did not misbehave, or crashed at once, not the limit. The target (every run
within its timeout plus 2 s) is printed met or not met; tests/test_executor_sandbox.py checks only the outcomes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import replace

import trio
from verdict import Verdict  # benchmarks/ is the script's directory

from executor.contract import ErrorKind, ExecRequest, Limits
from executor.policy import ExecutorPolicy
from executor.runner import Executor

CASES = {
    "flood": "import sys\nwhile True:\n    sys.stdout.write('A' * 65536)",
    "sleep": "import time\nprint('hello', flush=True)\ntime.sleep(3600)",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory bomb": "hoard = []\nwhile True:\n    hoard.append(bytearray(1 << 20))",
}
# How each case must end: anything else means the program did not misbehave as meant, or failed for another reason.
ENDS = {"flood": ErrorKind.TIMEOUT, "sleep": ErrorKind.TIMEOUT, "fork bomb": ErrorKind.TIMEOUT}
ENDS_MEMORY = ErrorKind.MEMORY_EXCEEDED


async def measure(
    policy: ExecutorPolicy, *, pooled: bool, timeout_ms: int, runs: int, wrong: Counter[str]
) -> dict[str, list[float]]:
    ratios: dict[str, list[float]] = {name: [] for name in CASES}
    size = 1 if pooled else 0
    async with Executor.open(policy, node_label=f"bench-limits-{'warm' if pooled else 'cold'}", pool_size=size) as ex:
        for _ in range(runs):
            for name, code in CASES.items():
                with trio.fail_after(60):
                    while ex.stats().pool_ready < ex.stats().pool_size or ex.stats().pending_removals:
                        await trio.sleep(0.01)
                began = time.perf_counter()
                result = await ex.run_code(ExecRequest("python", code, limits=Limits(timeout_ms=timeout_ms)))
                ratios[name].append((time.perf_counter() - began) / (timeout_ms / 1000))
                if result.error_kind != ENDS.get(name, ENDS_MEMORY):
                    wrong[f"{name} ({'pooled' if pooled else 'cold'}) ended {result.error_kind}"] += 1
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    policy = replace(ExecutorPolicy.from_env(), subset_check=False)
    wrong: Counter[str] = Counter()
    warm = trio.run(lambda: measure(policy, pooled=True, timeout_ms=args.timeout_ms, runs=args.runs, wrong=wrong))
    cold = trio.run(lambda: measure(policy, pooled=False, timeout_ms=args.timeout_ms, runs=args.runs, wrong=wrong))
    bound = (args.timeout_ms / 1000 + 2) / (args.timeout_ms / 1000)
    print(f"wall / timeout, timeout {args.timeout_ms} ms, {args.runs} runs each (max of the runs); bound {bound:.2f}")
    print(f"{'case':<14}{'pooled':>10}{'cold':>10}")
    for name in CASES:
        print(f"{name:<14}{max(warm[name]):>10.2f}{max(cold[name]):>10.2f}")
    worst = max(max(r) for r in (*warm.values(), *cold.values()))
    verdict = Verdict()
    verdict.target("worst wall / timeout, every case, pooled and cold", worst, at_most=bound)
    for what, count in sorted(wrong.items()):
        verdict.require(False, f"{what} ({count} of {args.runs} runs)")
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
