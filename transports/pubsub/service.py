"""py-libp2p's Pubsub with coalesced writes, bans, and the message being validated known; and the host as it sees it.

- **Coalesced writes** (`coalesce_writes`). Upstream's per-peer sender writes each queued RPC as its own yamux frame
  and Noise message (`Pubsub.handle_sending_messages` -> `write_msg`). Ours writes everything already queued for the
  peer in one write (up to 60 KiB: one frame, one Noise message). `RpcQueue.pop` returns without a checkpoint while
  items are queued, so draining it cannot interleave with anything.
- **One writer at a time per stream.** Upstream writes to a peer's stream from its sender task and, directly, from
  the router (`GossipSub` flushing pending messages and sending recent ones to a new mesh peer: `write_msg`).
  Yamux takes its write lock per frame, so two writes longer than a frame (an RPC over 64 KiB, such as a 100 KB
  clear offer) interleave their frames and the peer reads a corrupt RPC. Every write here holds the stream's own
  lock for the whole RPC.
- **Bans.** `is_peer_blacklisted`, which pubsub asks first thing for every message (forwarder and originator) and
  before it opens a stream to a new peer, also says yes for a peer the host's `PenaltyBox` has banned. The pubsub
  blacklist itself is not used: `add_to_blacklist` removes the peer from `peers` without telling the router, which
  then keeps its mesh entries and score for good.
- **Copies of a message already forwarded dropped before a task is spawned for them** (`early_duplicates`). Pubsub's
  reader hands every message it reads to `manager.run_task(push_msg)` (a task, found a parent among the service's
  tasks, started), and `push_msg` then drops a copy it has seen. At 16 nodes four out of five copies are such
  duplicates. `_is_subscribed_to_msg`, which the reader asks for each message just before that `run_task`, answers
  no for a message in the seen cache: what `push_msg` would have done (blacklist checks, then the seen check, then
  return, nothing counted), without the task. A message is marked seen right after it validates, before it is
  forwarded, so a copy still being validated is not dropped here: it is handled by `push_msg` as upstream.
- **Holders** (`skip_holders`, `transports.pubsub.holders`): the same hook records the peer each copy came from,
  and our sender drops, from what it is about to write to a peer, the messages that peer sent us (the router skips
  them when it forwards: `LeanGossipSub`). The reader's peer is known from the stream it read
  (`ForwarderNotingReader`): no checkpoint lies between that read and the hook (pinned).
- **The message being validated** (`receiving_id`), for `GossipScorer`'s IGNORE: `push_msg` notes the message it was
  given; with synchronous validators nothing else runs before pubsub counts a refusal of it.
- `CachedAddrsHost`, **records not rebuilt per RPC** (`cached_addrs`): pubsub builds our signed peer record for every
  RPC it sends (`env_to_send_in_RPC`, before `send_rpc` drops it), starting with `host.get_addrs()`, which re-parses
  every Multiaddr. Pubsub is given a view of the host whose `get_addrs` is recomputed at most once a second; a
  changed address still reissues the record (`env_to_send_in_RPC` compares the record's addresses with these).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamClosed, StreamReset
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.utils import encode_varint_prefixed

from transports.pubsub.holders import Holders

# One coalesced write at most this big: under yamux's 64 KiB frame cap, so that a batch is one frame and one Noise
# message.
MAX_COALESCED_BYTES = 60 * 1024
ADDRS_TTL = 1.0


def _never(peer: ID) -> bool:
    return False


class LeanPubsub(Pubsub):
    def __init__(
        self,
        host: IHost,
        router: Any,
        *,
        coalesce_writes: bool = True,
        early_duplicates: bool = True,
        skip_holders: bool = True,
        banned: Callable[[ID], bool] = _never,
        **options: Any,
    ) -> None:
        self.receiving: rpc_pb2.Message | None = None
        super().__init__(host, router, **options)
        self.coalesce_writes = coalesce_writes
        self.early_duplicates = early_duplicates
        # Peers known to have each recent message (they sent it to us); None when holders are not skipped.
        self.holders: Holders | None = Holders() if skip_holders else None
        self.banned = banned
        # The peer whose pubsub stream was read last (`ForwarderNotingReader`): the forwarder of the messages of the
        # RPC pubsub's reader is handling, while it asks `_is_subscribed_to_msg` for each.
        self.reading_from: ID | None = None
        self.duplicates_dropped = 0  # copies dropped before push_msg (for tests and the benchmarks)
        self.held_skipped = 0  # messages not written to a peer that had sent them to us
        self._write_locks: weakref.WeakKeyDictionary[INetStream, trio.Lock] = weakref.WeakKeyDictionary()

    def _write_lock(self, stream: INetStream) -> trio.Lock:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        return lock

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        async with self._write_lock(stream):
            return await super().write_msg(stream, rpc_msg)

    def _is_subscribed_to_msg(self, msg: rpc_pb2.Message) -> bool:
        if not super()._is_subscribed_to_msg(msg):
            return False
        if not self.early_duplicates and self.holders is None:
            return True
        msg_id = self._msg_id_constructor(msg)
        forwarder = self.reading_from
        if self.holders is not None and forwarder is not None:
            self.holders.add(msg_id, forwarder)
        if self.early_duplicates and self.seen_messages.has(msg_id):
            self.duplicates_dropped += 1
            return False  # validated and forwarded already: push_msg would drop it, after a task of its own
        return True

    def _handle_dead_peer(self, peer_id: ID) -> None:
        super()._handle_dead_peer(peer_id)
        if self.holders is not None:
            self.holders.forget(peer_id)

    def receiving_id(self) -> bytes | None:
        """The id of the message `push_msg` is handling (valid until its validation is over)."""
        msg = self.receiving
        return None if msg is None else self.get_message_id(msg)

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        self.receiving = msg
        await super().push_msg(msg_forwarder, msg)

    def is_peer_blacklisted(self, peer_id: ID) -> bool:
        return super().is_peer_blacklisted(peer_id) or self.banned(peer_id)

    async def handle_sending_messages(self, peer_id: ID, stream: INetStream, queue: RpcQueue) -> None:
        if not self.coalesce_writes:
            await super().handle_sending_messages(peer_id, stream, queue)
            return
        try:
            while True:
                rpc = await queue.pop()
                if rpc is None:
                    return  # the queue was closed: the peer is gone
                parts: list[bytes] = []
                size = self._encode_into(parts, peer_id, rpc)
                while len(queue) and size < MAX_COALESCED_BYTES:
                    more = await queue.pop()  # returns at once, without a checkpoint: something is queued
                    if more is None:
                        break
                    size += self._encode_into(parts, peer_id, more)
                if not parts:
                    continue  # everything queued was held by the peer already
                try:
                    async with self._write_lock(stream):
                        await stream.write(b"".join(parts))
                except (StreamClosed, StreamReset):
                    self._handle_dead_peer(peer_id)  # what upstream's sender does when write_msg fails
                    return
        except Exception:
            self._handle_dead_peer(peer_id)

    def _encode_into(self, parts: list[bytes], peer_id: ID, rpc: rpc_pb2.RPC) -> int:
        """Append `rpc`'s wire form to `parts`, without the messages `peer_id` sent us; the bytes appended. The RPC
        is the peer's own copy (`send_rpc` queues a copy), so it is trimmed in place."""
        holders = self.holders
        if holders is not None and rpc.publish:
            held = [i for i, m in enumerate(rpc.publish) if peer_id in holders.of(self._msg_id_constructor(m))]
            if held:
                self.held_skipped += len(held)
                for i in reversed(held):
                    del rpc.publish[i]
                if not rpc.ByteSize():
                    return 0
        parts.append(encode_varint_prefixed(rpc.SerializeToString()))
        return len(parts[-1])


