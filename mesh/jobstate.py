"""One job's lifecycle, as its offerer keeps it: I/O-free, so that every transport and `/pull` drive the same
machine, and so that it can be tested as a state machine (tests/test_jobstate_model.py).

A job is tried in attempts. Each attempt is one signed offer (its own offer id; `attempt` in the v3 offer) and runs
on at most one runner. An attempt goes

    offered -> queued -> claimed -> running -> (succeeded | failed | cancelled | expired)

forward only (a direct offer skips `claimed`, an idle runner skips `queued`). The job's state is its current
attempt's, except that an attempt that ends by the runner's fault does not end the job: while attempts are left
(`max_attempts`, 3 by default) the offerer re-offers it to a runner that has not had it (`retry`). An attempt that
ends by the job's own fault (its timeout, its memory, the program's own failure, a subset violation) ends the job:
the same code gives the same error, so it is never retried. A cancel ends the job at once, unless it had already
ended: then the finished outcome stands and is what the cancel gets.

Every call returns a `Rejection` (or the new state); nothing here raises for a peer's bad timing: a late event for an
attempt that is no longer current is `stale_attempt`, an event for a finished job `job_finished`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from executor.contract import ErrorKind, ExecResult, QueueReason
from transports.wire.offers import MAX_ATTEMPTS
from transports.wire.reasons import Reason, Rejection

DEFAULT_MAX_ATTEMPTS = 3


class JobState(enum.StrEnum):
    OFFERED = "offered"
    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def rank(self) -> int:
        return _ORDER.index(self) if self in _ORDER else len(_ORDER)


_ORDER = (JobState.OFFERED, JobState.QUEUED, JobState.CLAIMED, JobState.RUNNING)
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.EXPIRED})


class Fault(enum.StrEnum):
    """Whose fault an unsuccessful attempt was: the runner's is retried elsewhere, the job's never."""

    NONE = "none"  # it succeeded
    RUNNER = "runner"
    JOB = "job"
    CANCELLED = "cancelled"  # the offerer stopped it


# Refusals that say nothing about the code: another runner may well run it.
_RUNNER_QUEUE_REASONS = frozenset(
    {
        QueueReason.SANDBOX_UNAVAILABLE,
        QueueReason.NODE_ERROR,
        QueueReason.BUSY,
        QueueReason.ISOLATION_INSUFFICIENT,
        QueueReason.ABORTED,  # aborted without our cancel: the runner shut down under it
    }
)


def fault_of(result: ExecResult, *, cancelled_by_offerer: bool = False) -> Fault:
    """Whose fault a runner's signed result says it was."""
    if result.ok:
        return Fault.NONE
    if result.error_kind is ErrorKind.ABORTED and cancelled_by_offerer:
        return Fault.CANCELLED
    if result.queue_reason in _RUNNER_QUEUE_REASONS:
        return Fault.RUNNER
    # timeout, memory-exceeded, execution-failed, outside_subset, a host sandbox refused: the code's own doing.
    return Fault.JOB


@dataclass(slots=True)
class Attempt:
    number: int
    offer_id: bytes
    state: JobState = JobState.OFFERED
    runner: str | None = None
    queue_position: int | None = None
    result: ExecResult | None = None
    fault: Fault | None = None
    why: str = ""


