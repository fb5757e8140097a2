"""Run warm start's probes and programs under the supervisor of another git revision and on this tree's warm path.

    .venv/bin/python scripts/compare_supervisor.py [REV]     # REV defaults to main

tests/test_executor_warm.py proves the four paths of this tree identical to one another; this proves the warm path
identical to the path before it. The old supervisor (`executor/bootstrap.py` of REV, which must still have the
pre-warm-start layout: BOOTSTRAP, encode_payload and new_nonce in that one file) runs in `docker run -i` with every
flag of the node's containers (benchmarks/cli_baseline.py); this tree's runs go through a warm pool container of
the program's language. Prints each difference, and exits 1 if there is any.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from cli_baseline import cli_command  # noqa: E402

from executor.contract import ExecRequest, Language  # noqa: E402
from executor.policy import ExecutorPolicy  # noqa: E402
from executor.runner import Executor  # noqa: E402
from tests.docker_support import wait_pool_ready  # noqa: E402
from tests.test_executor_warm import (  # noqa: E402
    JAVASCRIPT_CASES,
    JAVASCRIPT_PROBE,
    PYTHON_CASES,
    PYTHON_PROBE,
)

CLI_WARNING = b"WARNING: Localhost DNS (127.0.0.1) may fail in containers.\n"  # the CLI's, not the program's
CAP = ExecutorPolicy().stdout_cap


def old_supervisor(rev: str) -> types.ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:executor/bootstrap.py"], capture_output=True, check=True, text=True
    ).stdout
    module = types.ModuleType(f"bootstrap_at_{rev}")
    exec(compile(source, f"{rev}:executor/bootstrap.py", "exec"), module.__dict__)
    return module


def run_old(old: types.ModuleType, language: Language, code: str, data: Any) -> tuple[str, str, int]:
    nonce = old.new_nonce()
    payload = old.encode_payload(language, code.encode(), json.dumps(data).encode(), 5000, nonce)
    command = cli_command(ExecutorPolicy())
    image_at = command.index(ExecutorPolicy().image)
    done = subprocess.run(
        [*command[: image_at + 1], "python3", "-I", "-S", "-c", old.BOOTSTRAP], input=payload, capture_output=True
    )
    trailer = f"EC2END:{nonce}:".encode()
    out, err = done.stdout, done.stderr.replace(CLI_WARNING, b"")
    status = int(out[out.rindex(trailer) + len(trailer) :].strip())
    cut = lambda data: data[: data.rindex(trailer)][:CAP].decode(errors="replace")  # noqa: E731
    return cut(out), cut(err), status


async def run_warm(language: Language, code: str, data: Any) -> tuple[str, str, int | None]:
    policy = ExecutorPolicy(subset_check=False, pool_size=1, pool_languages=(language,))
    async with Executor.open(policy, node_label="compare-supervisor") as ex:
        await wait_pool_ready(ex)
        result = await ex.run_code(ExecRequest(language, code, data))
    return result.stdout, result.stderr, result.exit_code


async def main(rev: str) -> int:
    old = old_supervisor(rev)
    differences = 0
    programs: list[tuple[Language, str, Any]] = [
        ("python", PYTHON_PROBE, {"xs": [1, 2]}),
        ("javascript", JAVASCRIPT_PROBE, {"xs": [1, 2]}),
        *(("python", code, data) for code, data, _ in PYTHON_CASES),
        *(("javascript", code, data) for code, data, _ in JAVASCRIPT_CASES),
    ]
    for language, code, data in programs:
        before, now = run_old(old, language, code, data), await run_warm(language, code, data)
        same = before == now
        differences += not same
        print(f"{'same' if same else 'DIFFERENT':<10} {language:<11} {code.strip().splitlines()[0][:70]!r}")
        if not same:
            print(f"    {rev}: {before!r:.500}\n    warm: {now!r:.500}")
    print(f"{len(programs)} programs, {differences} different")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "main"))