class ForwarderNotingReader:
    """A pubsub stream as pubsub's reader sees it: each read tells the pubsub whose stream it was. The reader parses
    the RPC and asks `_is_subscribed_to_msg` for each of its messages with no checkpoint after its last read (pinned),
    so `reading_from` is that RPC's forwarder while it does. Every other attribute is the stream's."""

    __slots__ = ("_inner", "_peer", "_pubsub")

    def __init__(self, inner: Any, pubsub: LeanPubsub, peer: ID) -> None:
        self._inner = inner
        self._pubsub = pubsub
        self._peer = peer

    async def read(self, n: int | None = None) -> bytes:
        data: bytes = await self._inner.read(n)
        self._pubsub.reading_from = self._peer
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CachedAddrsHost:
    """The host as pubsub sees it: `get_addrs()` recomputed at most every `ttl` seconds, everything else the host's."""

    def __init__(self, host: IHost, ttl: float = ADDRS_TTL, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._host = host
        self._ttl = ttl
        self._clock = clock
        self._addrs: list[Any] | None = None
        self._at = 0.0

    def get_addrs(self) -> list[Any]:
        now = self._clock()
        if self._addrs is None or now - self._at >= self._ttl:
            self._addrs = self._host.get_addrs()
            self._at = now
        return list(self._addrs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)
