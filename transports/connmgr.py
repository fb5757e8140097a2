"""Keeps the number of connected peers between a low and a high watermark.

Peers are learnt from discovery (mDNS, rendezvous at the seeds) and from the peers that connected to us; the bootstrap
keeper (`transports.bootstrap`) looks after the bootstrap peers themselves. Below the low watermark the manager dials
known peers it is not connected to (a few at a time, with a backoff per peer that failed); above the high watermark it
closes the newest connections to peers that are not protected: bootstrap peers, relays we hold a reservation on, peers
with an exchange in progress (an offer running for them, a claim or result on its way); `valued` peers (for a node, the
offerers it has served) go only after every stranger. So a trim never cuts an offer mid-way, and an offerer the node has
served is not pushed out by a crowd of strangers. py-libp2p's own auto-connector is stopped (`transports.p2p`): it
dialled everything in the peerstore, with no notion of which peers matter.

State is bounded: at most `max_known` peers are remembered, the least recently heard of forgotten first.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from transports.p2p import DialError, P2PHost

log = structlog.get_logger("edgecoder.connections")

DIALS_AT_ONCE = 4


@dataclass(slots=True)
class _Known:
    addrs: list[str]
    source: str
    failures: int = 0
    next_try: float = 0.0
    eager: bool = False


class ConnectionManager:
    name = "connections"

    def __init__(
        self,
        host: P2PHost,
        *,
        low: int = 4,
        high: int = 32,
        protected: Callable[[], set[str]] = set,
        max_known: int = 1000,
        interval_s: float = 2.0,
        valued: Callable[[str], bool] = lambda peer_id: False,
    ) -> None:
        if not 0 <= low <= high:
            raise ValueError("the connection watermarks need 0 <= low <= high")
        self.host = host
        self.low = low
        self.high = high
        self.protected = protected
        self.max_known = max_known
        self.interval_s = interval_s
        self.valued = valued
        self.known: OrderedDict[str, _Known] = OrderedDict()
        self._wake = trio.Event()
        self.dialled = 0
        self.trimmed = 0

    def discovered(self, peer_id: str, addrs: list[str], source: str, *, eager: bool = False) -> None:
        """A peer someone told us about. Dialled when we are short of peers, or, `eager` (a peer on our own LAN,
        found by mDNS: cheap to keep), whenever we are below the high watermark."""
        if peer_id == self.host.peer_id or not addrs:
            return
        entry = self.known.get(peer_id)
        if entry is None:
            self.known[peer_id] = entry = _Known(list(addrs)[:8], source)
            while len(self.known) > self.max_known:
                self.known.popitem(last=False)
        else:
            entry.addrs = list(dict.fromkeys([*addrs, *entry.addrs]))[:8]
            self.known.move_to_end(peer_id)
        entry.eager = entry.eager or eager
        self._wake.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._balance()
            self._wake = trio.Event()
            with trio.move_on_after(self.interval_s):
                await self._wake.wait()

    async def _balance(self) -> None:
        in_order = self.host.connected_peers()  # oldest first: the swarm's connections dict keeps insertion order
        connected = set(in_order)
        for peer_id in in_order:  # what we are connected to now is worth redialling later (a partition heals)
            if peer_id not in self.known:
                self.discovered(peer_id, self.host.peer_addrs(peer_id), "connected")
        if len(connected) < self.high:
            await self._dial_more(connected)
        if len(connected) > self.high:
            await self._trim(in_order)

    async def _dial_more(self, connected: set[str]) -> None:
        now = trio.current_time()
        short = len(connected) < self.low
        due = [p for p, k in self.known.items() if p not in connected and k.next_try <= now and (short or k.eager)]
        random.shuffle(due)
        room = (self.low if short else self.high) - len(connected)
        due = due[: min(DIALS_AT_ONCE, room)]
        if not due:
            return
        async with trio.open_nursery() as nursery:
            for peer_id in due:
                nursery.start_soon(self._dial, peer_id)

    async def _dial(self, peer_id: str) -> None:
        entry = self.known.get(peer_id)
        if entry is None:
            return
        errors = []
        for addr in entry.addrs:
            try:
                await self.host.connect(addr)
            except DialError as exc:
                errors.append(str(exc))
                continue
            entry.failures = 0
            self.dialled += 1
            log.info("connected to a discovered peer", peer=peer_id, source=entry.source, addr=addr)
            return
        entry.failures += 1
        wait = min(300.0, 2.0**entry.failures) * random.uniform(0.75, 1.25)
        entry.next_try = trio.current_time() + wait
        report = log.info if entry.failures == 1 else log.debug
        report("could not reach a discovered peer", peer=peer_id, source=entry.source, errors=errors, retry_in_s=wait)

    async def _trim(self, connected: list[str]) -> None:
        keep = self.protected()
        candidates = [p for p in reversed(connected) if p not in keep]  # newest first (a set would lose the order)
        candidates.sort(key=self.valued)  # stable: strangers first, then valued peers, each newest first
        for peer_id in candidates[: len(connected) - self.high]:
            await self.host.disconnect(peer_id)
            self.trimmed += 1
            log.info("closed a connection above the high watermark", peer=peer_id, high=self.high)
