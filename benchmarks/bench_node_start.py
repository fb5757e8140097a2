"""Three ways to start Debian's node 18 for a program, measured inside one sandbox container, interleaved.

    .venv/bin/python benchmarks/bench_node_start.py [--runs 15]

Debian builds node without its built-in start-up snapshot (`process.config.variables.node_use_node_snapshot` is
false), but its node 18.20 can build and load a user-land one (`--build-snapshot`, `--snapshot-blob`). Rows:
- "on arrival": `node /tmp/main.js`, the program file written first (the old path, and the fallback);
- "snapshot blob": `node --snapshot-blob /tmp/snap.blob /tmp/main.js`, the blob built from an empty script in the
  same container (an image could ship it);
- "parked": node started earlier on a FIFO at /tmp/main.js, the code written into it (executor/supervisor.py's
  warm start), timed from the code's delivery.

Each row: wall time until the process is reaped, and the CPU it used over its whole life (user + system, from
wait4; for "parked" that includes the start-up it paid before the code came). The container has the node's flags
(benchmarks/cli_baseline.py), so the CPU quota is the pool's half a CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from cli_baseline import cli_command  # benchmarks/ is the script's directory
from verdict import Verdict  # benchmarks/ is the script's directory

from executor.policy import ExecutorPolicy

INSIDE = r"""
import json, os, statistics, sys, time
runs = int(sys.argv[1])
PROGRAM = "console.log(JSON.parse(require('fs').readFileSync(0, 'utf8')).xs.reduce((a, b) => a + b, 0))"
os.chdir("/tmp")
open("/tmp/empty.js", "w").close()
built = os.spawnv(os.P_WAIT, "/usr/bin/node", ["node", "--snapshot-blob", "/tmp/snap.blob", "--build-snapshot",
                                              "/tmp/empty.js"])
assert built == 0, built

def fresh():
    for path in ("/tmp/main.js", "/tmp/input.json"):
        if os.path.lexists(path):
            os.unlink(path)
    with open("/tmp/input.json", "w") as f:
        f.write('{"xs": [1, 2, 3]}')

def spawn(argv):
    pid = os.fork()
    if pid == 0:
        fd = os.open("/tmp/input.json", os.O_RDONLY)
        os.dup2(fd, 0)
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(null, 1)
        os.execv(argv[0], argv)
    return pid

def reap(pid, began):
    _, status, usage = os.wait4(pid, 0)
    assert status == 0, status
    return time.monotonic() - began, usage.ru_utime + usage.ru_stime

def on_arrival(extra):
    fresh()
    began = time.monotonic()
    with open("/tmp/main.js", "w") as f:
        f.write(PROGRAM)
    return reap(spawn(["/usr/bin/node", *extra, "/tmp/main.js"]), began)

def parked():
    fresh()
    os.mkfifo("/tmp/main.js", 0o600)
    pid = spawn(["/usr/bin/node", "/tmp/main.js"])
    while True:  # until node has reached its main file
        try:
            fifo = os.open("/tmp/main.js", os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            time.sleep(0.001)
    time.sleep(0.2)  # a fresh CPU-quota period, as for a pool container that waited
    began = time.monotonic()
    os.set_blocking(fifo, True)
    os.write(fifo, PROGRAM.encode())
    os.close(fifo)
    return reap(pid, began)

rows = {
    "on arrival": lambda: on_arrival([]),
    "snapshot blob": lambda: on_arrival(["--snapshot-blob", "/tmp/snap.blob"]),
    "parked": parked,
}
samples = {name: [] for name in rows}
for _ in range(runs):
    for name, run in rows.items():
        time.sleep(0.2)
        samples[name].append(run())
print(json.dumps({name: [[w for w, _ in runs_of], [c for _, c in runs_of]] for name, runs_of in samples.items()}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    command = cli_command(ExecutorPolicy.from_env())
    image_at = command.index(ExecutorPolicy.from_env().image)
    done = subprocess.run(
        [*command[: image_at + 1], "python3", "-c", INSIDE, str(args.runs)], capture_output=True, check=True
    )
    samples = json.loads(done.stdout)
    print(f"node 18 (Debian) start-up inside one sandbox container, {args.runs} interleaved runs each")
    print(f"{'path':<16}{'wall p50 ms':>14}{'wall p95 ms':>14}{'CPU p50 ms':>14}")
    for name, (walls, cpus) in samples.items():
        walls, cpus = sorted(walls), sorted(cpus)
        p95 = walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))]
        p50, cpu = walls[len(walls) // 2], cpus[len(cpus) // 2]
        print(f"{name:<16}{p50 * 1000:>14.1f}{p95 * 1000:>14.1f}{cpu * 1000:>14.1f}")
    # No target: which way to start node is chosen from these figures. Broken: a path with no runs measured.
    verdict = Verdict()
    for name, (walls, _) in samples.items():
        verdict.require(len(walls) == args.runs, f"{name}: {len(walls)} of {args.runs} runs measured")
    return verdict.finish()


if __name__ == "__main__":
    sys.exit(main())
