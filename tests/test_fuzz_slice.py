"""The suite's slice of `make fuzz`: every target, a few thousand inputs, no crash, no hang, bounded memory."""

from __future__ import annotations

import subprocess
import sys


def test_every_fuzz_target_survives_a_slice() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "--inputs", "20000"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "crashes and hangs (> 100 ms CPU): 0" in proc.stdout
