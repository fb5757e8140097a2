"""GossipSub: offers heard by the whole mesh.

One topic, `edgecoder/offers/1`. A topic validator runs the intake's cheap checks and the offer signature before
libp2p forwards anything, so an invalid offer stops at the first honest hop. Every node is in the offers mesh and
forwards valid offers, seeds and relays that cannot sandbox included (a mesh whose routers dropped out would cut
offerers off from runners); a node hands offers to its intake only while it participates, and its intake takes only
those whose audience invites it. Presence (who can run what) is not flooded: it travels between neighbours only
(`transports.presence`).

One message id per topic (`message_id`, written byte for byte in docs/protocol.md), used everywhere an id is:

- offers: sha256 of the message data (the signed offer's wire bytes), so one offer re-published or heard through two
  paths is one message and reaches each sink once;
- any other topic: the libp2p spec's default, `from || seqno` (the sender's PeerID bytes, then the 8-byte big-endian
  seqno), which any implementation can compute from the message alone.

py-libp2p hands `msg_id_constructor` to its seen cache, validation cache and IDONTWANT, but its message cache keys
entries by `from + seqno` whatever the constructor says (`pubsub/mcache.py`), and IHAVE and IWANT are built from that
cache. Our IHAVE then named offers by an id no peer had seen them under: peers IWANTed offers they already had, and
js-libp2p counted a broken promise against us each time. `GossipRouter` gives the cache the pubsub's own id.

libp2p defaults overridden here, and why:

- `heartbeat_interval=1` (default 120 s): the mesh is built and repaired in the heartbeat; at 120 s a new peer waits
  two minutes for its first offer. go-libp2p uses 1 s.
- `adaptive_gossip_enabled=False` (default on): after 30 s a small mesh scores as unhealthy and the adaptation
  stretches the heartbeat to 30 s, or 60 s for a "moderate" one, and keeps it there: the mesh repairs itself twice a
  minute and new peers are replayed offers from the message cache minutes old. No other implementation does this.
- protocols: `/meshsub/1.2.0`, `1.1.0` and `1.0.0` only (`MESHSUB_PROTOCOLS`). The specs stop at 1.2 (1.3 is a draft);
  py-libp2p defines 1.3, 1.4 and 2.0 ids with features of its own, and a router given them offers them to every peer.
- `seen_ttl` 11 minutes (default 120 s): an offer lives at most 10 minutes plus 30 s of clock skew, and gossip should
  not hand the same offer to the intake twice while it is still valid (the intake's replay check stays the backstop).
- `max_messages_per_topic_per_second=FORWARD_LIMIT_PER_TOPIC` (default 10): the limit applies per *forwarding* peer
  per topic, and a neighbour relays the offers of every offerer behind it: at 10/s the mesh would silently drop
  offers past ten a second. 50/s leaves room for bursts (each node also paces its own publishes). With scoring on
  (`PubsubTuning.scoring`, ours) the limit is off altogether: it never sees invalid messages, and it penalises
  honest relays.
- peer scoring with real thresholds (`transports.pubsub.scoring`, default: neutral). A validator refusal counts
  against the forwarder only when no honest node would have forwarded the message (`REJECTED`: bad signature,
  malformed); a peer whose score falls below the graylist threshold is banned and disconnected (`ScoreEnforcer`).
- the receive and forward path of `transports.pubsub` (`LeanGossipSub`, `LeanPubsub`, buffered reads on pubsub
  streams), switched by the host's `PubsubTuning`.
- `unsubscribe_back_off=1` (default 10 s): a peer that leaves and rejoins a topic
  should be back in the mesh within a couple of heartbeats, not ten seconds later.
- `strict_signing=True` (already the default; stated so it cannot silently change).

Publishing is paced (`OFFER_PUBLISH_INTERVAL`): libp2p's per-peer outbound queue and per-subscription queue are 32
deep and drop the excess silently, and our own publishes count against the forward limit above.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.pubsub.mcache import CacheEntry, MessageCache
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from transports.base import Delivery, OfferSink
from transports.direct import DirectTransport, ReplyError
from transports.hardening.refusals import Refusal
from transports.p2p import P2PHost
from transports.pubsub import (
    LEAN,
    REJECTED,
    BufferedReader,
    ForwarderNotingReader,
    GossipScorer,
    LeanGossipSub,
    LeanPubsub,
    PubsubTuning,
    ScoreEnforcer,
    batch_credit,
)
from transports.pubsub.tuning import with_gossip_features
from transports.wire.identity import peer_id_of
from transports.wire.offers import parse_offer
from transports.wire.reasons import Reason, Rejected, Rejection
from transports.wire.sealed import SealKey, open_payload, seal_result

log = logging.getLogger(__name__)

OFFERS_TOPIC = "edgecoder/offers/1"

FORWARD_LIMIT_PER_TOPIC = 50.0
# At most 20 offers/s from this node: well under the forward limit and the 32-deep queues at loopback/LAN speeds.
OFFER_PUBLISH_INTERVAL = 0.05
SEEN_TTL_SECONDS = 11 * 60
# Received offers wait here for the intake; past this many the newest are dropped and counted, never silently.
DELIVERY_QUEUE = 256
# The GossipSub versions we offer, best first. Nothing past 1.2: see the module docstring.
MESHSUB_PROTOCOLS: tuple[TProtocol, ...] = (PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID)

ValidateFn = Callable[[bytes], Rejection | None]
HeardFn = Callable[[bytes, str], None]


MessageIdFn = Callable[[rpc_pb2.Message], bytes]


def message_id(msg: rpc_pb2.Message) -> bytes:
    """The id of a pubsub message: sha256(data) on the offers topic, `from || seqno` on any other."""
    if OFFERS_TOPIC in msg.topicIDs:
        return hashlib.sha256(msg.data).digest()
    return bytes(msg.from_id) + bytes(msg.seqno)


class MessageIdCache(MessageCache):
    """py-libp2p's message cache (the window IHAVE advertises and IWANT is served from), keyed by `message_id`.

    Upstream `put` keys entries by `from + seqno` whatever id the pubsub uses; this `put` is upstream's with the key
    swapped. `get`, `window` and `shift` are upstream's and read the same `msgs` and `history`, so a change to that
    layout upstream is caught by tests/test_gossip_ids.py.
    """

    def __init__(self, window_size: int, history_size: int, message_id: MessageIdFn) -> None:
        super().__init__(window_size, history_size)
        self.message_id = message_id

    def put(self, msg: rpc_pb2.Message) -> None:
        mid = self.message_id(msg)
        if mid in self.msgs:
            return
        self.msgs[mid] = msg
        self.history[0].append(CacheEntry(mid, msg.topicIDs))


class GossipRouter(LeanGossipSub):
    """py-libp2p's GossipSub as we run it: meshsub 1.2/1.1/1.0, no adaptive gossip, and a message cache that uses
    the pubsub's own message id (bound when the pubsub attaches itself, before any message can arrive); the lean
    path and scoring as `tuning` says (`transports.pubsub.router`).

    `tuning` also switches py-libp2p's two GossipSub "v2" features (upstream: both on), so that `python -m
    simulations scale` can measure the mesh with each on and off. Eclipse protection grafts peers for IP diversity
    from the scorer's record of peer IPs, which 0.8.1 never fills (it looks for the peer's stream before pubsub has
    stored it): it is kept at upstream's default, and inert."""

    def __init__(self, tuning: PubsubTuning = LEAN) -> None:
        super().__init__(
            tuning,
            protocols=list(MESHSUB_PROTOCOLS),
            degree=6,
            degree_low=4,
            degree_high=12,
            heartbeat_interval=1,
            unsubscribe_back_off=1,
            max_messages_per_topic_per_second=FORWARD_LIMIT_PER_TOPIC,
        )

    def attach(self, pubsub: Pubsub) -> None:
        super().attach(pubsub)
        self.mcache = MessageIdCache(self.mcache.window_size, self.mcache.history_size, pubsub.get_message_id)


def _nursery_closed(exc: RuntimeError) -> bool:
    """Trio's refusal to start a task in a nursery whose body has exited (pinned in tests/test_pubsub_pins.py)."""
    return str(exc) == NURSERY_CLOSED


NURSERY_CLOSED = "Nursery is closed to new arrivals"


def _sender(msg: rpc_pb2.Message) -> str:
    return str(ID(msg.from_id).to_base58())


class GossipTransport:
    name = "gossip"

    def __init__(
        self,
        host: P2PHost,
        direct: DirectTransport,
        *,
        validate: ValidateFn,
        forward_offers: bool = True,
        adaptive_gossip: bool | None = None,
        eclipse_protection: bool | None = None,
    ) -> None:
        """`adaptive_gossip` and `eclipse_protection`, when given, override the host's `PubsubTuning`."""
        self.host = host
        # A node in the offers mesh relays offers for others. A one-shot offerer is a client: it publishes through
        # a fanout and relays nothing (it will be gone in a minute).
        self.forward_offers = forward_offers
        self.sink: OfferSink | None = None  # set by run()
        self.direct = direct
        self.validate = validate
        # Counters: offers rejected by reason, queue drops, deliveries.
        self.stats: Counter[str] = Counter()
        tuning = host.tuning
        tuning = with_gossip_features(
            tuning,
            adaptive_gossip=tuning.adaptive_gossip if adaptive_gossip is None else adaptive_gossip,
            eclipse_protection=tuning.eclipse_protection if eclipse_protection is None else eclipse_protection,
        )
        self.router = GossipRouter(tuning)
        scorer = self.router.scorer
        self.enforcer = ScoreEnforcer(host, scorer) if isinstance(scorer, GossipScorer) else None
        self.pubsub = host.new_pubsub(
            self.router,
            strict_signing=True,
            msg_id_constructor=message_id,
            seen_ttl=SEEN_TTL_SECONDS,
        )
        # Pubsub reads each peer's inbound stream in a task libp2p's swarm owns, and schedules work on pubsub's own
        # service from there. If pubsub stops while such a stream still delivers, that scheduling raises into the
        # swarm and tears the host down. We track those streams so that `run` can end them before pubsub stops.
        self._inbound_streams: dict[INetStream, trio.CancelScope] = {}
        self._no_inbound_streams = trio.Event()
        # The host listens (and peers reconnect: a restarted node is redialled at once) before pubsub's service
        # runs; pubsub's own handler then fails on its missing manager and tears the connection down. Inbound
        # pubsub streams wait for this instead.
        self._pubsub_ready = trio.Event()
        self._closing = False
        # Told of every valid offer this node receives, taken or only forwarded (simulations measure delivery
        # with it, over nodes that cannot take offers).
        self._heard: list[HeardFn] = []
        self._own_id = ID.from_base58(host.peer_id).to_bytes()
        for protocol in self.router.get_protocols():
            host.set_handler(protocol, self._read_pubsub_stream)
        self.pubsub.set_topic_validator(OFFERS_TOPIC, self._offer_is_valid, False)
        self._nursery: trio.Nursery | None = None
        self._publish_lock = trio.Lock()
        self._next_publish = 0.0

    @property
    def subscribed(self) -> bool:
        return OFFERS_TOPIC in self.pubsub.topic_ids

    def mesh_peers(self, topic: str = OFFERS_TOPIC) -> list[str]:
        """Peers in our GossipSub mesh for `topic` (for diagnostics and tests)."""
        return [p.to_base58() for p in self.router.mesh.get(topic, ())]

    def offer_subscribers(self) -> list[str]:
        """Peers known to be subscribed to the offers topic: they take offers (a node subscribes only while its
        sandbox gate is open). Learnt from subscription announcements, at once on connect."""
        return [p.to_base58() for p in self.pubsub.peer_topics.get(OFFERS_TOPIC, ())]

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run pubsub, the router and the offer readers until cancelled. Start with `nursery.start`."""
        self.sink = sink
        async with background_trio_service(self.pubsub), background_trio_service(self.router):
            await self.pubsub.wait_until_ready()
            self._pubsub_ready.set()
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    # Every node is in the offers mesh and forwards valid offers (seeds and relays included), whether
                    # it takes them or not: taking is the sink's `participating`, read for each offer.
                    if self.forward_offers:
                        offers = await self.pubsub.subscribe(OFFERS_TOPIC)
                        queue_in, queue_out = trio.open_memory_channel[rpc_pb2.Message](DELIVERY_QUEUE)
                        nursery.start_soon(self._read_offers, offers, queue_in)
                        nursery.start_soon(self._deliver_offers, queue_out)
                    if self.enforcer is not None:
                        await nursery.start(self.enforcer.run)
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True):
                    await self._end_inbound_streams()

    async def _read_pubsub_stream(self, stream: INetStream) -> None:
        if self._closing:
            await stream.reset()
            return
        if self.host.banned(stream.muxed_conn.peer_id.to_base58()):
            await stream.reset()  # a peer cut off for invalid messages, still connected for a moment
            return
        tuning = self.host.tuning
        if tuning.batched_credit:
            batch_credit(stream)  # before the first read
        # A cancel scope we own: trio cancellation wakes a read blocked in yamux, which a stream reset does not.
        with trio.CancelScope() as scope:
            self._inbound_streams[stream] = scope
            try:
                await self._pubsub_ready.wait()
                reader: Any = BufferedReader(stream) if tuning.buffered_reads else stream
                if isinstance(self.pubsub, LeanPubsub) and (tuning.early_duplicates or tuning.skip_holders):
                    reader = ForwarderNotingReader(reader, self.pubsub, stream.muxed_conn.peer_id)
                await self.pubsub.stream_handler(reader)
            except DecodeError:
                # An RPC that is not protobuf (upstream's reader lets protobuf's error out): the sender's fault, a
                # strike, and the stream reset. Raised further it would tear down the whole swarm.
                peer = stream.muxed_conn.peer_id.to_base58()
                banned = self.host.penalties.strike(peer)
                self.stats["pubsub_rpc_unparseable"] += 1
                with trio.move_on_after(1):
                    await stream.reset()
                if banned:
                    await self.host.cut_off(peer, Refusal.INVALID_FRAMES)
            except RuntimeError as exc:
                # Rarely a reader still drains buffered messages (no checkpoint, so our cancel has not landed yet)
                # as pubsub stops, and pubsub's closed nursery refuses the task it schedules per message. At
                # shutdown that message is moot; raised further it would tear down the whole swarm. The cancel that
                # stops pubsub can reach its nursery before our own `finally` has set `_closing`, and before
                # pubsub's manager says it is no longer running (it is "running" until its last task is done): a
                # nursery closed to new arrivals is pubsub stopping. Any other RuntimeError is a bug and goes up.
                # (Buffered reads make the drain longer: a buffer of RPCs is served without a checkpoint.)
                stopping = self._closing or not self.pubsub.manager.is_running or _nursery_closed(exc)
                if not stopping:
                    raise
                log.debug("pubsub stream ended during shutdown", exc_info=True)
            finally:
                del self._inbound_streams[stream]
                if not self._inbound_streams:
                    self._no_inbound_streams.set()

    async def _end_inbound_streams(self) -> None:
        """Refuse new pubsub streams and cancel the readers of open ones, so none outlives pubsub."""
        self._closing = True
        for protocol in self.router.get_protocols():
            self.host.remove_handler(protocol)
        for scope in self._inbound_streams.values():
            scope.cancel()
        if self._inbound_streams:
            self._no_inbound_streams = trio.Event()
            with trio.move_on_after(1):
                await self._no_inbound_streams.wait()

    # -- offers ------------------------------------------------------------------------------------------------

    async def publish_offer(self, raw: bytes) -> Rejection | None:
        """Publish one signed offer, paced. Returns the validator's rejection instead of publishing an invalid one."""
        rejection = self.validate(raw)
        if rejection is not None:
            return rejection
        async with self._publish_lock:
            await trio.sleep_until(self._next_publish)
            await self.pubsub.publish(OFFERS_TOPIC, raw)
            self._next_publish = trio.current_time() + OFFER_PUBLISH_INTERVAL
        return None

    def _offer_is_valid(self, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        try:
            rejection = self.validate(bytes(msg.data))
        except Exception:  # a validator bug must not become "valid", nor crash libp2p's task, nor blame the peer
            log.exception("offer validator raised; treating the offer as invalid")
            self.router.refused(msg, penalise=False)
            self.stats[f"offer_rejected:{Reason.MALFORMED}"] += 1
            return False
        if rejection is None:
            return True
        self.stats[f"offer_rejected:{rejection.reason}"] += 1
        # Only what no honest relay would have forwarded counts against the forwarder (GossipSub's REJECT); a
        # refusal of our clock or policy is an IGNORE.
        self.router.refused(msg, penalise=rejection.reason in REJECTED)
        return False

    async def _read_offers(self, subscription: Any, queue: trio.MemorySendChannel[rpc_pb2.Message]) -> None:
        async with queue:
            async for msg in subscription:
                try:
                    queue.send_nowait(msg)
                except trio.WouldBlock:
                    self.stats["offer_dropped_queue_full"] += 1

    def on_heard(self, callback: HeardFn) -> None:
        self._heard.append(callback)

    async def _deliver_offers(self, queue: trio.MemoryReceiveChannel[rpc_pb2.Message]) -> None:
        async with queue:
            async for msg in queue:
                if bytes(msg.from_id) == self._own_id:
                    continue  # libp2p hands our own publishes to our own subscription: not heard, not work
                for heard in self._heard:
                    heard(bytes(msg.data), _sender(msg))
                await self._deliver_offer(msg)

    async def _deliver_offer(self, msg: rpc_pb2.Message) -> None:
        sink = self.sink
        if sink is None or not sink.participating:
            self.stats["offer_forwarded_not_taken"] += 1  # this node relays offers it cannot take, and no more
            return
        raw = bytes(msg.data)
        try:
            received = parse_offer(raw)  # already validated: read only the id, where to answer, and any seal
        except Rejected:
            self.stats["offer_unparseable_after_validation"] += 1
            return
        offer = received.offer
        offerer = peer_id_of(offer.offerer)
        if offerer == self.host.peer_id:
            # libp2p hands our own publishes to our own subscription. Judged by the offerer, not the pubsub sender:
            # whoever (re)published it, an offer of ours is never work for us.
            return
        # Only addresses of the offerer itself: a signed offer must not be able to point every node at a third party.
        targets = [a for a in offer.reply_to if a.endswith(f"/p2p/{offerer}")]
        direct = self.direct
        terms = offer.sealed

        async def ask(target: str) -> Rejection | None:
            """A claim; for a sealed offer, with a key of our own for this claim, the payload the grant carries
            opened and checked into the delivery (or why it would not open)."""
            if terms is None:
                return await direct.request_claim(target, offer.offer_id)
            key = SealKey()
            answer = await direct.request_sealed_claim(target, offer.offer_id, key.public)
            if isinstance(answer, Rejection):
                return answer
            try:
                delivery.payload = open_payload(answer, received.digest, key, terms)
            except Rejected as rejected:
                self.stats["offer_payload_refused"] += 1
                delivery.payload = rejected.rejection  # granted all the same: the node answers it, running nothing
            return None

        async def claim() -> bool:
            for target in self._reachable(offerer, targets):
                rejection = await ask(target)
                if rejection is None:
                    return True
                if rejection.reason != Reason.UNREACHABLE:
                    return False  # the offerer answered: no
            return False

        async def send(target: str, result: bytes) -> Rejection | None:
            if terms is None:
                return await direct.send_result(target, result)
            sealed = seal_result(result, received.digest, terms.key)
            return await direct.send_sealed_result(target, offer.offer_id, sealed)

        async def reply(result: bytes) -> None:
            last: Rejection | None = None
            for target in self._reachable(offerer, targets):
                last = await send(target, result)
                if last is None:
                    return
                if last.reason != Reason.UNREACHABLE:
                    break
            raise ReplyError(f"the offerer did not take the result: {last}")

        self.stats["offer_delivered"] += 1
        delivery = Delivery(raw, "gossip", sender=_sender(msg), reply=reply, claim=claim)
        await sink.deliver(delivery)

    def _reachable(self, offerer: str, targets: list[str]) -> list[str]:
        """The offerer's PeerID first when we are already connected to it, then its advertised addresses."""
        connected = [offerer] if offerer in self.host.connected_peers() else []
        return connected + targets
