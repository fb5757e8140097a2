"""The README's main job: the demo mesh runs real offers in Docker and every expectation it prints holds."""

from __future__ import annotations

import pytest
import trio

from mesh.demo import run_demo

pytestmark = pytest.mark.docker


def test_the_demo_holds_every_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    assert trio.run(run_demo, 2, True) == 0
    out = capsys.readouterr().out
    assert "ran on exactly 1 node(s)" in out
    assert "sandbox_unavailable" in out and "sandbox_required_for_remote_task" in out
    assert "bad_signature" in out and "replayed" in out
    assert "BLE offer from a nearby laptop       ok" in out
    assert "Every expectation held." in out
    # Issue 15: an expected refusal reads as one, each with its reason; nothing reads as a failure.
    for reason in (
        "sandbox_unavailable",
        "sandbox_required_for_remote_task",
        "bad_signature",
        "replayed",
        "wrong_audience",
        "isolation_insufficient",
    ):
        assert f"refused, as expected: {reason}" in out, reason
    assert "FAILED" not in out and "REFUSED" not in out
