"""Bootstrap peers: dialled at start and re-dialled whenever lost, with jittered exponential backoff.

A bootstrap peer that is down never stops the node. Its first failure is logged once as a warning (with the reason
and that the node keeps trying); later failures only at debug level, until it connects, which is logged again.
Backoff per peer starts at `first_backoff_s`, doubles up to `max_backoff_s` (about 30 s), and each wait is jittered
by up to a quarter either way so that a restarted seed is not redialled by all its peers in the same instant.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from transports.operator_addrs import parse_peer_addr
from transports.p2p import DialError, P2PHost

log = structlog.get_logger("edgecoder.bootstrap")


@dataclass(slots=True)
class _Peer:
    addr: str
    peer_id: str
    backoff_s: float
    next_attempt: float = 0.0
    connected: bool = False
    failures: int = 0


class Bootstrapper:
    name = "bootstrap"

    def __init__(
        self,
        host: P2PHost,
        addrs: Sequence[str],
        *,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        check_interval_s: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.check_interval_s = check_interval_s
        self._rng = rng or random.Random()
        # Validated here, so that a bad address is a usage error at start, not a surprise later.
        self.peers = [_Peer(addr, parse_peer_addr(addr)[1], first_backoff_s) for addr in dict.fromkeys(addrs)]

    def connected(self) -> list[str]:
        return [p.peer_id for p in self.peers if p.connected]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """One round of dials first (so that a node is usually meshed by the time it says ready), then keep them."""
        await self._round()
        task_status.started()
        while True:
            await trio.sleep(self.check_interval_s)
            await self._round()

    async def _round(self) -> None:
        now = trio.current_time()
        live = set(self.host.connected_peers())
        due = []
        for peer in self.peers:
            if peer.peer_id in live:
                if not peer.connected:
                    self._on_connected(peer)
                continue
            if peer.connected:
                peer.connected = False
                peer.backoff_s = self.first_backoff_s
                peer.next_attempt = now
                log.info("lost bootstrap peer; redialling", peer=peer.peer_id, addr=peer.addr)
            if now >= peer.next_attempt:
                due.append(peer)
        if due:
            async with trio.open_nursery() as nursery:
                for peer in due:
                    nursery.start_soon(self._dial, peer)

    async def _dial(self, peer: _Peer) -> None:
        try:
            await self.host.connect(peer.addr)
        except DialError as exc:
            peer.failures += 1
            wait = peer.backoff_s * self._rng.uniform(0.75, 1.25)
            peer.next_attempt = trio.current_time() + wait
            peer.backoff_s = min(peer.backoff_s * 2, self.max_backoff_s)
            if peer.failures == 1:
                log.warning("bootstrap peer unreachable; will keep trying", addr=peer.addr, error=str(exc))
            else:
                log.debug("bootstrap peer still unreachable", addr=peer.addr, retry_in_s=round(wait, 2))
            return
        self._on_connected(peer)

    def _on_connected(self, peer: _Peer) -> None:
        peer.connected = True
        peer.backoff_s = self.first_backoff_s
        log.info("connected to bootstrap peer", peer=peer.peer_id, after_failures=peer.failures)
        peer.failures = 0
