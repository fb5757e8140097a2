"""The README's main job: the demo mesh runs real offers in Docker and every expectation it prints holds, the
programs' outputs included (5050, fib(90), only `lo`, the BLE hello); a wrong output fails the demo, saying which."""

from __future__ import annotations

import hashlib

import pytest
import trio

from executor.contract import ExecResult
from mesh import demo
from mesh.demo import BLE_HELLO, FIB_90, SUM_OF_1_TO_100, WHOAMI, run_demo, wrong_output
from mesh.offerer import OfferOutcome
from transports.wire.identity import NodeIdentity
from transports.wire.offers import TaskOffer
from transports.wire.reasons import Reason, Rejection
from transports.wire.results import TaskResult

RUNNER = NodeIdentity.generate()


def ran(stdout: str, *, ok: bool = True) -> OfferOutcome:
    offer = TaskOffer.create(RUNNER, language="python", code="print(1)")
    digest = hashlib.sha256(offer.sign(RUNNER)).digest()
    result = ExecResult(ok=ok, stdout=stdout, exit_code=0 if ok else 1, duration_ms=3, stderr="" if ok else "boom")
    return OfferOutcome(result=TaskResult(offer.offer_id, digest, RUNNER.public_key, result))


def test_an_output_is_right_only_when_it_is_exactly_what_the_program_prints() -> None:
    assert wrong_output(ran("sum of 100 numbers = 5050\n"), SUM_OF_1_TO_100) is None
    assert wrong_output(ran("fib(90) = 2880067194370816120\n"), FIB_90) is None
    assert wrong_output(ran("uid 65534 interfaces ['lo']\n"), WHOAMI) is None
    assert wrong_output(ran("hello over BLE from a neighbour\n"), BLE_HELLO) is None

    assert wrong_output(ran("sum of 100 numbers = 5051\n"), SUM_OF_1_TO_100) == (
        "it printed 'sum of 100 numbers = 5051', not 'sum of 100 numbers = 5050'"
    )
    assert "does not match" in (wrong_output(ran("uid 0 interfaces ['lo']"), WHOAMI) or "")  # root inside
    assert "does not match" in (wrong_output(ran("uid 9 interfaces ['eth0', 'lo']"), WHOAMI) or "")
    assert wrong_output(ran("", ok=False), FIB_90) == "the run failed (None): 'boom'"
    refused = OfferOutcome(refusal=Rejection(Reason.BUSY, "full"))
    assert wrong_output(refused, FIB_90) == "no result (busy)"


@pytest.mark.docker
def test_the_demo_holds_every_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    assert trio.run(run_demo, 2, True) == 0
    out = capsys.readouterr().out
    assert "ran on exactly 1 node(s)" in out
    for printed in (SUM_OF_1_TO_100, FIB_90, BLE_HELLO, "interfaces ['lo']"):
        assert printed in out, printed
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


@pytest.mark.docker
def test_a_program_that_prints_the_wrong_answer_fails_the_demo_saying_which(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before issue 21 the demo only checked that each run said ok: a sum off by one passed."""
    monkeypatch.setattr(demo, "SUM_PY", demo.SUM_PY.replace("{sum(xs)}", "{sum(xs) + 1}"))
    assert trio.run(run_demo, 2, False) == 1
    out = capsys.readouterr().out
    assert "DEMO FAILED, what did not hold:" in out
    assert "the gossip offer sums 1 to 100: it printed 'sum of 100 numbers = 5051'" in out
