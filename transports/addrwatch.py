"""Tells the node's owner when the addresses it announces change (a relay reservation, a new interface address,
an observed address confirmed by identify): each change is logged, and passed to the callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import trio

from transports.p2p import P2PHost

log = structlog.get_logger("edgecoder.addrs")

AddrsCallback = Callable[[list[str]], None]


class AddressWatcher:
    name = "addresses"

    def __init__(self, host: P2PHost, *, interval_s: float = 1.0) -> None:
        self.host = host
        self.interval_s = interval_s
        self.callbacks: list[AddrsCallback] = []
        self.current: list[str] = []

    def on_change(self, callback: AddrsCallback) -> None:
        self.callbacks.append(callback)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.current = self.host.addrs
        task_status.started()
        while True:
            # Polled: the changes come from several places inside libp2p (listeners, identify, our relay client),
            # none of which offers one event for all; a comparison a second is nothing.
            await trio.sleep(self.interval_s)
            now = self.host.addrs
            if now != self.current:
                log.info("addresses changed", addrs=now, was=self.current)
                self.current = now
                for callback in list(self.callbacks):
                    callback(now)
