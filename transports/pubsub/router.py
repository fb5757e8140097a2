"""py-libp2p's GossipSub router with the router half of the lean path, scoring, and a fix for a leak.

`transports.gossip.GossipRouter` derives from `LeanGossipSub` and adds our mesh settings; each behaviour here is
switched by the host's `PubsubTuning`, and each upstream behaviour it relies on is pinned in
tests/test_pubsub_pins.py.

- **The signed peer record once per stream** (`strip_sender_record`). Every router RPC gets our signed peer record
  (forwards, control messages, IWANT answers: `env_to_send_in_RPC` in `GossipSub.publish`, `emit_control_message`,
  `handle_iwant`), and the receiver parses it, verifies its Ed25519 signature and rewrites our addresses in its
  peerstore for each one: 4 signature verifications per message received, measured, almost all of them this record.
  The hello that opens each pubsub stream carries it (written straight to the stream, not through `send_rpc`), so
  `send_rpc` drops it from the rest. `send_rpc` queues a copy of the RPC it is given, so clearing the shared RPC is
  safe for the loop over peers that passes it.
- **IDONTWANT only for large messages** (`idontwant_threshold`). Upstream sends an IDONTWANT RPC to every mesh peer
  for every message it forwards, whatever its size (the spec warns that this hurts small messages; go-libp2p only
  does it above 1 KiB). `_emit_idontwant_for_message` sees no message, so `publish` notes the size first: nothing
  awaits between the two, so the size is that message's.
- **The per-message delivery history trimmed** every router heartbeat. `publish` appends a timestamp per forwarded
  message to `recent_message_deliveries`, trimmed only inside adaptive gossip's health check; with adaptive gossip
  off (ours) the list grows without bound (about 4.5 floats per node per second in a 10-node mesh).
- **Holders skipped** (`skip_holders`): a new message is not forwarded to a peer that sent it to us
  (`transports.pubsub.holders`, recorded by `LeanPubsub` as each copy is read).
- **Scoring** (`scoring`): real thresholds, `GossipScorer` (IGNORE, graylist reports), and the per-topic forward
  limit off: it drops and penalises honest relays' traffic past 50 messages/s, and never sees invalid messages
  (they are refused before `GossipSub.publish`).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator
from typing import Any

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub

from transports.pubsub.scoring import GossipScorer, score_params
from transports.pubsub.tuning import PubsubTuning

# What adaptive gossip's health check looks at (the last minute); older delivery timestamps are dropped.
DELIVERY_HISTORY_SECONDS = 60.0


class LeanGossipSub(GossipSub):
    def __init__(self, tuning: PubsubTuning, **options: Any) -> None:
        if tuning.scoring:
            options.setdefault("score_params", score_params())
            options["spam_protection_enabled"] = False
        super().__init__(
            **options,
            adaptive_gossip_enabled=tuning.adaptive_gossip,
            eclipse_protection_enabled=tuning.eclipse_protection,
        )
        self.tuning = tuning
        if tuning.scoring:
            self.scorer = GossipScorer(options["score_params"])
        self._publishing_size = 0

    def attach(self, pubsub: Pubsub) -> None:
        super().attach(pubsub)
        scorer = self.scorer
        if isinstance(scorer, GossipScorer):
            receiving_id = getattr(pubsub, "receiving_id", None)
            if receiving_id is not None:
                scorer.current_message_id = receiving_id

    def refused(self, msg: rpc_pb2.Message, *, penalise: bool) -> None:
        """A topic validator of ours refused `msg`: with `penalise` False (IGNORE) its forwarder is not penalised."""
        if not penalise and isinstance(self.scorer, GossipScorer) and self.pubsub is not None:
            self.scorer.forgive(self.pubsub.get_message_id(msg))

    def send_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
        if self.tuning.strip_sender_record and rpc.senderRecord:
            rpc.ClearField("senderRecord")
        super().send_rpc(peer_id, rpc, priority)

    async def publish(self, msg_forwarder: ID, pubsub_msg: rpc_pb2.Message) -> None:
        self._publishing_size = len(pubsub_msg.data)
        await super().publish(msg_forwarder, pubsub_msg)

    async def _emit_idontwant_for_message(self, msg_id: bytes, topic_ids: Any) -> None:
        if self._publishing_size < self.tuning.idontwant_threshold:
            return
        await super()._emit_idontwant_for_message(msg_id, topic_ids)

    def _get_peers_to_send(
        self, topic_ids: Iterable[str], msg_forwarder: ID, origin: ID, msg_id: bytes | None = None
    ) -> Iterator[ID]:
        peers = super()._get_peers_to_send(topic_ids, msg_forwarder, origin, msg_id)
        holders = getattr(self.pubsub, "holders", None)
        if holders is None or msg_id is None:
            yield from peers
            return
        have = holders.of(msg_id)
        for peer in peers:
            if peer not in have:
                yield peer

    def _periodic_security_cleanup(self) -> None:
        super()._periodic_security_cleanup()
        trim_delivery_history(self)


def trim_delivery_history(
    router: GossipSub, *, keep: float = DELIVERY_HISTORY_SECONDS, now: float | None = None
) -> int:
    """Drop `recent_message_deliveries` entries older than `keep` seconds; how many are left.

    Entries are appended in time order (`time.time()` at each forward), so each list is cut at one bisection."""
    cutoff = (time.time() if now is None else now) - keep
    left = 0
    for times in router.recent_message_deliveries.values():
        del times[: bisect.bisect_right(times, cutoff)]
        left += len(times)
    return left
