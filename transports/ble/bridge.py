"""The one place where Trio and asyncio meet.

The node runs on Trio (libp2p is Trio-only); bleak and bumble are asyncio-only. So BLE runs an asyncio loop in a
thread of its own, and every crossing between the two goes through this module:

* Trio -> asyncio: `AsyncioThread.run(afn, *args)`, awaited from Trio. It starts an asyncio task with
  `loop.call_soon_threadsafe`, and is told of its end through the Trio token's `run_sync_soon`. If the Trio caller is
  cancelled, the asyncio task is cancelled too, and the caller waits (shielded, bounded) until it has really stopped:
  no task outlives the scope that started it.
* asyncio -> Trio: `TrioPortal.call(afn, *args)`, awaited from asyncio. It starts a Trio task in a nursery the Trio
  side owns (`run_sync_soon`), and hands the outcome back with `loop.call_soon_threadsafe`. If the asyncio caller is
  cancelled, the Trio task's cancel scope is cancelled.

Nothing else in the package touches the other loop's objects or calls a thread-safe scheduling primitive.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

# How long a cancelled caller waits for the other side to finish cancelling before giving up on it.
CANCEL_GRACE_S = 5.0


class BridgeClosed(RuntimeError):
    """The other loop has stopped, so the call could not be made or could not finish."""


class AsyncioThread:
    """An asyncio event loop running in a daemon-free thread, started and stopped from Trio.

    Use `async with AsyncioThread.open() as thread:`; on exit the loop runs its registered closers, stops, and the
    thread is joined.
    """

    def __init__(self, name: str = "ble-asyncio") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._closers: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, name: str = "ble-asyncio") -> AsyncIterator[AsyncioThread]:
        self = cls(name)
        token = trio.lowlevel.current_trio_token()
        started = trio.Event()
        failure: list[BaseException] = []

        def thread_main() -> None:
            try:
                asyncio.run(self._main(lambda: token.run_sync_soon(started.set)))
            except BaseException as exc:  # reported to the Trio side, which re-raises it
                failure.append(exc)
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(started.set)

        thread = threading.Thread(target=thread_main, name=name)
        thread.start()
        try:
            await started.wait()
            if failure:
                raise BridgeClosed("the asyncio thread failed to start") from failure[0]
            yield self
        finally:
            with trio.CancelScope(shield=True):
                loop, stop = self.loop, self._stop
                if loop is not None and stop is not None and not loop.is_closed():
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(stop.set)
                await trio.to_thread.run_sync(thread.join)

    async def _main(self, announce_started: Callable[[], None]) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        announce_started()
        await self._stop.wait()
        # Closers run newest first, inside the loop, before asyncio.run cancels what is left.
        for closer in reversed(self._closers):
            with contextlib.suppress(Exception):
                await closer()

    def add_closer(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Register an async cleanup to run on the loop when the thread stops. Call from the loop's thread."""
        self._closers.append(closer)

    async def run(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """From Trio: run `afn(*args)` as an asyncio task and return its result (or raise its exception)."""
        loop = self.loop
        if loop is None:
            raise BridgeClosed("asyncio thread not started")
        token = trio.lowlevel.current_trio_token()
        finished = trio.Event()
        holder: list[asyncio.Task[T]] = []

        def on_done(_: asyncio.Future[T]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished.set)

        def start() -> None:
            task: asyncio.Task[T] = loop.create_task(_as_coroutine(afn, *args))
            task.add_done_callback(on_done)
            holder.append(task)

        def cancel() -> None:
            if holder:
                holder[0].cancel()

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError as exc:  # the loop is closed
            raise BridgeClosed(str(exc)) from None
        try:
            await finished.wait()
        except trio.Cancelled:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(cancel)
            with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_GRACE_S):
                await finished.wait()
            raise
        task = holder[0]
        if task.cancelled():
            raise BridgeClosed("the asyncio task was cancelled from the asyncio side")
        return task.result()


async def _as_coroutine(afn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return await afn(*args)


class TrioPortal:
    """Lets asyncio code run Trio functions in a nursery owned by the Trio side."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        """From asyncio: run the plain `fn(*args)` on the Trio loop soon; no answer. Dropped once Trio has ended."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    async def call(self, afn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """From asyncio: run `afn(*args)` as a Trio task and return its result (or raise its exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[outcome.Outcome[T]] = loop.create_future()
        scope = trio.CancelScope()

        def deliver(result: outcome.Outcome[T]) -> None:
            if not future.done():
                future.set_result(result)

        async def runner() -> None:
            result: outcome.Outcome[T] = outcome.Error(BridgeClosed("the Trio task was cancelled"))
            try:
                with scope:
                    # Exceptions travel back; Cancelled does not: it belongs to this side's scopes.
                    try:
                        result = outcome.Value(await afn(*args))
                    except Exception as exc:
                        result = outcome.Error(exc)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(deliver, result)

        def start() -> None:
            try:
                self._nursery.start_soon(runner)
            except RuntimeError as exc:  # the nursery is closing
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(deliver, outcome.Error(BridgeClosed(str(exc))))

        try:
            self._token.run_sync_soon(start)
        except trio.RunFinishedError:
            raise BridgeClosed("the Trio run has finished") from None
        try:
            result = await future
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(scope.cancel)
            raise
        return result.unwrap()
