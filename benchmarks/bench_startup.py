"""Start-up speed of the CLI, measured side by side in one run, as ratios to the baselines a user would compare with.

    python benchmarks/bench_startup.py [--runs 15] [--exec-runs 10]

- `edgecoder --help` and `edgecoder keygen` against `python -c pass` (target: within 3x);
- `edgecoder exec` of `print(1)` in Docker against `docker run --rm` of the same program with every flag of the
  node's containers (benchmarks/cli_baseline.py builds it; target: within 1.5x);
- where an `exec` goes: interpreter and imports (`python -X importtime`), then each Docker call of the run;
- the floor of any Python client of the docker SDK (`sdk_floor.py`: an interpreter that imports only `docker`, then
  creates, starts, waits for and removes the same container, reading nothing), in the same side-by-side run.

The runs of each pair alternate, so both sides see the same machine; the figures are medians. Nothing here asserts:
tests never time anything (see the developers' guide).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from verdict import Verdict  # benchmarks/ is the script's directory

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

EDGECODER = str(Path(sys.executable).with_name("edgecoder"))
# As a user runs it: with the bytecode caches that pip writes at install. PYTHONDONTWRITEBYTECODE (set in some
# sandboxes) would make every run compile every module from source, which is not start-up but compilation.
ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str], **kwargs: object) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - began


def side_by_side(runs: int, commands: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Median seconds of each, the runs interleaved (one of each in turn), after one warm-up run of each."""
    for run in commands.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, run in commands.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def print_ratios(
    title: str, medians: dict[str, float], baseline: str, target: float, verdict: Verdict, *, targeted: set[str]
) -> None:
    """The table, then a target line for each of `targeted` (the others are context: a floor, say)."""
    base = medians[baseline]
    print(f"\n{title}")
    print(f"  {'command':<46}{'median ms':>10}{'ratio':>8}")
    for name, seconds in medians.items():
        print(f"  {name:<46}{seconds * 1000:>10.1f}{seconds / base:>7.2f}x")
    for name in targeted:
        verdict.target(f"{name} / {baseline}", medians[name] / base, at_most=target, unit="x")


