"""A caller's hold on one run: stop it and keep what it printed (a cancel), and watch its output as it comes.

Cancelling the caller's own scope kills the container too, but the run's output is lost with the scope. A stop is
a request instead: the sandbox ends the run where it is, kills and removes the container, and returns an `aborted`
result that carries the output captured so far. A stop before the run starts means it never starts.

`on_output` is called from the sandbox's read loop with each piece of program output within the caps, in order
(`"stdout"` or `"stderr"`, the bytes). It must not block: a slow follower must never slow the sandbox, so whoever
forwards the pieces buffers them and drops (and counts) what does not fit.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

OutputFn = Callable[[str, bytes], None]


class RunControl:
    def __init__(self, on_output: OutputFn | None = None) -> None:
        self.on_output = on_output
        self.stopped = False
        self._scope: trio.CancelScope | None = None
        # trio.current_time() of the stop, for the time from a cancel to the container's end.
        self.stopped_at: float | None = None
        # The container the run is in, once it has one (for status, and for checking it is gone after a stop).
        self.container_id: str | None = None

    def stop(self) -> None:
        """End the run now (idempotent): its result says `aborted` and keeps its output so far."""
        if not self.stopped:
            self.stopped = True
            self.stopped_at = trio.current_time()
        if self._scope is not None:
            self._scope.cancel()

    def attach(self, scope: trio.CancelScope, container_id: str) -> None:
        """The sandbox's scope around the program's run; cancelled at once if the stop came first."""
        self._scope = scope
        self.container_id = container_id
        if self.stopped:
            scope.cancel()

    def detach(self) -> None:
        self._scope = None
