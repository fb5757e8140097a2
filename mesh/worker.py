"""The runner's side of a node: its workers take admitted jobs from the intake, claim each (gossip and BLE), run it
in the executor under the operator's policy, sign the result and hand it back to the transport that brought the
offer. `MeshNode` (mesh/node.py) is a `Runner`; the state below is the node's, set up by its constructor.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog
import trio

from executor.contract import ErrorKind, ExecRequest, ExecResult, QueueReason, refusal
from mesh.intake import Intake, Job
from mesh.jobcancel import RunnerCancels
from mesh.jobstream import JobStream
from mesh.metrics import NodeMetrics
from mesh.status import JobLog
from transports.wire.identity import NodeIdentity
from transports.wire.peerid import ed25519_peer_id
from transports.wire.results import TaskResult
from transports.wire.sealed import Payload

if TYPE_CHECKING:
    from executor.runner import Executor
    from mesh.gate import SandboxGate

log = structlog.get_logger("edgecoder.node")

# How long a finished run's remaining live output may take to reach its follower before the result goes anyway.
STREAM_FLUSH_S = 10.0


class Runner:
    """The worker loop and the life of one job, as a part of the node (a mixin: its state is the node's)."""

    identity: NodeIdentity
    intake: Intake
    executor: Executor | None
    gate: SandboxGate
    metrics: NodeMetrics
    cancels: RunnerCancels
    job_log: JobLog
    # Offer ids whose code this node ran in a container, newest last, for tests, simulations and `jobs`; bounded.
    ran: collections.deque[bytes]
    _nursery: trio.Nursery
    _draining: bool
    _workers_left: int
    _workers_done: trio.Event

    async def _work(self) -> None:
        try:
            async for job in self.intake.jobs:
                await self._handle_guarded(job)
        finally:
            self._workers_left -= 1
            if self._workers_left == 0:
                self._workers_done.set()

    async def drain(self, grace: float = 5.0) -> None:
        """Shut down gracefully: take no more offers, abort the runs in flight, and give the workers `grace`
        seconds to send each offerer its signed `aborted` result. Leaving `open` afterwards removes every container.
        """
        self._draining = True
        self.intake.close()  # the workers finish the queue (answering `aborted`) and then stop
        if self.executor is not None:
            self.executor.abort_all()
        with trio.move_on_after(grace):
            await self._workers_done.wait()

    async def _handle_guarded(self, job: Job) -> None:
        """The error boundary of one job: whatever goes wrong is this offer's failure, never the node's.

        It is logged with the offer id, counted, and answered with a signed `execution-failed` result (unless an
        answer already went out); the worker then takes the next job. Cancellation is not caught here: the node's
        own shutdown still stops the worker.
        """
        offer = job.received.offer
        answered = False
        record = self.job_log.taken(job)

        async def answer(result: ExecResult) -> None:
            nonlocal answered
            answered = True
            self.job_log.answered(record, result)
            await self._reply(job, result)

        try:
            await self._handle(job, answer)
        except Exception as exc:
            self.metrics.job_failures.inc()
            log.exception("job failed", offer=offer.offer_id.hex(), transport=job.delivery.transport)
            if not answered:
                failure = refusal(
                    f"the node failed while handling this offer ({type(exc).__name__})",
                    error_kind=ErrorKind.EXECUTION_FAILED,
                    queue_reason=QueueReason.NODE_ERROR,
                )
                try:
                    await self._reply(job, failure)
                except Exception:
                    log.exception("could not answer a failed job", offer=offer.offer_id.hex())
        finally:
            self.intake.finished(job)
            self.job_log.done(job, record, abandoned=job.delivery.scope.cancelled_caught)

    async def _handle(self, job: Job, answer: Callable[[ExecResult], Awaitable[None]]) -> None:
        offer = job.received.offer
        if job.signed is not None:
            return  # cancelled by its offerer while queued, and answered then (mesh/jobcancel.py)
        if self._draining:
            await answer(refusal("node shutting down", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED))
            return
        if not self.gate.participating:
            # Admitted before the gate closed: the offerer still gets a signed, typed answer.
            await answer(
                refusal(
                    "sandbox_unavailable",
                    error_kind=ErrorKind.SANDBOX_VIOLATION,
                    queue_reason=QueueReason.SANDBOX_UNAVAILABLE,
                )
            )
            return
        # The transport owns this scope and cancels it when the offerer stops waiting: the cancel reaches the
        # claim, or the container, which the executor then kills.
        granted = False
        result: ExecResult | None = None
        with job.delivery.scope:
            granted = await self._claim(job)
            if granted:
                self.job_log.running(job)
                result = await self._run(job)
        if job.delivery.scope.cancelled_caught:
            log.info("offer abandoned by its offerer", offer=offer.offer_id.hex(), claimed=granted)
            self.metrics.abandoned.inc()
            if not granted:
                return
            result = refusal(
                "the offerer stopped waiting", error_kind=ErrorKind.ABORTED, queue_reason=QueueReason.ABORTED
            )
        if result is None:
            return  # the claim went to another node
        log.info(
            "offer answered",
            offer=offer.offer_id.hex(),
            offerer=ed25519_peer_id(offer.offerer),
            transport=job.delivery.transport,
            ok=result.ok,
            error_kind=result.error_kind and str(result.error_kind),
            queue_reason=result.queue_reason,
            duration_ms=result.duration_ms,
            waited_ms=round((time.monotonic() - job.admitted_at) * 1000) - result.duration_ms,
        )
        await answer(result)
        if result.exit_code is not None:
            self.intake.served(job)  # its code ran here and was answered: the offerer is known to this node now

    async def _claim(self, job: Job) -> bool:
        try:
            granted = await job.delivery.claim()
        except Exception as exc:  # a transport failure while claiming is the claim lost, not a crash
            log.warning("claim failed", offer=job.received.offer.offer_id.hex(), error=repr(exc))
            granted = False
        self.metrics.claims.labels("granted" if granted else "refused").inc()
        return granted

    async def _reply(self, job: Job, result: ExecResult) -> None:
        """Sign and send a job's one answer (a second one, as when a cancel and the worker race, is not sent); a
        cancel waiting for it gets it too."""
        if job.signed is not None:
            return
        offer = job.received.offer
        answer = TaskResult.answering(offer, job.received.digest, self.identity.public_key, result)
        if job.stream is not None and job.stream.follow and answer.version >= 2:
            # What the follower was shown, signed: it checks its own digest of the chunks against this one.
            digest, dropped = job.stream.digest.digest(), job.stream.dropped
            answer = dataclasses.replace(answer, stream_digest=digest, stream_dropped=dropped)
        signed = answer.sign(self.identity)
        job.signed = signed
        self.cancels.answered(job, signed)
        job.answered.set()
        try:
            await job.delivery.reply(signed)
        except Exception as exc:  # the offerer went away; the result is lost to it, the node keeps serving
            log.warning("reply failed", offer=offer.offer_id.hex(), error=repr(exc))

    async def _run(self, job: Job) -> ExecResult:
        offer = job.received.offer
        assert self.executor is not None
        if offer.sealed is not None:
            # The payload the grant carried, checked against the offer's digests by the transport; anything else
            # (no payload, one that would not open or is not what the offer names) runs nothing.
            payload = job.delivery.payload
            if not isinstance(payload, Payload):
                why = payload.detail if payload is not None else "the grant carried no payload"
                log.warning("sealed payload refused", offer=offer.offer_id.hex(), detail=why)
                return refusal(
                    f"payload_mismatch: {why}",
                    error_kind=ErrorKind.EXECUTION_FAILED,
                    queue_reason=QueueReason.PAYLOAD_MISMATCH,
                    queue_for_cloud=False,
                )
            offer = offer.opened(payload)
        request = ExecRequest(language=offer.language, code=offer.code, input=offer.input, limits=offer.limits)
        # The origin is the intake's tag (always remote), never anything the offer says.
        # A fresh offerer's run leaves the last warm container to offerers this node knows (mesh/standing.py).
        job.started = True
        # Live output for an offer that asks for it, on a transport that can carry it (mesh/jobstream.py).
        follow = offer.follow and job.delivery.stream is not None
        job.stream = stream = JobStream(follow=follow)
        job.control.on_output = stream.push
        forwarded = trio.Event()
        forwarding = trio.CancelScope()
        if follow:
            # In the node's nursery, not one around the run: an error in the run stays that error (the job's
            # error boundary names it), and the forwarder's life is bounded below anyway.
            self._nursery.start_soon(self._forward, job, forwarding, forwarded)
        try:
            result: ExecResult = await self.executor.run_code(
                request,
                sandbox=offer.sandbox,
                origin=job.origin,
                min_isolation=offer.min_isolation,
                spare_warm=self.intake.spare_warm(job),
                control=job.control,
                runtime=offer.needs.runtime_name,
            )
        finally:
            stream.close()
            if follow:
                # Every chunk goes before the result on the stream; a follower that reads too slowly loses the rest.
                try:
                    with trio.move_on_after(STREAM_FLUSH_S):
                        await forwarded.wait()
                finally:
                    forwarding.cancel()
                    stream.abandon()
        if result.exit_code is not None:  # a process ran; refusals (host, subset, busy) start nothing
            self.ran.append(offer.offer_id)
        self.metrics.results.labels(str(result.error_kind or "none"), str(result.queue_reason or "none")).inc()
        self.metrics.run_seconds.observe(result.duration_ms / 1000)
        if result.queue_for_cloud:
            self.metrics.fallbacks.inc()
        return result

    @staticmethod
    async def _forward(job: Job, scope: trio.CancelScope, done: trio.Event) -> None:
        assert job.stream is not None and job.delivery.stream is not None
        with scope:
            await job.stream.forward(job.delivery.stream)
        done.set()
