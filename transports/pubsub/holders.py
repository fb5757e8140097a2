"""Which peers are known to hold each recent pubsub message: those that sent it to us.

A peer that sent us a message has it; sending it back is a wasted write for us and a wasted read, decode and
seen-cache lookup for it. py-libp2p 0.8.1 forwards a new message to every mesh peer except the one whose copy it
validated (and the originator), so a peer whose copy arrived a moment later (while the first was still queued for
validation, or while our forward waited in its outbound queue) gets it back: measured at 16 nodes, 15 of the 82
copies of an offer reached a node before it had forwarded its first one. GossipSub's IDONTWANT says "I have it"
with an RPC of its own; a copy received already says it for free. nim-libp2p excludes the same peers ("seen during
validation"). `LeanPubsub` records a holder for every copy it reads and `LeanGossipSub` and the coalescing sender
skip holders; nothing on the wire changes.

Bounded: the newest `MAX_IDS` message ids, at most `MAX_PEERS` holders each (a message forwarded is forwarded within
milliseconds, so recent ids are all that matter; a holder not recorded only costs a duplicate). A peer is forgotten
when pubsub drops it (`LeanPubsub._handle_dead_peer`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from libp2p.peer.id import ID

MAX_IDS = 4096
MAX_PEERS = 64
_NOBODY: frozenset[ID] = frozenset()


class Holders:
    def __init__(self, max_ids: int = MAX_IDS, max_peers: int = MAX_PEERS) -> None:
        self.max_ids = max_ids
        self.max_peers = max_peers
        self._by_id: OrderedDict[bytes, set[ID]] = OrderedDict()

    def add(self, msg_id: bytes, peer: ID) -> None:
        peers = self._by_id.get(msg_id)
        if peers is None:
            self._by_id[msg_id] = {peer}
            if len(self._by_id) > self.max_ids:
                self._by_id.popitem(last=False)
        elif len(peers) < self.max_peers:
            peers.add(peer)

    def forget(self, peer: ID) -> None:
        """The peer is gone: a peer that comes back (restarted, its seen cache empty) may ask for them again (IWANT),
        and an IWANT we leave unanswered counts against us as a broken promise."""
        for peers in self._by_id.values():
            peers.discard(peer)

    def of(self, msg_id: bytes) -> Collection[ID]:
        return self._by_id.get(msg_id, _NOBODY)

    def __len__(self) -> int:
        return len(self._by_id)
