"""What this node knows of the runners around it: presence learned from neighbours, never flooded.

Every node tells each peer it is connected to its status (sandbox mode, free slots, languages, sandbox tiers, and
`near`: a few runners among its own neighbours) when they connect, when the status changes materially, and every
refresh interval; see `transports.presence`. So a node knows its neighbours first hand (over their own Noise-
authenticated streams) and, second hand, a sample of runners one hop further. Nothing is flooded to the whole mesh,
so what a node receives idle does not grow with the mesh.

The directory is bounded (`capacity` statuses, `NEAR_SAMPLE` samples from each), and a status older than
`stale_after` seconds counts for nothing. A neighbour that disconnects is forgotten with its samples.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from transports.wire.needs import Capabilities

# What a node reports as its `sandboxMode` (to its neighbours, and to a coordinator when it registers): docker, it
# runs remote work in the sandbox; none, it takes none. The node's gate (mesh/gate.py) decides which.
SandboxMode = Literal["docker", "none"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("docker", "none")
MAX_TIERS = 4
MAX_LANGUAGES = 8
MAX_ADDRS = 8
MAX_RUNTIMES = 8
# Runners a node passes on of its neighbours: enough for an offerer with one connection (a one-shot offerer at a
# seed) to invite a few, small enough that a status stays one small frame.
NEAR_SAMPLE = 8


def _strings(value: Any, limit: int, max_len: int) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(x, str) and len(x) <= max_len for x in value[:limit]):
        return None
    return tuple(value[:limit])


@dataclass(frozen=True, slots=True)
class NearRunner:
    """A runner one hop away, as a neighbour `via` reported it: second hand, so only ever a candidate to invite."""

    peer_id: str
    languages: tuple[str, ...]
    isolation: tuple[str, ...]
    via: str
    # The runtimes it has built (names only: the claim's own status carries the digests). None: it said nothing,
    # a node from before runtimes, which runs only `python`.
    runtimes: tuple[str, ...] | None = None

    @classmethod
    def parse(cls, data: Any, via: str) -> NearRunner | None:
        if not isinstance(data, dict):
            return None
        peer_id = data.get("peerId")
        languages = _strings(data.get("languages", []), MAX_LANGUAGES, 16)
        isolation = _strings(data.get("isolation", ["runc"]), MAX_TIERS, 16)
        if not isinstance(peer_id, str) or not 0 < len(peer_id) <= 64 or languages is None or isolation is None:
            return None
        runtimes = _strings(data["runtimes"], MAX_RUNTIMES, 32) if "runtimes" in data else None
        return cls(peer_id, languages, isolation, via, runtimes)

    def to_wire(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "peerId": self.peer_id,
            "languages": list(self.languages),
            "isolation": list(self.isolation),
        }
        if self.runtimes is not None:
            shown["runtimes"] = list(self.runtimes)
        return shown


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A peer's status as it sent it about itself (the name is the protocol's: a node "heartbeats" its mode)."""

    peer_id: str
    sandbox_mode: str
    free_slots: int
    languages: tuple[str, ...]
    addrs: tuple[str, ...]
    seen_at: float
    # The sandbox tiers it runs offers under (`runc`, `gvisor`). A node from before tiers says nothing: runc.
    isolation: tuple[str, ...] = ("runc",)
    near: tuple[NearRunner, ...] = ()
    # Its built runtimes and resources (transports/wire/needs.py); None from a node from before runtimes.
    capabilities: Capabilities | None = None

    @classmethod
    def parse(cls, peer_id: str, data: Any, seen_at: float) -> Heartbeat | None:
        """A status that does not parse, or names another peer than the one that sent it, is ignored."""
        if not isinstance(data, dict) or data.get("peerId") != peer_id:
            return None
        mode, slots = data.get("sandboxMode"), data.get("freeSlots")
        if mode not in SANDBOX_MODES or type(slots) is not int or slots < 0:
            return None
        languages = _strings(data.get("languages", []), MAX_LANGUAGES, 16)
        addrs = _strings(data.get("addrs", []), MAX_ADDRS, 255)
        isolation = _strings(data.get("isolation", ["runc"] if mode == "docker" else []), MAX_TIERS, 16)
        near_data = data.get("near", [])
        if languages is None or addrs is None or isolation is None or not isinstance(near_data, list):
            return None
        near = [NearRunner.parse(n, via=peer_id) for n in near_data[:NEAR_SAMPLE]]
        return cls(
            peer_id,
            mode,
            slots,
            languages,
            addrs,
            seen_at,
            isolation,
            tuple(n for n in near if n is not None and n.peer_id != peer_id),
            Capabilities.from_json(data.get("capabilities")),
        )

    @property
    def runtime_names(self) -> tuple[str, ...] | None:
        return None if self.capabilities is None else tuple(sorted(self.capabilities.runtimes))

    @property
    def runs_offers(self) -> bool:
        return self.sandbox_mode == "docker" and bool(self.isolation)


class PeerDirectory:
    """Bounded: at most `capacity` peers, and a status older than `stale_after` seconds counts for nothing.

    Kept in the order statuses were last seen, so that making room (the peer heard from longest ago goes) and
    listing the fresh ones cost O(1) per peer, not a scan of all of them.
    """

    def __init__(
        self, *, stale_after: float = 10.0, capacity: int = 10_000, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.stale_after = stale_after
        self.capacity = capacity
        self._monotonic = monotonic
        self._latest: OrderedDict[str, Heartbeat] = OrderedDict()
        self.ignored = 0

    def __len__(self) -> int:
        return len(self._latest)

    def observe(self, peer_id: str, data: Any) -> Heartbeat | None:
        heartbeat = Heartbeat.parse(peer_id, data, self._monotonic())
        if heartbeat is None:
            self.ignored += 1
            return None
        self._latest[peer_id] = heartbeat
        self._latest.move_to_end(peer_id)
        while len(self._latest) > self.capacity:
            self._latest.popitem(last=False)
        return heartbeat

    def forget(self, peer_id: str) -> None:
        self._latest.pop(peer_id, None)

    def known(self) -> set[str]:
        return set(self._latest)

    def get(self, peer_id: str) -> Heartbeat | None:
        heartbeat = self._latest.get(peer_id)
        if heartbeat is None or self._monotonic() - heartbeat.seen_at > self.stale_after:
            return None
        return heartbeat

    def sandbox_mode(self, peer_id: str) -> str | None:
        """`docker`, `none`, or None when no fresh status was seen."""
        heartbeat = self.get(peer_id)
        return None if heartbeat is None else heartbeat.sandbox_mode

    def fresh(self) -> list[Heartbeat]:
        """Fresh statuses, newest first: the walk stops at the first stale one."""
        now = self._monotonic()
        found = []
        for heartbeat in reversed(self._latest.values()):
            if now - heartbeat.seen_at > self.stale_after:
                break
            found.append(heartbeat)
        return found

    def near(self, exclude: Iterable[str] = ()) -> list[NearRunner]:
        """Runners one hop beyond the fresh neighbours, each once, none that is itself a fresh neighbour."""
        fresh = self.fresh()
        skip = {h.peer_id for h in fresh} | set(exclude)
        found: dict[str, NearRunner] = {}
        for heartbeat in fresh:
            for runner in heartbeat.near:
                if runner.peer_id not in skip:
                    found.setdefault(runner.peer_id, runner)
        return list(found.values())
