"""`python -m simulations <scenario|all> [--quick] [--nodes N] [--workers W] [--out DIR]`"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio

from simulations.registry import SCENARIOS, scenario
from simulations.scenario import DEFAULT_OUT, Options, quiet_logs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--quick", action="store_true", help="the CI size: seconds to about a minute each")
    parser.add_argument("--nodes", type=int, default=None, help="total nodes (each scenario has its own default)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports go to OUT/<scenario>/")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4, help="worker processes for scaling-procs")
    parser.add_argument("--isolation", default="runc", help="tiers the runners offer (hostile): runc, gvisor")
    args = parser.parse_args(argv)
    quiet_logs()
    options = Options(
        quick=args.quick, nodes=args.nodes, out=args.out, seed=args.seed, workers=args.workers, isolation=args.isolation
    )
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in names:
        started = time.monotonic()
        report, _ = trio.run(scenario(name), options)
        path = report.write()
        print(f"{name}: {path} ({time.monotonic() - started:.0f} s)")
        print("\n".join(report.lines[2:]).split("![")[0].strip())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
