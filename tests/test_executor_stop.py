"""A run stopped by its caller (a cancel): the container is killed and gone, and the result keeps what the program
printed before the stop. Real Docker."""

from __future__ import annotations

import docker
import docker.errors
import pytest
import trio

from executor.contract import ErrorKind, ExecRequest, Limits, QueueReason
from executor.policy import ExecutorPolicy
from executor.runcontrol import RunControl
from executor.runner import Executor
from tests.conftest import containers_of

pytestmark = pytest.mark.docker

# A first line longer than the supervisor's trailer, which the capture holds back until more output comes.
FIRST_LINE = "started " + "x" * 100
TALK_THEN_SLEEP = f"import sys, time\nprint({FIRST_LINE!r}, flush=True)\ntime.sleep(60)\nprint('never')\n"


def running_state(api: docker.APIClient, container_id: str) -> bool:
    try:
        return bool(api.inspect_container(container_id)["State"]["Running"])
    except docker.errors.NotFound:
        return False


async def test_a_stopped_run_is_killed_gone_and_keeps_its_output(docker_api: docker.APIClient, node_label: str) -> None:
    pieces: list[tuple[str, bytes]] = []
    first = trio.Event()

    def on_output(stream: str, data: bytes) -> None:
        pieces.append((stream, data))
        first.set()

    control = RunControl(on_output)
    async with Executor.open(ExecutorPolicy(pool_size=0), node_label=node_label) as ex:
        async with trio.open_nursery() as nursery:
            results = []

            async def run() -> None:
                request = ExecRequest("python", TALK_THEN_SLEEP, limits=Limits(timeout_ms=30_000))
                results.append(await ex.run_code(request, control=control))

            nursery.start_soon(run)
            with trio.fail_after(30):
                await first.wait()  # the first line came while the program still runs
            assert not results
            (running,) = containers_of(docker_api, node_label)
            control.stop()
        (result,) = results
        assert control.stopped_at is not None
        # When run_code answers, the container is dead (killed, not ended: the program sleeps 60 s); its removal
        # follows in the background, and Docker then no longer knows it.
        assert not running_state(docker_api, running["Id"])
        with trio.fail_after(60):
            while containers_of(docker_api, node_label):
                await trio.sleep(0.1)
    assert (result.ok, result.error_kind, result.queue_reason) == (False, ErrorKind.ABORTED, str(QueueReason.ABORTED))
    assert result.stdout == FIRST_LINE + "\n" and "never" not in result.stdout
    assert b"".join(d for s, d in pieces if s == "stdout").decode() == result.stdout


async def test_a_run_stopped_before_it_starts_never_starts(docker_api: docker.APIClient, node_label: str) -> None:
    control = RunControl()
    control.stop()
    async with Executor.open(ExecutorPolicy(pool_size=0), node_label=node_label) as ex:
        result = await ex.run_code(ExecRequest("python", "print(1)"), control=control)
    assert result.error_kind is ErrorKind.ABORTED and result.exit_code is None and result.stdout == ""
    assert containers_of(docker_api, node_label) == []