@dataclass(slots=True)
class JobLifecycle:
    """The offerer's record of one job over all its attempts."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    attempts: list[Attempt] = field(default_factory=list)
    # Set once the job has ended: how.
    outcome: JobState | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_attempts must be in [1, {MAX_ATTEMPTS}]")

    # -- what it is now ----------------------------------------------------------------------------------------

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    @property
    def state(self) -> JobState:
        if self.outcome is not None:
            return self.outcome
        current = self.current
        return JobState.OFFERED if current is None else current.state

    @property
    def attempt(self) -> int:
        return len(self.attempts)

    @property
    def runners_tried(self) -> frozenset[str]:
        return frozenset(a.runner for a in self.attempts if a.runner is not None)

    @property
    def result(self) -> ExecResult | None:
        """The final result, once the job has ended with one (a cancelled run's carries its output so far)."""
        current = self.current
        return current.result if self.ended and current is not None else None

    @property
    def retry_due(self) -> bool:
        """The current attempt ended by the runner's fault and another attempt may be made."""
        current = self.current
        return not self.ended and current is not None and current.fault is Fault.RUNNER

    # -- the offerer's steps -----------------------------------------------------------------------------------

    def offer(self, offer_id: bytes) -> Attempt | Rejection:
        """A new attempt under a fresh offer id: the first one, or a retry after a runner's fault."""
        if self.ended:
            return Rejection(Reason.JOB_FINISHED, f"the job ended {self.state}")
        current = self.current
        if current is not None and current.fault is not Fault.RUNNER:
            return Rejection(Reason.STALE_ATTEMPT, f"attempt {current.number} is still {current.state}")
        if any(a.offer_id == offer_id for a in self.attempts):
            return Rejection(Reason.MALFORMED, "an attempt needs a fresh offer id")
        if len(self.attempts) >= self.max_attempts:
            return Rejection(Reason.JOB_FINISHED, f"all {self.max_attempts} attempts are used")
        attempt = Attempt(len(self.attempts) + 1, offer_id)
        self.attempts.append(attempt)
        return attempt

    def claim(self, offer_id: bytes, runner: str) -> Rejection | None:
        """The offerer grants `runner` the current attempt. A runner that already had this job never gets it again:
        the same runner failing twice is not two opinions."""
        attempt = self._current(offer_id)
        if isinstance(attempt, Rejection):
            return attempt
        if runner in self.runners_tried and attempt.runner != runner:
            return Rejection(Reason.CLAIM_REFUSED, "this runner already had an attempt of this job")
        if attempt.runner is not None and attempt.runner != runner:
            return Rejection(Reason.CLAIM_REFUSED, "already claimed")
        return self._advance(attempt, JobState.CLAIMED, runner)

    def cancel(self) -> JobState:
        """The offerer stops the job. Its state afterwards: `cancelled`, or how it had already ended."""
        return self._end(JobState.CANCELLED)

    def expire(self) -> JobState:
        """The offerer's deadline passed with no result: the job ends `expired` (a running runner is told to stop)."""
        return self._end(JobState.EXPIRED)

    def _end(self, outcome: JobState) -> JobState:
        if self.outcome is None:
            self.outcome = outcome
            current = self.current
            # An attempt still under way ends with the job; one that already ended by its runner's fault stays so.
            if current is not None and not current.state.terminal:
                current.state = outcome
                current.fault = Fault.CANCELLED if outcome is JobState.CANCELLED else Fault.RUNNER
        return self.state

    # -- what runners report (each signed by the runner; the caller has checked the signature) -----------------

    def queued(self, offer_id: bytes, runner: str, position: int) -> Rejection | None:
        attempt = self._reported(offer_id, runner)
        if isinstance(attempt, Rejection):
            return attempt
        refusal = self._advance(attempt, JobState.QUEUED, runner)
        if refusal is None:
            attempt.queue_position = position
        return refusal

    def running(self, offer_id: bytes, runner: str) -> Rejection | None:
        attempt = self._reported(offer_id, runner)
        if isinstance(attempt, Rejection):
            return attempt
        return self._advance(attempt, JobState.RUNNING, runner)

    def finished(self, offer_id: bytes, runner: str, result: ExecResult) -> Rejection | None:
        """The runner's signed result for the current attempt. A success or the job's own fault ends the job; a
        runner's fault ends the attempt, and the job too once no attempt is left. After a cancel (or expiry), the
        stopped run's own result is still taken once, for the output it carries; the job stays as it ended."""
        current = self.current
        stopped = (JobState.CANCELLED, JobState.EXPIRED)
        if (
            current is not None
            and current.offer_id == offer_id
            and current.state in stopped
            and current.result is None
            and current.runner == runner
        ):
            current.result = result
            return None
        attempt = self._reported(offer_id, runner)
        if isinstance(attempt, Rejection):
            return attempt
        attempt.runner = runner
        attempt.result = result
        attempt.fault = fault_of(result)
        attempt.state = JobState.SUCCEEDED if attempt.fault is Fault.NONE else JobState.FAILED
        if attempt.fault is not Fault.RUNNER or len(self.attempts) >= self.max_attempts:
            self.outcome = attempt.state
        return None

    def runner_lost(self, offer_id: bytes, why: str) -> Rejection | None:
        """The current attempt's runner vanished, could not be reached, or let its claim lapse with no result: the
        runner's fault."""
        attempt = self._current(offer_id)
        if isinstance(attempt, Rejection):
            return attempt
        attempt.state, attempt.fault, attempt.why = JobState.FAILED, Fault.RUNNER, why
        if len(self.attempts) >= self.max_attempts:
            self.outcome = JobState.FAILED
        return None

    # -- helpers -----------------------------------------------------------------------------------------------

    def _current(self, offer_id: bytes) -> Attempt | Rejection:
        if self.ended:
            return Rejection(Reason.JOB_FINISHED, f"the job ended {self.state}")
        current = self.current
        if current is None or current.offer_id != offer_id:
            known = any(a.offer_id == offer_id for a in self.attempts)
            return Rejection(
                Reason.STALE_ATTEMPT if known else Reason.UNKNOWN_OFFER,
                "an earlier attempt of this job" if known else "no attempt of this job has that offer id",
            )
        if current.state.terminal:
            return Rejection(Reason.STALE_ATTEMPT, f"attempt {current.number} already ended {current.state}")
        return current

    def _reported(self, offer_id: bytes, runner: str) -> Attempt | Rejection:
        attempt = self._current(offer_id)
        if isinstance(attempt, Rejection):
            return attempt
        if attempt.runner is not None and attempt.runner != runner:
            return Rejection(Reason.WRONG_EXECUTOR, "another runner holds this attempt")
        if attempt.runner is None and runner in self.runners_tried:
            return Rejection(Reason.CLAIM_REFUSED, "this runner already had an attempt of this job")
        return attempt

    @staticmethod
    def _advance(attempt: Attempt, to: JobState, runner: str) -> Rejection | None:
        if to.rank < attempt.state.rank:
            return Rejection(Reason.STALE_ATTEMPT, f"attempt {attempt.number} is already {attempt.state}")
        attempt.state, attempt.runner = max(attempt.state, to, key=lambda s: s.rank), runner
        return None
