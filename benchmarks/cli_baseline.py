"""What the benchmarks share: the trivial task, percentiles, and the `docker run --rm` CLI baseline.

The baseline is what the EdgeCoder reference executor does: one `docker run --rm` per task, with every flag of our
own containers (read from `executor/container_config.py`, so the comparison stays like for like).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Any

from executor.backends import SandboxBackend, backend_for
from executor.container_config import SANDBOX_UID_BASE, build_container_config
from executor.contract import Language, Limits
from executor.policy import ExecutorPolicy

CODE = "import json, sys\nprint(sum(json.load(sys.stdin)['xs']))"
INPUT = {"xs": [1, 2, 3]}
EXPECTED = "6\n"
# The same task in JavaScript (stdin read to its end, as a program must).
JS_CODE = (
    "let s = '';\n"
    "process.stdin.on('data', c => s += c).on('end', () => console.log(JSON.parse(s).xs.reduce((a, b) => a + b, 0)));"
)


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    ordered = sorted(samples_s)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p95 * 1000


def print_figures(figures: dict[str, tuple[float, float]]) -> None:
    """The p50 and p95 of each path, as one table."""
    width = max(len(name) for name in figures) + 4
    print(f"{'path':<{width}}{'p50 ms':>10}{'p95 ms':>10}")
    for name, (p50, p95) in figures.items():
        print(f"{name:<{width}}{p50:>10.1f}{p95:>10.1f}")


def cli_command(
    policy: ExecutorPolicy, language: Language = "python", backend: SandboxBackend | None = None
) -> list[str]:
    """`docker run --rm` with the image and every flag of the node's containers of a tier (runc by default), read
    from its config, running the trivial task of `language` (`python3 -I -S -c CODE` or `node -e JS_CODE`).

    MaskedPaths and ReadonlyPaths have no CLI flag: the baseline keeps Docker's own defaults for them.
    """
    backend = backend or backend_for("runc")
    limits = policy.clamp(Limits(timeout_ms=5000))
    config = build_container_config(limits, policy, labels={}, uid=SANDBOX_UID_BASE, backend=backend)
    host: dict[str, Any] = dict(config["host_config"])
    host.pop("MaskedPaths")
    host.pop("ReadonlyPaths")
    flags = [
        f"--runtime={host.pop('Runtime')}",
        f"--network={host.pop('NetworkMode')}",
        f"--memory={host.pop('Memory')}b",
        f"--memory-swap={host.pop('MemorySwap')}b",
        f"--cpus={host.pop('NanoCpus') / 1e9:g}",
        f"--pids-limit={host.pop('PidsLimit')}",
        f"--user={config['user']}",
        f"--workdir={config['working_dir']}",
        f"--log-driver={host.pop('LogConfig')['Type']}",
    ]
    if host.pop("ReadonlyRootfs"):
        flags.append("--read-only")
    flags += [f"--cap-drop={cap}" for cap in host.pop("CapDrop")]
    # The CLI reads the seccomp profile from a file: the policy's path, not the JSON text the API is sent.
    flags += [
        f"--security-opt=seccomp={policy.seccomp_profile}" if opt.startswith("seccomp=") else f"--security-opt={opt}"
        for opt in host.pop("SecurityOpt")
    ]
    flags += [f"--dns={server}" for server in host.pop("Dns", [])]
    flags += [f"--dns-search={domain}" for domain in host.pop("DnsSearch", [])]
    flags += [f"--dns-option={option}" for option in host.pop("DnsOptions", [])]
    flags += [f"--tmpfs={path}:{options}" for path, options in host.pop("Tmpfs").items()]
    flags += [f"--ulimit={u['Name']}={u['Soft']}:{u['Hard']}" for u in host.pop("Ulimits")]
    assert not host, f"container_config sets flags this baseline does not translate: {sorted(host)}"
    program = ["python3", "-I", "-S", "-c", CODE] if language == "python" else ["node", "-e", JS_CODE]
    return ["docker", "run", "--rm", "-i", *flags, config["image"], *program]


def bench_cli(policy: ExecutorPolicy, runs: int, backend: SandboxBackend | None = None) -> list[float]:
    command = cli_command(policy, backend=backend)
    return [run_cli_once(command) for _ in range(runs)]


def run_cli_once(command: list[str]) -> float:
    """Seconds for one `docker run --rm` of the trivial task, the whole CLI process."""
    began = time.perf_counter()
    done = subprocess.run(command, input=b'{"xs": [1, 2, 3]}', capture_output=True, check=True)
    elapsed = time.perf_counter() - began
    assert done.stdout.decode() == EXPECTED, done
    return elapsed
