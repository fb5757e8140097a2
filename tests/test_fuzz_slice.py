"""The suite's share of `make fuzz`: every target replays its committed corpus (tests/fuzz/corpus/<target>/), then a
fixed number of mutations from a fixed seed, so that it is the same test every run. Random exploration stays in
`make fuzz`, which adds every failing input it finds to that corpus. No bound on CPU or wall time here: the
campaign's 100 ms-per-input hang check is a measurement, and measurements belong to `make fuzz`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fuzz.__main__ import CORPUS
from tests.fuzz.targets import TARGETS

REPO = Path(__file__).resolve().parents[1]


def test_every_target_has_a_committed_corpus() -> None:
    how = "grow one: .venv/bin/python -m tests.fuzz --target NAME --inputs 600 --grow-corpus, and commit it"
    missing = sorted(name for name in TARGETS if not (CORPUS / name).is_dir() or not any((CORPUS / name).iterdir()))
    assert missing == [], f"fuzz targets with no corpus under tests/fuzz/corpus/: {missing}; {how}"
    stale = sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and p.name not in TARGETS)
    assert stale == [], f"corpora of targets that no longer exist: {stale}"


def test_every_fuzz_target_survives_its_corpus_and_a_fixed_seed() -> None:
    before = set(REPO.glob("crash-*")) | set(REPO.glob("timeout-*")) | set(REPO.glob("oom-*"))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "--replay", "--inputs", "5000"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "crashes and hangs (no CPU bound (replay)): 0" in proc.stdout
    after = set(REPO.glob("crash-*")) | set(REPO.glob("timeout-*")) | set(REPO.glob("oom-*"))
    assert after == before  # libFuzzer writes what fails under the run's own directory, never the repository's root
