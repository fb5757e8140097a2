"""The subset checker process: the same verdicts as check_subset, bounded CPU and memory, and it survives its child."""

from __future__ import annotations

import os
import signal

import trio

from executor.checker import SubsetChecker
from executor.subset import TOO_COMPLEX, SubsetViolation, check_subset

DENSE_128K = "x;" * (64 * 1024)  # 128 KiB of statements: about 0.3 s of CPU and 130 MiB to parse


async def test_verdicts_are_check_subsets_own() -> None:
    checker = SubsetChecker()
    try:
        for language, code in [
            ("python", "import json\nprint(1)"),
            ("python", "x = 1\nimport socket"),
            ("python", "a" + ".b" * 60000),
            ("javascript", "require('fs')"),
            ("javascript", "console.log('\ud800 surrogate')"),
            ("ruby", "puts 1"),
        ]:
            assert await checker.check(language, code) == check_subset(language, code)
        assert checker.started == 1  # one long-lived child served them all
    finally:
        await checker.aclose()


async def test_memory_is_bounded_and_the_child_survives_it() -> None:
    checker = SubsetChecker(memory_bytes=96 << 20)
    try:
        assert await checker.check("python", DENSE_128K) == SubsetViolation(TOO_COMPLEX, None)
        assert await checker.check("python", "import socket") == SubsetViolation("import socket", 1)
        assert checker.started == 1
    finally:
        await checker.aclose()


async def test_cpu_is_bounded_per_check() -> None:
    checker = SubsetChecker(cpu_s=0)  # at most about one second of CPU per check
    try:
        # Numbers are skipped without a token: about 3 s of CPU in well under the memory bound.
        violation = await checker.check("javascript", "1 " * (4 << 20))
        assert (
            violation is not None and violation.construct == "code could not be checked: it used more than 0 s of CPU"
        )
        # The next check gets a new child.
        assert await checker.check("python", "print(1)") is None
        assert checker.started == 2
    finally:
        await checker.aclose()


async def test_a_child_killed_from_outside_refuses_that_check_and_the_next_one_works() -> None:
    checker = SubsetChecker()
    try:
        await checker.start()
        assert checker._process is not None
        os.kill(checker._process.pid, signal.SIGKILL)
        violation = await checker.check("python", "print(1)")
        assert violation is not None and "killed by signal 9" in violation.construct
        assert await checker.check("python", "print(1)") is None
    finally:
        await checker.aclose()


async def test_a_cancelled_check_leaves_no_child_and_the_next_one_works() -> None:
    checker = SubsetChecker()
    try:
        with trio.move_on_after(0.05):
            await checker.check("python", DENSE_128K * 4)
        assert checker._process is None
        assert await checker.check("python", "import socket") == SubsetViolation("import socket", 1)
    finally:
        await checker.aclose()


async def test_too_slow_a_check_is_refused_and_its_child_killed() -> None:
    checker = SubsetChecker(wall_s=0.05)
    try:
        violation = await checker.check("python", DENSE_128K * 4)
        assert violation is not None and violation.construct == "code took more than 0.05 s to check"
        assert checker._process is None
    finally:
        await checker.aclose()


async def test_close_ends_the_child() -> None:
    checker = SubsetChecker()
    await checker.start()
    process = checker._process
    assert process is not None
    await checker.aclose()
    assert process.returncode == 0
