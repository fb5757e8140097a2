"""One vocabulary: every refusal and fault code is a `Reason`, every layer's own codes map onto it by a total table,
and the reference page is the one generated from them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.contract import ErrorKind, ExecResult, QueueReason
from transports.ble.reasons import AS_REASON, BleReason
from transports.direct import checked_answer, refusal_message
from transports.framing import FrameFault
from transports.vocabulary import VOCABULARIES, Vocabulary, layers_of
from transports.wire.codec import pack, unpack_strict
from transports.wire.reason_reference import REFERENCE
from transports.wire.reasons import (
    ERROR_KINDS,
    QUEUE_REASONS,
    RUN_RESULT_REFUSALS,
    WIRE_REFUSALS,
    Reason,
    Rejected,
    Rejection,
    run_result_of,
    wire_refusal,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("vocabulary", VOCABULARIES, ids=lambda v: v.name)
def test_every_layer_table_is_total_onto_reason(vocabulary: Vocabulary) -> None:
    if vocabulary.codes is not None:
        assert set(vocabulary.onto) == set(vocabulary.codes)
    assert all(isinstance(target, Reason) for target in vocabulary.onto.values())


@pytest.mark.parametrize("vocabulary", VOCABULARIES, ids=lambda v: v.name)
def test_a_layer_code_keeps_the_spelling_of_its_reason(vocabulary: Vocabulary) -> None:
    # The wire values of every layer are unchanged by the mapping: queueReason travels as the Reason's own word;
    # errorKind, fixed by the seed, only swaps its hyphens.
    for code, reason in vocabulary.onto.items():
        assert str(code).replace("-", "_") == str(reason)


def test_the_executor_tables_cover_both_of_its_enums() -> None:
    assert set(QUEUE_REASONS) == set(QueueReason) and set(ERROR_KINDS) == set(ErrorKind)


def test_every_reason_is_used_by_some_layer_and_has_its_reference_entry() -> None:
    for reason in Reason:
        assert layers_of(reason), f"{reason}: add it to WIRE_REFUSALS or to the layer table that uses it"
        assert reason in REFERENCE, f"{reason}: add its entry to transports/wire/reason_reference.py"
        cause, action = REFERENCE[reason]
        assert cause and action


def test_each_code_is_spelled_once_in_the_layers_that_may_import_the_floor() -> None:
    """No `"too_large" = ...` string of its own in any layer enum: each member is spelled `Reason.X`."""
    for path in ("transports/framing.py", "transports/ble/reasons.py", "transports/hardening/refusals.py"):
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "attr", "") == "StrEnum" for b in node.bases):
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign):
                        assert not isinstance(stmt.value, ast.Constant), f"{path}: {node.name} spells a code"
    tree = ast.parse((ROOT / "transports/wire/coordinator_errors.py").read_text())
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "CoordinatorReason"]
    assert classes and not any(isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) for s in classes[0].body)


def test_ble_codes_map_onto_refusals_the_wire_carries() -> None:
    assert set(AS_REASON) == set(BleReason)
    assert set(AS_REASON.values()) <= WIRE_REFUSALS


def test_frame_faults_map_onto_refusals_the_wire_carries() -> None:
    from transports.direct.messages import ANSWER_FRAME_REASONS, REQUEST_FRAME_REASONS

    for table in (REQUEST_FRAME_REASONS, ANSWER_FRAME_REASONS):
        assert set(table) == set(FrameFault) and set(table.values()) <= WIRE_REFUSALS


def test_a_peer_refusal_names_only_a_wire_refusal() -> None:
    assert wire_refusal("busy") is Reason.BUSY
    for not_a_refusal in ("internal", "peer_banned", "closed", "no_such_code", 7, None):
        assert wire_refusal(not_a_refusal) is None
    answer = checked_answer({"type": "refusal", "reason": "internal", "detail": ""}, "result")
    assert isinstance(answer, Rejection) and answer.reason is Reason.MALFORMED


def test_the_reference_page_is_the_generated_one() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_reasons.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr  # run scripts/gen_reasons.py and commit docs/reference/reasons.md
    page = (ROOT / "docs" / "reference" / "reasons.md").read_text()
    for reason in Reason:
        assert f"| `{reason}` |" in page


# -- the seed's contract: refusals that are a run's result ---------------------------------------------------------


def test_a_host_request_refusal_is_the_seeds_run_result() -> None:
    rejection = Rejected(Reason.SANDBOX_REQUIRED, "the offer asks for the host").rejection
    assert rejection.result == ExecResult(
        ok=False,
        stderr="sandbox_required_for_remote_task",
        exit_code=None,
        duration_ms=0,
        queue_for_cloud=True,
        queue_reason=QueueReason.SANDBOX_REQUIRED,
        error_kind=ErrorKind.SANDBOX_VIOLATION,
    )


@pytest.mark.parametrize("reason", sorted(RUN_RESULT_REFUSALS))
def test_each_run_result_refusal_is_a_run_that_never_started(reason: Reason) -> None:
    result = run_result_of(reason, "why")
    assert result is not None and not result.ok and result.exit_code is None and result.duration_ms == 0
    assert result.queue_for_cloud and QUEUE_REASONS[result.queue_reason] is reason  # type: ignore[index]
    assert result.stderr.startswith(str(reason))
    assert reason in WIRE_REFUSALS


def test_other_refusals_carry_no_run_result() -> None:
    for reason in WIRE_REFUSALS - set(RUN_RESULT_REFUSALS):
        assert Rejection(reason, "x").result is None
        assert "result" not in refusal_message(Rejection(reason, "x"))


def test_the_refusal_frame_carries_the_result_beside_the_code_and_round_trips() -> None:
    sent = Rejection(Reason.BUSY, "the intake queue is full", retry_after_ms=500)
    frame = unpack_strict(pack(refusal_message(sent)), max_size=8192)
    assert frame["reason"] == "busy" and frame["retryAfterMs"] == 500
    assert frame["result"] == {
        "ok": False,
        "stdout": "",
        "stderr": "busy: the intake queue is full",
        "exitCode": None,
        "durationMs": 0,
        "queueForCloud": True,
        "queueReason": "busy",
        "errorKind": "aborted",
        "stdoutTruncated": False,
        "stderrTruncated": False,
    }
    assert checked_answer(frame, "result") == sent


def test_a_carried_result_is_checked_as_strictly_as_a_signed_one() -> None:
    good = refusal_message(Rejection(Reason.SANDBOX_REQUIRED, ""))
    for bad in (
        {**good["result"], "ok": True},
        {**good["result"], "queueReason": "no_such_reason"},
        {**good["result"], "extra": 1},
        {**good["result"], "exitCode": "0"},
        "not a map",
    ):
        answer = checked_answer({**good, "result": bad}, "result")
        assert isinstance(answer, Rejection) and answer.reason is Reason.MALFORMED, bad


def test_a_refusal_from_a_peer_that_sends_no_result_still_gives_the_offerer_the_seed_shape() -> None:
    answer = checked_answer({"type": "refusal", "reason": "sandbox_required_for_remote_task", "detail": ""}, "result")
    assert isinstance(answer, Rejection) and answer.result is not None
    assert answer.result.stderr == "sandbox_required_for_remote_task"


def test_the_coordinators_offerer_prints_a_run_result_refusal_in_the_seeds_shape() -> None:
    from mesh.coordinator.cli import _refusal_line

    line = _refusal_line("busy", "the task table is full")
    assert line["ok"] is False and line["refusal"] == "busy" and line["detail"] == "the task table is full"
    assert (line["queueForCloud"], line["queueReason"], line["exitCode"]) == (True, "busy", None)
    assert _refusal_line("unknown_task", "") == {"ok": False, "refusal": "unknown_task", "detail": ""}


@settings(deadline=None, max_examples=200)  # no deadline: the machine is shared; the property is what counts
@given(
    reason=st.sampled_from(sorted(WIRE_REFUSALS)),
    detail=st.text(max_size=700),
    retry=st.none() | st.integers(1, 3_600_000),
)
def test_every_wire_refusal_round_trips_with_its_run_result(reason: Reason, detail: str, retry: int | None) -> None:
    sent = Rejection(reason, detail, retry)
    got = checked_answer(unpack_strict(pack(refusal_message(sent)), max_size=8192), "result")
    assert isinstance(got, Rejection)
    assert (got.reason, got.detail, got.retry_after_ms) == (reason, detail[:512], retry)
    assert got.result == sent.result  # carried on the wire, equal to what the code alone gives
    assert (got.result is None) == (reason not in RUN_RESULT_REFUSALS)
