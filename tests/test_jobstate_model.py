"""A stateful model of one job's lifecycle (mesh.jobstate): under any interleaving of offers, claims, runners'
reports, lost runners, cancels and expiry, an ended job never changes again, an attempt's state only moves forward,
no runner gets two attempts of one job, the job's own fault is never retried, a runner's fault is retried while
attempts are left and ends the job once none are, and a cancel of an ended job gets how it ended."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from executor.contract import ErrorKind, ExecResult, QueueReason
from mesh.jobstate import Fault, JobLifecycle, JobState, fault_of
from transports.wire.reasons import Reason, Rejection

RUNNERS = [f"runner-{n}" for n in range(3)]  # few, so that a runner asking again is common

OUTCOMES: dict[str, ExecResult] = {
    "ok": ExecResult(ok=True, stdout="6\n", exit_code=0),
    "timeout": ExecResult(ok=False, exit_code=124, error_kind=ErrorKind.TIMEOUT, queue_reason=QueueReason.TIMEOUT),
    "memory": ExecResult(
        ok=False, exit_code=137, error_kind=ErrorKind.MEMORY_EXCEEDED, queue_reason=QueueReason.MEMORY
    ),
    "exit 1": ExecResult(ok=False, exit_code=1, error_kind=ErrorKind.EXECUTION_FAILED),
    "subset": ExecResult(ok=False, error_kind=ErrorKind.SANDBOX_VIOLATION, queue_reason=QueueReason.OUTSIDE_SUBSET),
    "no sandbox": ExecResult(
        ok=False, error_kind=ErrorKind.SANDBOX_VIOLATION, queue_reason=QueueReason.SANDBOX_UNAVAILABLE
    ),
    "node error": ExecResult(ok=False, error_kind=ErrorKind.EXECUTION_FAILED, queue_reason=QueueReason.NODE_ERROR),
    "shut down": ExecResult(ok=False, error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED),
}
JOB_FAULTS = {"timeout", "memory", "exit 1", "subset"}


class JobModel(RuleBasedStateMachine):
    @initialize(max_attempts=st.integers(1, 4))
    def start(self, max_attempts: int) -> None:
        self.job = JobLifecycle(max_attempts=max_attempts)
        self.next_id = 0
        self.ended_as: tuple[JobState, ExecResult | None, int] | None = None
        self.ranks: dict[int, int] = {}

    def _fresh_id(self) -> bytes:
        self.next_id += 1
        return self.next_id.to_bytes(16, "big")

    @property
    def _offer_id(self) -> bytes:
        current = self.job.current
        return b"\xff" * 16 if current is None else current.offer_id

    @rule()
    def offer(self) -> None:
        before = self.job.attempt
        may = not self.job.ended and (self.job.current is None or self.job.retry_due)
        answer = self.job.offer(self._fresh_id())
        assert isinstance(answer, Rejection) != may, (answer, may)
        assert self.job.attempt == before + (0 if isinstance(answer, Rejection) else 1)

    @rule(runner=st.sampled_from(RUNNERS))
    def claim(self, runner: str) -> None:
        tried_before = runner in self.job.runners_tried
        current = self.job.current
        holder = None if current is None else current.runner
        answer = self.job.claim(self._offer_id, runner)
        if tried_before and holder != runner:
            assert answer is not None, "a runner got a second attempt of one job"

    @rule(runner=st.sampled_from(RUNNERS), position=st.integers(1, 32))
    def queued(self, runner: str, position: int) -> None:
        self.job.queued(self._offer_id, runner, position)

    @rule(runner=st.sampled_from(RUNNERS))
    def running(self, runner: str) -> None:
        self.job.running(self._offer_id, runner)

    @rule(runner=st.sampled_from(RUNNERS), outcome=st.sampled_from(sorted(OUTCOMES)))
    def finished(self, runner: str, outcome: str) -> None:
        answer = self.job.finished(self._offer_id, runner, OUTCOMES[outcome])
        if answer is None and outcome in JOB_FAULTS | {"ok"}:
            assert self.job.ended, "a success or the job's own fault left the job open"
            assert not self.job.retry_due

    @rule()
    def runner_lost(self) -> None:
        answer = self.job.runner_lost(self._offer_id, "vanished")
        if answer is None:
            assert self.job.ended == (self.job.attempt >= self.job.max_attempts)

    @rule(index=st.integers(0, 3), runner=st.sampled_from(RUNNERS))
    def stale_report(self, index: int, runner: str) -> None:
        """A report for an earlier attempt changes nothing."""
        if index >= self.job.attempt - 1:
            return
        before = [(a.state, a.runner, a.result) for a in self.job.attempts]
        answer = self.job.finished(self.job.attempts[index].offer_id, runner, OUTCOMES["ok"])
        assert isinstance(answer, Rejection)
        assert answer.reason in (Reason.STALE_ATTEMPT, Reason.JOB_FINISHED)
        assert before == [(a.state, a.runner, a.result) for a in self.job.attempts]

    @rule()
    def cancel(self) -> None:
        ended_as = self.job.state if self.job.ended else None
        state = self.job.cancel()
        assert state == (ended_as or JobState.CANCELLED)
        assert self.job.ended

    @rule()
    def expire(self) -> None:
        ended_as = self.job.state if self.job.ended else None
        assert self.job.expire() == (ended_as or JobState.EXPIRED)

    @invariant()
    def an_ended_job_never_changes(self) -> None:
        """Its state and attempts stay; its result too, except that a stopped run's own result may still arrive."""
        if self.ended_as is not None:
            state, result, attempt = self.ended_as
            assert (self.job.state, self.job.attempt) == (state, attempt)
            stopped = state in (JobState.CANCELLED, JobState.EXPIRED) and result is None
            assert self.job.result == result or stopped
        if self.job.ended:
            self.ended_as = (self.job.state, self.job.result, self.job.attempt)

    @invariant()
    def attempts_move_forward_and_stay_within_their_budget(self) -> None:
        if not hasattr(self, "job"):
            return
        assert self.job.attempt <= self.job.max_attempts
        for attempt in self.job.attempts:
            assert attempt.state.rank >= self.ranks.get(attempt.number, 0), "an attempt's state went back"
            self.ranks[attempt.number] = attempt.state.rank

    @invariant()
    def no_runner_twice_and_only_the_runners_fault_is_retried(self) -> None:
        if not hasattr(self, "job"):
            return
        runners = [a.runner for a in self.job.attempts if a.runner is not None]
        assert len(runners) == len(set(runners)), "one runner had two attempts of the job"
        for attempt in self.job.attempts[:-1]:
            assert attempt.fault is Fault.RUNNER, "an attempt that did not fail by its runner was retried"
        if self.job.state.terminal and not self.job.ended:
            assert self.job.retry_due and self.job.attempt < self.job.max_attempts

    @precondition(lambda self: hasattr(self, "job") and self.job.ended and self.job.result is not None)
    @invariant()
    def a_final_result_says_how_the_job_ended(self) -> None:
        result = self.job.result
        assert result is not None
        fault = fault_of(result)
        if self.job.state is JobState.SUCCEEDED:
            assert fault is Fault.NONE
        if self.job.state is JobState.FAILED:
            assert fault is Fault.JOB or self.job.attempt == self.job.max_attempts, (
                "a runner's fault ended a job with attempts left"
            )

    @rule(runner=st.sampled_from(RUNNERS), outcome=st.sampled_from(["shut down", "ok"]))
    def stopped_run_reports(self, runner: str, outcome: str) -> None:
        """The stopped run's own result arrives after the cancel: taken once, the job stays cancelled."""
        if self.job.state is not JobState.CANCELLED:
            return
        self.job.finished(self._offer_id, runner, OUTCOMES[outcome])
        assert self.job.state is JobState.CANCELLED


JobModel.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)  # deadline: shared CPU
test_job_lifecycle = JobModel.TestCase


def test_whose_fault() -> None:
    assert {name for name, r in OUTCOMES.items() if fault_of(r) is Fault.JOB} == JOB_FAULTS
    assert fault_of(OUTCOMES["shut down"], cancelled_by_offerer=True) is Fault.CANCELLED
    assert fault_of(OUTCOMES["ok"]) is Fault.NONE
