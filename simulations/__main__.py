"""`python -m simulations <scenario|all> [--quick] [--nodes N[,N...]] [--workers W] [--out DIR] [--json FILE]`"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio

from simulations.registry import SCENARIOS, scenario
from simulations.scenario import DEFAULT_OUT, Options, quiet_logs


def node_counts(text: str) -> tuple[int, ...]:
    """`16` or `16,64,200`: each a whole number of at least 2."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count or a comma-separated list of them") from None
    if not counts or min(counts) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: every size needs at least 2 nodes")
    return counts


def on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: on or off")
    return text == "on"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulations", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--quick", action="store_true", help="the CI size: seconds to about a minute each")
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=None,
        help="total nodes (each scenario has its own default); `scale` sweeps a comma-separated list, 16,64,200",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="reports go to OUT/<scenario>/")
    parser.add_argument("--json", type=Path, default=None, help="`scale`: also write its figures to this file")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4, help="worker processes for scaling-procs and scale")
    parser.add_argument("--isolation", default="runc", help="tiers the runners offer (hostile): runc, gvisor")
    parser.add_argument("--grief", type=int, default=0, help="`scale`: runners that claim and never deliver, or die")
    parser.add_argument("--offers", type=int, default=0, help="`scale`: offers per size (0: its default)")
    parser.add_argument("--rate", type=float, default=0.0, help="`scale`: offers a second (0: its default)")
    parser.add_argument("--adaptive-gossip", type=on_off, default=False, help="py-libp2p's adaptive gossip: on|off")
    parser.add_argument(
        "--eclipse-protection", type=on_off, default=True, help="py-libp2p's eclipse protection: on|off"
    )
    args = parser.parse_args(argv)
    quiet_logs()
    sizes: tuple[int, ...] = args.nodes or ()
    options = Options(
        quick=args.quick,
        nodes=max(sizes) if sizes else None,
        out=args.out,
        seed=args.seed,
        workers=args.workers,
        sizes=sizes,
        json=args.json,
        grief=args.grief,
        offers=args.offers,
        rate=args.rate,
        adaptive_gossip=args.adaptive_gossip,
        eclipse_protection=args.eclipse_protection,
        isolation=args.isolation,
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
