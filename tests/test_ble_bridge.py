"""The Trio <-> asyncio bridge: results, errors and cancellation cross both ways; no thread outlives its scope."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from transports.ble.bridge import AsyncioThread, TrioPortal


def test_trio_runs_asyncio_and_gets_results_and_errors() -> None:
    async def main() -> None:
        async with AsyncioThread.open("t") as thread:

            async def add(a: int, b: int) -> int:
                await asyncio.sleep(0)
                return a + b

            async def boom() -> None:
                raise ValueError("from asyncio")

            assert await thread.run(add, 2, 3) == 5
            with pytest.raises(ValueError, match="from asyncio"):
                await thread.run(boom)

    trio.run(main)
    assert not [t for t in threading.enumerate() if t.name == "t"]


def test_cancelling_the_trio_caller_cancels_and_awaits_the_asyncio_task() -> None:
    state: list[str] = []

    async def main() -> None:
        async with AsyncioThread.open("t2") as thread:
            started = trio.Event()
            token = trio.lowlevel.current_trio_token()

            async def forever() -> None:
                token.run_sync_soon(started.set)  # test-only signal back; production code goes through the bridge
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    state.append("cancelled")
                    raise

            with trio.move_on_after(5) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(thread.run, forever)
                    await started.wait()
                    nursery.cancel_scope.cancel()
            assert not scope.cancelled_caught
            assert state == ["cancelled"]  # already finished when the Trio side returned

    trio.run(main)


def test_asyncio_calls_trio_through_the_portal_and_cancellation_crosses_back() -> None:
    async def main() -> None:
        async with AsyncioThread.open("t3") as thread, trio.open_nursery() as nursery:
            portal = TrioPortal(nursery)
            trio_cancelled = trio.Event()

            async def double(x: int) -> int:
                await trio.sleep(0)
                return 2 * x

            async def hang() -> None:
                try:
                    await trio.sleep_forever()
                finally:
                    trio_cancelled.set()

            async def from_asyncio() -> int:
                task = asyncio.get_running_loop().create_task(portal.call(hang))
                await asyncio.sleep(0)  # cancellation is honoured whether or not the Trio task has started
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                return await portal.call(double, 21)

            with trio.fail_after(5):
                assert await thread.run(from_asyncio) == 42
                await trio_cancelled.wait()

    trio.run(main)
