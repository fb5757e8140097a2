"""py-libp2p's Pubsub with coalesced writes, bans, and the message being validated known; and the host as it sees it.

- **Coalesced writes** (`coalesce_writes`). Upstream's per-peer sender writes each queued RPC as its own yamux frame
  and Noise message (`Pubsub.handle_sending_messages` -> `write_msg`). Ours writes everything already queued for the
  peer in one write (up to 60 KiB: one frame, one Noise message). `RpcQueue.pop` returns without a checkpoint while
  items are queued, so draining it cannot interleave with anything.
- **Bans.** `is_peer_blacklisted`, which pubsub asks first thing for every message (forwarder and originator) and
  before it opens a stream to a new peer, also says yes for a peer the host's `PenaltyBox` has banned. The pubsub
  blacklist itself is not used: `add_to_blacklist` removes the peer from `peers` without telling the router, which
  then keeps its mesh entries and score for good.
- **The message being validated** (`receiving_id`), for `GossipScorer`'s IGNORE: `push_msg` notes the message it was
  given; with synchronous validators nothing else runs before pubsub counts a refusal of it.
- `CachedAddrsHost`, **records not rebuilt per RPC** (`cached_addrs`): pubsub builds our signed peer record for every
  RPC it sends (`env_to_send_in_RPC`, before `send_rpc` drops it), starting with `host.get_addrs()`, which re-parses
  every Multiaddr. Pubsub is given a view of the host whose `get_addrs` is recomputed at most once a second; a
  changed address still reissues the record (`env_to_send_in_RPC` compares the record's addresses with these).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamClosed, StreamReset
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.utils import encode_varint_prefixed

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
        banned: Callable[[ID], bool] = _never,
        **options: Any,
    ) -> None:
        self.receiving: rpc_pb2.Message | None = None
        super().__init__(host, router, **options)
        self.coalesce_writes = coalesce_writes
        self.banned = banned

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
                parts = [encode_varint_prefixed(rpc.SerializeToString())]
                size = len(parts[0])
                while len(queue) and size < MAX_COALESCED_BYTES:
                    more = await queue.pop()  # returns at once, without a checkpoint: something is queued
                    if more is None:
                        break
                    parts.append(encode_varint_prefixed(more.SerializeToString()))
                    size += len(parts[-1])
                try:
                    await stream.write(b"".join(parts))
                except (StreamClosed, StreamReset):
                    self._handle_dead_peer(peer_id)  # what upstream's sender does when write_msg fails
                    return
        except Exception:
            self._handle_dead_peer(peer_id)


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
