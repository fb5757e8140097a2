"""One fuzz target under libFuzzer: `python -m tests.fuzz.child TARGET RUNS CORPUS_DIR HANG_FILE RSS_MB`.

Our modules are imported under atheris's instrumentation, so libFuzzer's coverage guidance sees their branches.
"""

from __future__ import annotations

import sys
import time

import atheris

HANG_CPU_S = 0.1


class Hang(Exception):
    """One input took more CPU than a parser may spend on it."""


def main() -> None:
    name, runs, corpus, hang_file, rss_mb = sys.argv[1:6]
    with atheris.instrument_imports(include=["mesh", "transports"]):
        from tests.fuzz.targets import TARGETS
    target = TARGETS[name]

    def one_input(data: bytes) -> None:
        started = time.process_time()
        target(data)
        spent = time.process_time() - started
        if spent > HANG_CPU_S:
            with open(hang_file, "ab") as f:
                f.write(len(data).to_bytes(4, "big") + data)
            raise Hang(f"{spent * 1000:.0f} ms of CPU for one input of {len(data)} bytes")

    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={runs}",
            f"-rss_limit_mb={rss_mb}",
            "-max_len=65536",
            "-timeout=10",
            "-print_final_stats=1",
            corpus,
        ],
        one_input,
    )
    atheris.Fuzz()


if __name__ == "__main__":
    main()
