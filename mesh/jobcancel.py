"""The runner's side of a cancel: the offer's own offerer, and only it, stops a job queued or running here.

A cancel is a signed `JobCancel` (transports/wire/jobs.py), so it may come by any route: on the offer stream
itself, on a stream of its own (`edgecoder cancel`), from a gossip offerer to its claimant. It names an offer id; the
job of that id must have been offered by the key that signed the cancel, else `not_offerer`, and the job goes on.

- A job still queued is answered at once with a signed `aborted` result (it never runs).
- A running job's run is stopped (executor/runcontrol.py): the container is killed, and the signed `aborted` result
  carries what the program printed so far. The cancel waits for it (bounded by the transport).
- A job that already finished keeps its result: the cancel gets that signed result (the last `capacity` answers are
  kept by offer id).

The signed answer goes back by the job's own route (the offer stream, or the result protocol to a gossip offerer)
and is also the cancel's answer, so a separate `edgecoder cancel` sees how the job ended.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

import structlog

from executor.contract import ErrorKind, ExecResult, QueueReason, refusal
from mesh.intake import Intake, Job
from transports.wire.jobs import open_cancel
from transports.wire.reasons import Reason, Rejected, Rejection

log = structlog.get_logger("edgecoder.cancel")

# Signed answers kept by offer id, so that a late cancel gets how the job ended.
FINISHED_CAPACITY = 1024


class RunnerCancels:
    def __init__(
        self,
        intake: Intake,
        answer_queued: Callable[[Job, ExecResult], Awaitable[None]],
        *,
        capacity: int = FINISHED_CAPACITY,
        on_cancel: Callable[[], object] = lambda: None,
    ) -> None:
        self._on_cancel = on_cancel
        self._intake = intake
        self._answer_queued = answer_queued
        self._finished: OrderedDict[bytes, tuple[bytes, bytes]] = OrderedDict()
        self.capacity = capacity
        self.cancelled = 0  # jobs stopped by their offerer's cancel
        self.refused: dict[str, int] = {}

    def answered(self, job: Job, signed: bytes) -> None:
        """A job's signed answer went out (or was about to): keep it for a late cancel."""
        offer = job.received.offer
        self._finished[offer.offer_id] = (offer.offerer, signed)
        self._finished.move_to_end(offer.offer_id)
        while len(self._finished) > self.capacity:
            self._finished.popitem(last=False)

    def __len__(self) -> int:
        return len(self._finished)

    async def cancel(self, raw: bytes, sender: str) -> bytes | Rejection:
        """The signed result the cancelled (or already finished) job ended with, or why the cancel is refused."""
        verdict = await self._cancel(raw, sender)
        if isinstance(verdict, Rejection):
            self.refused[str(verdict.reason)] = self.refused.get(str(verdict.reason), 0) + 1
        return verdict

    async def _cancel(self, raw: bytes, sender: str) -> bytes | Rejection:
        try:
            cancel = open_cancel(raw)
        except Rejected as rejected:
            return rejected.rejection
        finished = self._finished.get(cancel.offer_id)
        if finished is not None:
            offerer, signed = finished
            if offerer != cancel.offerer:
                return Rejection(Reason.NOT_OFFERER, "the cancel is signed by another key than the offer's")
            return signed  # it ended before the cancel came: that is how it ended
        job = self._intake.pending_job(cancel.offer_id)
        if job is None:
            return Rejection(Reason.UNKNOWN_OFFER, "no job with that offer id is queued, running or recently done here")
        if job.offerer != cancel.offerer:
            return Rejection(Reason.NOT_OFFERER, "the cancel is signed by another key than the offer's")
        if not job.cancelled:
            self.cancelled += 1
            self._on_cancel()
            log.info("job cancelled by its offerer", offer=cancel.offer_id.hex(), running=job.started, sender=sender)
        job.cancel()
        if not job.started:
            stopped = refusal(
                "cancelled by its offerer before it ran", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED
            )
            await self._answer_queued(job, stopped)
        await job.answered.wait()
        assert job.signed is not None
        return job.signed
