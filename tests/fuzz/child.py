"""One fuzz target under libFuzzer, in a process of its own (run by `python -m tests.fuzz`):

    python -m tests.fuzz.child TARGET --runs N --hang-file F --rss-mb M [--cpu-limit-ms MS] [--seed S]
        --artifacts PREFIX CORPUS_DIR [MORE_CORPUS_DIRS...]

Our modules are imported under atheris's instrumentation, so libFuzzer's coverage guidance sees their branches.
libFuzzer writes the units it finds into the first corpus directory and a failing input to `PREFIX<kind>-<sha1>`
(never into the working directory, which is the repository's root). An exception escaping a target ends the process
with libFuzzer's "fuzz target exited", after the Python traceback that says what it was.
"""

from __future__ import annotations

import argparse
import gc
import time

import atheris


class Hang(Exception):
    """One input took more CPU than a parser may spend on it."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.child")
    parser.add_argument("target")
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--hang-file", required=True)
    parser.add_argument("--rss-mb", type=int, required=True)
    parser.add_argument("--artifacts", required=True, help="libFuzzer's -artifact_prefix")
    parser.add_argument("--cpu-limit-ms", type=float, default=0.0, help="0: no per-input CPU bound")
    parser.add_argument("--seed", type=int, default=0, help="0: libFuzzer picks one")
    args = parser.parse_args()
    with atheris.instrument_imports(include=["mesh", "transports"]):
        from tests.fuzz.targets import TARGETS
    target = TARGETS[args.target]
    limit_s = args.cpu_limit_ms / 1000
    # Everything imported so far (libp2p, atheris's instrumented modules) is long-lived: frozen, a full collection
    # no longer walks it, so no single input pays for one. A gen-2 pass over this heap costs tens of ms of CPU.
    gc.collect()
    gc.freeze()

    def one_input(data: bytes) -> None:
        started = time.process_time()
        target(data)
        spent = time.process_time() - started
        if limit_s and spent > limit_s:
            with open(args.hang_file, "ab") as f:
                f.write(len(data).to_bytes(4, "big") + data)
            raise Hang(f"{spent * 1000:.0f} ms of CPU for one input of {len(data)} bytes")

    flags = [
        f"-runs={args.runs}",
        f"-rss_limit_mb={args.rss_mb}",
        "-max_len=65536",
        "-timeout=60",  # a hang backstop only: per-input CPU is bounded by --cpu-limit-ms in the campaign
        "-print_final_stats=1",
        f"-artifact_prefix={args.artifacts}",
    ]
    if args.seed:
        flags.append(f"-seed={args.seed}")

    atheris.Setup(["tests.fuzz.child", *flags, *args.corpus], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