def import_breakdown(args: list[str]) -> list[tuple[str, float]]:
    """The slowest top-level imports of `edgecoder <args>`, from `python -X importtime`."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mesh.cli", *args],
        capture_output=True,
        text=True,
        env={**ENV, "PYTHONPATH": str(ROOT)},
    )
    top: list[tuple[str, float]] = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, raw_name = line.removeprefix("import time:").split("|")
        top_level = raw_name.startswith(" ") and not raw_name.startswith("  ")  # nesting is shown by indentation
        if cumulative.strip().isdigit() and top_level:
            top.append((raw_name.strip(), int(cumulative) / 1e6))
    return sorted(top, key=lambda item: -item[1])[:8]


def exec_phases(code_file: Path) -> list[tuple[str, float]]:
    """One `run_local` of print(1), in this process, with each Docker SDK call the sandbox makes timed."""
    import docker.api.client
    import trio

    from executor.contract import Limits
    from mesh.commands import run_local

    phases: list[tuple[str, float]] = []
    original = docker.api.client.APIClient._result

    def wrap(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def timed_call(*args: object, **kwargs: object) -> object:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases.append((f"docker API: {name}", time.perf_counter() - began))

        return timed_call

    api = docker.api.client.APIClient
    wrapped = {}
    for name in ("create_container", "start", "attach_socket", "wait", "logs", "remove_container", "inspect_image",
                 "ping", "kill", "version", "images", "inspect_container", "info", "containers"):  # fmt: skip
        if hasattr(api, name):
            wrapped[name] = getattr(api, name)
            setattr(api, name, wrap(name, wrapped[name]))
    try:
        began = time.perf_counter()
        result = trio.run(run_local, "python", code_file.read_text(), None, Limits(), "docker", True)
        phases.append(("run_local in all", time.perf_counter() - began))
    finally:
        for name, fn in wrapped.items():
            setattr(api, name, fn)
        api._result = original
    assert result.ok and result.stdout == "1\n", result
    return phases


def sdk_floor_config(policy: object) -> str:
    """The node's runc container for print(1), as `sdk_floor.py` takes it (JSON)."""
    import docker

    from executor.backends import backend_for
    from executor.container_config import SANDBOX_UID_BASE, build_container_config
    from executor.contract import Limits
    from executor.policy import ExecutorPolicy

    assert isinstance(policy, ExecutorPolicy)
    config = build_container_config(
        policy.clamp(Limits(timeout_ms=5000)), policy, labels={}, uid=SANDBOX_UID_BASE, backend=backend_for("runc")
    )
    with docker.APIClient(version="auto") as api:
        version = api.api_version
    return json.dumps(
        {
            "api_version": version,
            "image": config["image"],
            "command": ["python3", "-I", "-S", "-c", "print(1)"],
            "user": config["user"],
            "working_dir": config["working_dir"],
            "host_config": config["host_config"],
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--exec-runs", type=int, default=10)
    parser.add_argument("--no-docker", action="store_true", help="Skip the exec comparison.")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    verdict = Verdict()
    try:
        key = work / "node.key"

        def keygen() -> float:
            return timed([EDGECODER, "keygen", "--out", str(key), "--force"])

        medians = side_by_side(
            options.runs,
            {
                "python -c pass": lambda: timed([sys.executable, "-c", "pass"]),
                "edgecoder --help": lambda: timed([EDGECODER, "--help"]),
                "edgecoder keygen": keygen,
                "edgecoder node --help": lambda: timed([EDGECODER, "node", "--help"]),
            },
        )
        print(f"start-up, {options.runs} runs each, interleaved ({sys.executable})")
        print_ratios(
            "commands that must start fast (target: within 3x of python -c pass)",
            medians,
            "python -c pass",
            3,
            verdict,
            targeted={"edgecoder --help", "edgecoder keygen", "edgecoder node --help"},
        )
        print("\n  slowest imports of `edgecoder keygen` (cumulative ms):")
        for name, seconds in import_breakdown(["keygen", "--out", str(work / "k2"), "--force"]):
            print(f"    {name:<44}{seconds * 1000:>8.1f}")
        if options.no_docker or shutil.which("docker") is None:
            # Every command ran with check=True: one that failed stopped the benchmark with exit 1.
            return verdict.finish()
        from cli_baseline import cli_command  # benchmarks/ is the script's directory

        from executor.policy import ExecutorPolicy

        code = work / "print1.py"
        code.write_text("print(1)\n")
        policy = ExecutorPolicy.from_env()
        baseline = cli_command(policy)
        baseline = [*baseline[: baseline.index("python3")], "python3", "-I", "-S", "-c", "print(1)"]
        floor = [sys.executable, str(HERE / "sdk_floor.py"), sdk_floor_config(policy)]
        exec_medians = side_by_side(
            options.exec_runs,
            {
                "docker run --rm (the node's flags)": lambda: timed(baseline, stdin=subprocess.DEVNULL),
                "edgecoder exec print(1) --sandbox docker": lambda: timed(
                    [EDGECODER, "exec", "--language", "python", "--code-file", str(code)]
                ),
                "floor: python + the docker SDK alone": lambda: timed(floor),
            },
        )
        print_ratios(
            f"exec in Docker, {options.exec_runs} runs each (target: within 1.5x of docker run --rm)",
            exec_medians,
            "docker run --rm (the node's flags)",
            1.5,
            verdict,
            targeted={"edgecoder exec print(1) --sandbox docker"},
        )
        print("\n  slowest imports of `edgecoder exec` (cumulative ms):")
        for name, seconds in import_breakdown(["exec", "--language", "python", "--code-file", str(code)]):
            print(f"    {name:<44}{seconds * 1000:>8.1f}")
        print("\n  one exec's run, call by call (in this process, imports already paid):")
        for name, seconds in exec_phases(code):
            print(f"    {name:<44}{seconds * 1000:>8.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return verdict.finish()  # every command ran with check=True: one that failed stopped it with exit 1


if __name__ == "__main__":
    sys.exit(main())
