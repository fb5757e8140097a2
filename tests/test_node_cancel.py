"""Cancel, over real nodes and real containers: only the offerer's signed cancel stops a job, the container is then
killed and gone (Docker says so), and the answer is a signed `aborted` result carrying the output so far; a cancel
of a finished job gets the finished result; a queued job cancelled never runs."""

from __future__ import annotations

from typing import Any

import docker
import docker.errors
import pytest
import trio

from executor.contract import ErrorKind, Limits
from mesh.node import MeshNode
from mesh.offerer import OfferOutcome
from tests.docker_support import sandbox_policy
from tests.test_node_mesh import mesh, offer_id, run
from transports.wire.identity import NodeIdentity
from transports.wire.jobs import JobCancel
from transports.wire.reasons import Reason

pytestmark = pytest.mark.docker

# The first line is longer than the supervisor's trailer, which the capture holds back until more output comes.
FIRST_LINE = "started " + "x" * 100
TALKER = f"import time\nprint({FIRST_LINE!r}, flush=True)\ntime.sleep(60)\nprint('never')\n"
LONG = Limits(timeout_ms=40_000)


async def wait_for(predicate: Any, *, timeout: float = 60.0, what: str = "condition") -> None:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


def spoke(node: MeshNode, oid: bytes) -> bool:
    job = node.intake.pending_job(oid)
    return job is not None and job.stream is not None and job.stream.bytes > 0


def running(api: docker.APIClient, container_id: str) -> bool:
    try:
        return bool(api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.NotFound:
        return False


def gone(api: docker.APIClient, container_id: str) -> bool:
    try:
        api.inspect_container(container_id)
    except docker.errors.NotFound:
        return True
    return False


def assert_cancelled_with_output(outcome: OfferOutcome) -> None:
    assert outcome.result is not None, outcome.refusal
    result = outcome.result.result
    assert (result.ok, result.error_kind) == (False, ErrorKind.ABORTED)
    assert result.stdout == FIRST_LINE + "\n"


def test_a_direct_job_cancelled_by_its_offerer_stops_keeps_its_output_and_its_container_goes(
    docker_api: docker.APIClient,
) -> None:
    async def main() -> None:
        async with mesh(runners=1, gate_interval=3600) as m:
            offerer, node = m["offerer"], m["nodes"][0]
            raw = offerer.make_offer(to=node.peer_id, language="python", code=TALKER, limits=LONG)
            oid = offer_id(raw)
            outcomes: list[OfferOutcome] = []
            async with trio.open_nursery() as nursery:

                async def offer() -> None:
                    outcomes.append(await offerer.offer_direct(node.addrs[0], raw))

                nursery.start_soon(offer)
                await wait_for(lambda: spoke(node, oid), what="the program's first line")
                job = node.intake.pending_job(oid)
                assert job is not None and job.control.container_id is not None
                container = {"Id": job.control.container_id}

                # Anyone else's cancel, even well signed, is refused, and the job goes on.
                mallory = NodeIdentity.generate()
                forged = JobCancel.create(mallory, oid).sign(mallory)
                refused = await offerer.direct.send_cancel(node.peer_id, forged)
                assert refused.refusal is not None and refused.refusal.reason == Reason.NOT_OFFERER
                assert running(docker_api, container["Id"]) and not outcomes

                started = trio.current_time()
                cancelled = await offerer.cancel(node.peer_id, oid)
                print(f"cancel to signed answer: {(trio.current_time() - started) * 1000:.0f} ms")
                assert not running(docker_api, container["Id"])  # killed by the time the runner answered
            assert_cancelled_with_output(cancelled)
            (direct,) = outcomes
            assert_cancelled_with_output(direct)  # the offer stream got the same signed result
            assert direct.result == cancelled.result
            await wait_for(lambda: gone(docker_api, container["Id"]), what="the container to be removed")
            # A cancel after the end gets how the job ended.
            again = await offerer.cancel(node.peer_id, oid)
            assert again.result == cancelled.result
            assert node.cancels.refused == {str(Reason.NOT_OFFERER): 1} and node.cancels.cancelled == 1
            (record,) = node.job_log.to_json()  # what /status and `edgecoder jobs` show
            assert (record["state"], record["attempt"], record["errorKind"]) == ("cancelled", 1, "aborted")
            unknown = await offerer.cancel(node.peer_id, b"\x09" * 16)
            assert unknown.refusal is not None and unknown.refusal.reason == Reason.UNKNOWN_OFFER

    run(main)


def test_a_gossip_job_is_cancelled_at_its_claimant_and_the_offerer_gets_the_aborted_result(
    docker_api: docker.APIClient,
) -> None:
    async def main() -> None:
        async with mesh(runners=2, gate_interval=3600) as m:
            offerer = m["offerer"]
            raw = offerer.make_offer(language="python", code=TALKER, limits=LONG)
            oid = offer_id(raw)
            outcomes: list[OfferOutcome] = []
            async with trio.open_nursery() as nursery:

                async def offer() -> None:
                    outcomes.append(await offerer.offer_gossip(raw, timeout=60))

                nursery.start_soon(offer)
                await wait_for(lambda: any(spoke(n, oid) for n in m["nodes"]), what="a claimant's first line")
                (claimant,) = [n for n in m["nodes"] if spoke(n, oid)]
                job = claimant.intake.pending_job(oid)
                assert job is not None and job.control.container_id is not None
                container_id = job.control.container_id
                cancelled = await offerer.cancel(claimant.peer_id, oid)
            assert_cancelled_with_output(cancelled)
            (gossip,) = outcomes
            assert_cancelled_with_output(gossip)  # the claimant's result protocol carried it to the offerer
            assert not running(docker_api, container_id)
            await wait_for(lambda: gone(docker_api, container_id), what="the container to be removed")

    run(main)


def test_a_queued_job_cancelled_never_runs() -> None:
    async def main() -> None:
        async with mesh(runners=1, executor_policy=sandbox_policy(max_concurrent=1)) as m:
            offerer, node = m["offerer"], m["nodes"][0]
            busy = offerer.make_offer(to=node.peer_id, language="python", code=TALKER, limits=LONG)
            queued = offerer.make_offer(to=node.peer_id, language="python", code="print('ran')")
            outcomes: dict[str, OfferOutcome] = {}
            async with trio.open_nursery() as nursery:

                async def offer(name: str, raw: bytes) -> None:
                    outcomes[name] = await offerer.offer_direct(node.addrs[0], raw)

                nursery.start_soon(offer, "busy", busy)
                await wait_for(lambda: spoke(node, offer_id(busy)), what="the first job to run")
                nursery.start_soon(offer, "queued", queued)
                await wait_for(lambda: node.intake.pending_job(offer_id(queued)) is not None, what="the second queued")
                cancelled = await offerer.cancel(node.peer_id, offer_id(queued))
                assert cancelled.result is not None and cancelled.result.result.error_kind is ErrorKind.ABORTED
                assert cancelled.result.result.exit_code is None  # no process ever ran
                await offerer.cancel(node.peer_id, offer_id(busy))
            assert outcomes["queued"].result == cancelled.result
            assert offer_id(queued) not in node.ran

    run(main)
