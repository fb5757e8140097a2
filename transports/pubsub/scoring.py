"""GossipSub peer scoring with real thresholds, the GossipSub spec's IGNORE, and the enforcement py-libp2p lacks.

py-libp2p 0.8.1 builds a `PeerScorer` for every router, with thresholds of minus infinity: 200 bad-signature offers
from one relay did not get it pruned. What its scorer does, and what follows for the parameters below (each pinned
in tests/test_pubsub_pins.py):

- One `ScoreParams` for every topic: P1-P4 are counted per (peer, topic), weighted by the same parameters.
- **P4 (invalid messages) is linear** (`weight * min(count, cap)`, not squared as in the spec) and off by default
  (`cap` 0). Pubsub counts one against the *forwarder* each time a topic validator refuses a message, a refusal
  cached by message id included. It does not count messages refused by strict signing or by the publish gate.
- Every counter decays once per router heartbeat (1 s here).
- The gates: below `publish_threshold` a forwarder's messages are dropped on arrival, before signature and validator
  (so they stop being counted: the score stops falling just under it, which is why the graylist threshold equals
  the publish threshold here); below `gossip_threshold` it gets no forwards and no IHAVE. Nothing in 0.8.1 ignores a
  graylisted peer's RPCs or disconnects it, and its score is forgotten when it disconnects.

Hence three pieces of our own:

- **IGNORE.** The spec lets a validator refuse without penalty (go-libp2p's `ValidationIgnore`); 0.8.1 has only
  true/false. An honest relay forwards what *its* validator accepts; what ours refuses because of a clock, a version
  or a local policy (an offer that expired in transit, a newer version, a lower size limit) says nothing bad about
  it, and an attacker could otherwise get honest relays cut off by feeding them offers about to expire. Only
  refusals that every honest node would make, whatever its clock and policy (`REJECTED`: bad signature,
  malformed), count. `GossipScorer.forgive(message_id)` marks the others, and `on_invalid_message` skips them;
  it learns the message being validated from `LeanPubsub.receiving` (no checkpoint lies between pubsub entering
  `push_msg` and counting the refusal, with synchronous validators: pinned).
- **Reporting** a peer the moment its score on a topic falls below the graylist threshold (on the refusal that
  takes it there, or in the heartbeat for P5 behaviour penalties), to `graylisted`.
- **`ScoreEnforcer`** (in `transports.gossip`'s nursery): a reported peer is banned on the host's `PenaltyBox` (so
  its RPCs are dropped at once, its pubsub and direct streams reset, its reconnects refused at the swarm for the ban
  time) and disconnected; the refusal is counted as `invalid_gossip`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams

from transports.hardening.refusals import Refusal
from transports.wire.reasons import Reason

log = logging.getLogger(__name__)

GOSSIP_THRESHOLD = -10.0
PUBLISH_THRESHOLD = -50.0
# Equal to the publish threshold, not below it as the spec orders them: a message the publish gate drops is never
# validated, so never counted, and a flooder's score stops just under the publish threshold (measured: -50.2 to -51.0
# for 20 s at 250/s). A graylist threshold below it would never be reached.
GRAYLIST_THRESHOLD = PUBLISH_THRESHOLD

# Refusals of our validators that no honest node's validator would have let through, whatever its clock, version
# or policy: these are the GossipSub spec's REJECT and count against the forwarder (P4). Every other refusal is an
# IGNORE: the message is dropped and not forwarded, and the forwarder is not penalised.
REJECTED = frozenset({Reason.BAD_SIGNATURE, Reason.MALFORMED})
# Message ids of IGNOREd messages remembered, so that a refusal served from pubsub's validation cache (1000 entries)
# is forgiven too. Larger than that cache: an id cannot leave this before it leaves the cache.
FORGIVEN_IDS = 4096


def score_params() -> ScoreParams:
    """Thresholds ordered graylist = publish < gossip < 0, sized for our validators and a 1 s router heartbeat.

    An honest peer forwards only what passes the same validator, so a REJECT from it is a bug or an attack: each
    costs 1, decaying 1 % a second (half-life about 70 s). Ten: we stop forwarding to it. Fifty: its messages are
    dropped unvalidated and the enforcer cuts it off; at 250 a second, a fifth of a second.
    First deliveries earn at most +1 (0.05 each, capped at 20), so relaying good messages cannot buy a flood back.
    P5 (behaviour: py-libp2p's GRAFT-flood check, IWANT/IHAVE spam, equivocation) counts above 20 at weight 0.1: the
    GRAFT-flood check fires on honest mesh churn (10 each), and one event must not graylist anyone.
    """
    return ScoreParams(
        p2_first_message_deliveries=TopicScoreParams(weight=0.05, cap=20.0, decay=0.99),
        p4_invalid_messages=TopicScoreParams(weight=1.0, cap=1000.0, decay=0.99),
        p5_behavior_penalty_weight=0.1,
        p5_behavior_penalty_threshold=20.0,
        p5_behavior_penalty_decay=0.9,
        gossip_threshold=GOSSIP_THRESHOLD,
        publish_threshold=PUBLISH_THRESHOLD,
        graylist_threshold=GRAYLIST_THRESHOLD,
        accept_px_threshold=0.0,
    )


def _no_message() -> bytes | None:
    return None


def _nobody(peer: ID) -> None:
    return None


class GossipScorer(PeerScorer):
    """py-libp2p's scorer, with IGNORE (forgiven refusals) and a report when a peer falls below graylist."""

    def __init__(self, params: ScoreParams) -> None:
        super().__init__(params)
        # The message id pubsub is validating right now (bound by the router when pubsub attaches it).
        self.current_message_id: Callable[[], bytes | None] = _no_message
        self.graylisted: Callable[[ID], None] = _nobody  # set by the ScoreEnforcer
        self._forgiven: OrderedDict[bytes, None] = OrderedDict()
        self.forgiven = 0  # refusals not counted (IGNORE), for tests and diagnostics
        self.counted = 0  # refusals counted (REJECT)

    def forgive(self, message_id: bytes) -> None:
        """The validator refused this message with an IGNORE: no forwarder is penalised for it."""
        self._forgiven[message_id] = None
        self._forgiven.move_to_end(message_id)
        while len(self._forgiven) > FORGIVEN_IDS:
            self._forgiven.popitem(last=False)

    def on_invalid_message(self, peer: ID, topic: str) -> None:
        current = self.current_message_id()
        if current is not None and current in self._forgiven:
            self.forgiven += 1
            return
        self.counted += 1
        super().on_invalid_message(peer, topic)
        if self.score(peer, [topic]) < self.params.graylist_threshold:
            self.graylisted(peer)

    def on_heartbeat(self, dt_seconds: float = 1.0) -> None:
        super().on_heartbeat(dt_seconds)
        # P5 can take a peer below the threshold without any invalid message of its own.
        threshold = self.params.graylist_threshold
        penalised = (
            set(self.behavior_penalty)
            | set(self.graft_flood_penalties)
            | set(self.iwant_spam_penalties)
            | set(self.ihave_spam_penalties)
            | set(self.equivocation_penalties)
        )
        for peer in penalised:
            if self.score(peer, []) < threshold:
                self.graylisted(peer)


class ScoreEnforcer:
    """Cuts off the peers the scorer reports: banned on the host's `PenaltyBox`, disconnected, counted.

    Reports arrive synchronously from inside pubsub's message handling; they are queued here (bounded: a peer
    reported again while queued is not queued twice) and acted on in `run`, a task of the gossip transport.
    """

    def __init__(self, host: Any, scorer: GossipScorer) -> None:
        self.host = host  # transports.p2p.P2PHost
        self.scorer = scorer
        self._send, self._receive = trio.open_memory_channel[ID](256)
        self._queued: set[ID] = set()
        self.cut: list[str] = []  # peers cut off, oldest first (bounded), for tests and diagnostics
        scorer.graylisted = self.report

    def report(self, peer: ID) -> None:
        if peer in self._queued:
            return
        try:
            self._send.send_nowait(peer)
        except trio.WouldBlock:
            return  # 256 cut-offs pending: this one is reported again by its next refusal or heartbeat
        self._queued.add(peer)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for peer in self._receive:
            self._queued.discard(peer)
            peer_id = peer.to_base58()
            if not self.host.penalties.ban(peer_id):
                continue  # banned already (by gossip or by the direct streams): being cut off
            log.info("peer %s fell below the gossip graylist threshold: cut off", peer_id)
            self.cut.append(peer_id)
            del self.cut[:-1024]
            await self.host.cut_off(peer_id, Refusal.INVALID_GOSSIP)
