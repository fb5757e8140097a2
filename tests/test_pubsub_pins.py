"""Pins: one test per py-libp2p 0.8.1 behaviour that an override of `transports.pubsub`, or a scoring decision,
relies on. Each fails when upstream changes that behaviour, so that the override is re-examined (re-measured with
benchmarks/bench_pubsub.py, or dropped) before an upgrade ships. docs/transports.md maps each override to its pins.

Behaviour is checked by running it wherever it can be; the source text only where the behaviour is the *absence* of
something (no await between two lines, no checkpoint, no caller), or the shape of a call an override hooks.
"""

from __future__ import annotations

import inspect
import re
from importlib.metadata import version
from pathlib import Path

import libp2p
import pytest
import trio
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.rpc_queue import OutBoundQueueSize, RpcQueue
from libp2p.pubsub.score import PeerScorer, ScoreParams, TopicScoreParams
from libp2p.pubsub.utils import maybe_consume_signed_record
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import YamuxStream
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

from tests.pubsub_support import gossip_node, make_offer
from tests.test_p2p_fakes import run_trio, wait_until
from transports.gossip import MESHSUB_PROTOCOLS, OFFERS_TOPIC
from transports.hardening.yamux import CappedWindowStream
from transports.pubsub import LEAN, STOCK, BufferedReader, GossipScorer, PubsubTuning, batch_credit, score_params
from transports.pubsub.reads import BatchedCreditStream, BatchedCreditYamuxStream
from transports.pubsub.router import LeanGossipSub, trim_delivery_history
from transports.wire.identity import NodeIdentity


def test_the_version_is_the_one_the_overrides_were_measured_on() -> None:
    assert version("libp2p") == "0.8.1"


def a_peer() -> ID:
    return ID(NodeIdentity.generate().libp2p_keypair().public_key.serialize())


# -- buffered reads (reads.BufferedReader, reads.BufferedNoiseTransport) ----------------------------------------


class _Recorder:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sizes: list[int | None] = []

    async def read(self, n: int | None = None) -> bytes:
        self.sizes.append(n)
        take = len(self.data) if n is None else n
        out, self.data = self.data[:take], self.data[take:]
        return out


def test_pubsub_reads_each_varint_one_byte_at_a_time() -> None:
    """BufferedReader exists because of this (utils/varint.py): if upstream buffers, re-measure it."""

    async def main() -> None:
        reader = _Recorder(bytes([0xAC, 0x02]) + b"x" * 300)  # a two-byte varint
        assert await read_varint_prefixed_bytes_limited(reader, 1 << 20) == b"x" * 300  # type: ignore[arg-type]
        assert reader.sizes[:2] == [1, 1]

    run_trio(main)


def test_pubsubs_reader_touches_the_stream_only_through_what_the_wrapper_forwards() -> None:
    """continuously_read_stream and stream_handler use the stream's muxed_conn, metric_send_channel and reset (and
    read, through utils.varint): BufferedReader's `read` is its own, the rest the stream's."""
    src = inspect.getsource(Pubsub.continuously_read_stream) + inspect.getsource(Pubsub.stream_handler)
    assert set(re.findall(r"\bstream\.(\w+)", src)) <= {"muxed_conn", "metric_send_channel", "reset"}
    assert "read_varint_prefixed_bytes_limited(\n                    stream," in src


def test_noise_hands_the_raw_connection_to_its_handshake_pattern_and_nothing_else() -> None:
    """BufferedNoiseTransport wraps the connection on its way in; the session reads it only through the pattern."""
    for method, call in (
        (NoiseTransport.secure_inbound, "await pattern.handshake_inbound(conn)"),
        (NoiseTransport.secure_outbound, "await pattern.handshake_outbound(conn, peer_id)"),
    ):
        src = inspect.getsource(method)
        code = src.split('"""')[0] + src.split('"""')[2]  # without the docstring
        assert call in code
        assert len(re.findall(r"\bconn\b", code)) == 2  # the parameter, and that one use of it


# -- the peer record once per stream (router.LeanGossipSub.send_rpc) -------------------------------------------


def test_the_hello_goes_straight_to_the_stream_and_carries_our_record() -> None:
    src = inspect.getsource(Pubsub._handle_new_peer)
    assert "hello = self.get_hello_packet()" in src
    assert "await stream.write(encode_varint_prefixed(hello.SerializeToString()))" in src
    assert "packet.senderRecord = envelope_bytes" in inspect.getsource(Pubsub.get_hello_packet)


def test_an_rpc_without_a_record_is_accepted() -> None:
    assert maybe_consume_signed_record(rpc_pb2.RPC(), host=None, peer_id=None) is True  # type: ignore[arg-type]


def test_send_rpc_queues_a_copy_of_the_rpc_it_is_given() -> None:
    src = inspect.getsource(GossipSub.send_rpc)
    assert "outbound.CopyFrom(rpc)" in src and "queue.split_rpc(outbound)" in src


def test_every_router_path_attaches_our_record_upstream() -> None:
    """What the override removes (if upstream stops attaching it, the override has nothing left to do)."""
    for fn in (GossipSub.publish, GossipSub.emit_control_message, GossipSub.handle_iwant):
        assert "env_to_send_in_RPC(" in inspect.getsource(fn), fn.__name__


# -- cached addresses (service.CachedAddrsHost) ----------------------------------------------------------------


def test_the_record_is_rebuilt_from_get_addrs_and_reissued_when_they_change() -> None:
    src = inspect.getsource(env_to_send_in_RPC)
    assert "host.get_addrs()" in src and "record_addrs_set == listen_addrs_set" in src


# -- IDONTWANT only for large messages (router.LeanGossipSub) ---------------------------------------------------


def test_publish_reaches_idontwant_with_no_await_in_between() -> None:
    """The size `publish` notes is that message's: nothing else runs before `_emit_idontwant_for_message`."""
    before = inspect.getsource(GossipSub.publish).split("await self._emit_idontwant_for_message(")[0]
    assert "await " not in before


def test_upstream_idontwant_never_sees_the_message_so_it_cannot_threshold_by_size() -> None:
    assert list(inspect.signature(GossipSub._emit_idontwant_for_message).parameters) == ["self", "msg_id", "topic_ids"]


# -- coalesced writes (service.LeanPubsub.handle_sending_messages) ----------------------------------------------


def test_rpc_queue_pop_does_not_checkpoint_while_items_are_queued() -> None:
    async def main() -> None:
        queue = RpcQueue()
        assert queue.push(rpc_pb2.RPC()) and queue.push(rpc_pb2.RPC())
        with trio.CancelScope() as scope:
            scope.cancel()  # any checkpoint inside pop would raise Cancelled here
            assert await queue.pop() is not None
            assert await queue.pop() is not None
        assert not scope.cancelled_caught

    run_trio(main)


def test_the_sender_is_one_task_per_peer_given_its_stream_and_queue() -> None:
    src = inspect.getsource(Pubsub._handle_new_peer)
    assert "self.manager.run_task(self.handle_sending_messages, peer_id, stream, queue)" in src
    assert OutBoundQueueSize == 32
    # What ours does when a write fails, as upstream's write_msg does.
    assert "self._handle_dead_peer(peer_id)" in inspect.getsource(Pubsub.write_msg)


# -- duplicates dropped early and holders skipped (service.LeanPubsub, service.ForwarderNotingReader, holders) --


def test_the_reader_asks_is_subscribed_for_each_message_right_before_its_push_msg_task() -> None:
    src = inspect.getsource(Pubsub.continuously_read_stream)
    loop = src.split("for msg in rpc_incoming.publish:")[1].split("if rpc_incoming.subscriptions:")[0]
    assert loop.index("if not self._is_subscribed_to_msg(msg):") < loop.index(
        "self.manager.run_task(self.push_msg, peer_id, msg)"
    )
    assert "await " not in loop
    assert src.count("_is_subscribed_to_msg") == 1  # nobody else asks: answering no only skips this message


def test_no_checkpoint_lies_between_the_readers_last_read_and_its_messages() -> None:
    """`ForwarderNotingReader` notes the peer at each read; `_is_subscribed_to_msg` must still see that peer."""
    src = inspect.getsource(Pubsub.continuously_read_stream)
    after_read = src.split("await read_varint_prefixed_bytes_limited(")[1].split("if rpc_incoming.subscriptions:")[0]
    assert "await " not in after_read
    assert not inspect.iscoroutinefunction(maybe_consume_signed_record)
    assert src.index("peer_id = stream.muxed_conn.peer_id") < src.index("read_varint_prefixed_bytes_limited(")


def test_push_msg_drops_a_seen_copy_first_thing_and_marks_a_message_seen_only_once_valid() -> None:
    """A seen copy is dropped after the blacklist checks alone (nothing counted, nothing awaited): answering no for
    it earlier changes nothing but the task. Seen means validated: a copy of a message still being validated is
    not dropped early."""
    src = inspect.getsource(Pubsub.push_msg).split('"""', 2)[2]
    before_seen = src.split("if self._is_msg_seen(msg):")[0]
    assert "await " not in before_seen and "scorer" not in before_seen
    assert src.split("if self._is_msg_seen(msg):")[1].lstrip().startswith("return")
    assert src.index("await self.validate_msg(") < src.index("self._mark_msg_seen(msg)")
    assert src.index("self._mark_msg_seen(msg)") < src.index("await self.router.publish(")
    assert "self._mark_msg_seen(" not in inspect.getsource(Pubsub.publish)  # our own go through push_msg too


def test_gossipsub_forwards_to_the_peers_of_get_peers_to_send_given_the_message_id() -> None:
    src = inspect.getsource(GossipSub.publish)
    assert "peers_gen = self._get_peers_to_send(" in src and "msg_id=msg_id," in src
    assert "for peer_id in peers_gen:" in src
    assert inspect.isgeneratorfunction(GossipSub._get_peers_to_send)


# -- half-window credit (reads.batch_credit) --------------------------------------------------------------------


def test_yamux_streams_can_be_switched_to_the_batched_credit_classes() -> None:
    for base, switched in ((YamuxStream, BatchedCreditYamuxStream), (CappedWindowStream, BatchedCreditStream)):
        stream = base.__new__(base)

        class Net:
            muxed_stream = stream

        assert batch_credit(Net())  # TypeError here if the layouts stop matching
        assert type(stream) is switched and isinstance(stream, base)


def test_yamux_reads_credit_through_the_overridden_method() -> None:
    src = inspect.getsource(YamuxStream.read)
    assert "await self._auto_tune_and_send_window_update(bytes_read=len(data))" in src
    assert list(inspect.signature(YamuxStream.send_window_update).parameters) == ["self", "increment", "skip_lock"]


# -- the delivery history (router.trim_delivery_history) --------------------------------------------------------


def test_the_delivery_history_grows_without_bound_when_adaptive_gossip_is_off() -> None:
    """trim_delivery_history exists because of this; it runs from `_periodic_security_cleanup`, which the router
    heartbeat calls every time, whatever is enabled."""
    router = GossipSub(protocols=[], degree=6, degree_low=4, degree_high=12, adaptive_gossip_enabled=False)
    router.recent_message_deliveries[OFFERS_TOPIC].extend([0.0] * 1000)  # from 1970: long expired
    router.last_health_update = 0
    router._update_network_health()
    assert len(router.recent_message_deliveries[OFFERS_TOPIC]) == 1000
    assert "self.recent_message_deliveries[topic].append(time.time())" in inspect.getsource(GossipSub.publish)
    heartbeat = inspect.getsource(GossipSub.heartbeat)
    assert "            self._periodic_security_cleanup()\n" in heartbeat  # unconditional, in the loop
    assert trim_delivery_history(router, now=1e9) == 0


# -- scoring (scoring.GossipScorer, ScoreEnforcer, the thresholds) ---------------------------------------------


def test_p4_is_linear_capped_and_off_with_the_default_cap() -> None:
    peer = a_peer()
    off = PeerScorer(ScoreParams(p4_invalid_messages=TopicScoreParams(weight=1.0)))  # cap 0 by default
    on = PeerScorer(score_params())
    for _ in range(30):
        off.on_invalid_message(peer, OFFERS_TOPIC)
        on.on_invalid_message(peer, OFFERS_TOPIC)
    assert off.topic_score(peer, OFFERS_TOPIC) == 0.0
    assert on.topic_score(peer, OFFERS_TOPIC) == -30.0  # linear, not squared


def test_one_parameter_set_serves_every_topic() -> None:
    fields = set(ScoreParams.__dataclass_fields__)
    assert "topics" not in fields and "topic_params" not in fields


def test_refusals_count_against_the_forwarder_only_from_validators_and_after_the_publish_gate() -> None:
    src = inspect.getsource(Pubsub.push_msg)
    signature_check = src.split("if not signature_validator(msg):")[1].split("try:")[0]
    assert "on_invalid_message" not in signature_check  # bad pubsub signatures: dropped, not counted
    assert "scorer.on_invalid_message(msg_forwarder, topic)" in src
    # The publish gate comes first: a peer below it is never validated again (hence graylist = publish).
    assert src.index("allow_publish(msg_forwarder") < src.index("signature_validator(msg)")
    assert "Cached validation failed" in inspect.getsource(Pubsub.validate_msg)  # cached refusals count too


def test_nothing_runs_between_push_msg_and_the_count_of_its_refusal_with_synchronous_validators() -> None:
    """GossipScorer's IGNORE reads the message `LeanPubsub.push_msg` noted: no checkpoint may come in between."""
    push = inspect.getsource(Pubsub.push_msg)
    before_validation = push.split("await self.validate_msg(msg_forwarder, msg)")[0]
    assert "await " not in before_validation.split('"""', 2)[2]
    after = push.split("except ValidationError:")[1].split("scorer.on_invalid_message")[0]
    assert "await " not in after
    validate = inspect.getsource(Pubsub.validate_msg)
    before_sync = validate.split("for validator in sync_topic_validators:")[0]
    assert "await " not in before_sync.split('"""', 2)[2]
    sync_part = validate.split("for validator in sync_topic_validators:")[1].split("# Run asynchronous")[0]
    assert "await " not in sync_part and "raise ValidationError" in sync_part


def test_pubsub_asks_is_peer_blacklisted_for_every_message_and_before_opening_a_stream() -> None:
    push = inspect.getsource(Pubsub.push_msg)
    assert "self.is_peer_blacklisted(msg_forwarder)" in push and "self.is_peer_blacklisted(msg_from_peer)" in push
    assert "if self.is_peer_blacklisted(peer_id):" in inspect.getsource(Pubsub._handle_new_peer)


def test_the_pubsub_blacklist_leaves_the_router_state_behind() -> None:
    """Why bans go through our PenaltyBox and a disconnect, not `add_to_blacklist`."""
    assert "router.remove_peer" not in inspect.getsource(Pubsub._teardown_if_connected)
    assert "self.router.remove_peer(peer_id)" in inspect.getsource(Pubsub._handle_dead_peer)


def test_nothing_calls_on_mesh_delivery() -> None:
    root = Path(libp2p.__file__).parent
    callers = [p for p in root.rglob("*.py") if "on_mesh_delivery(" in p.read_text() and p.name != "score.py"]
    assert callers == []


def test_scores_are_forgotten_on_disconnect() -> None:
    """The ban lives in the PenaltyBox because of this."""
    assert "self.scorer.remove_peer(peer_id)" in inspect.getsource(GossipSub.remove_peer)


def test_the_forward_limit_penalises_the_forwarder_and_is_skipped_when_disabled() -> None:
    """Why it is off once real thresholds are on: honest relays past it would lose 5 a message."""
    src = inspect.getsource(GossipSub._check_spam_protection)
    assert "if not self.spam_protection_enabled:" in src and "penalize_behavior(peer_id, 5.0)" in src
    assert inspect.getsource(GossipSub.publish).index("_check_spam_protection") < 400


def test_the_router_heartbeat_decays_the_scorer_and_our_router_carries_our_scorer() -> None:
    assert "self.scorer.on_heartbeat()" in inspect.getsource(GossipSub.heartbeat)
    router = LeanGossipSub(LEAN, protocols=list(MESHSUB_PROTOCOLS), degree=6, degree_low=4, degree_high=12)
    assert isinstance(router.scorer, GossipScorer)
    assert router.scorer.params.graylist_threshold == -50.0 and not router.spam_protection_enabled
    stock = LeanGossipSub(STOCK, protocols=list(MESHSUB_PROTOCOLS), degree=6, degree_low=4, degree_high=12)
    assert type(stock.scorer) is PeerScorer and stock.spam_protection_enabled


def test_the_swarm_registers_every_connection_through_add_conn() -> None:
    """GuardedSwarm.add_conn is the ban gate, for inbound and outbound connections alike."""
    assert 'await self.add_conn(muxed_conn, direction="inbound")' in inspect.getsource(Swarm.upgrade_inbound_raw_conn)
    assert 'await self.add_conn(muxed_conn, direction="outbound")' in inspect.getsource(Swarm.upgrade_outbound_raw_conn)


def test_trio_refuses_a_task_in_a_closed_nursery_with_the_message_the_gossip_reader_recognises() -> None:
    """GossipTransport._read_pubsub_stream tells pubsub stopping from a bug by this message (buffered reads drain
    more RPCs without a checkpoint, so a reader is likelier to outlive pubsub's nursery by a few messages)."""
    from transports.gossip import NURSERY_CLOSED

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            pass
        with pytest.raises(RuntimeError) as refused:
            nursery.start_soon(trio.sleep, 0)
        assert str(refused.value) == NURSERY_CLOSED

    run_trio(main)


# -- end to end: real hosts, every override on, off, and one side each ----------------------------------------

TUNINGS = {"lean": LEAN, "stock": STOCK}


@pytest.mark.parametrize(("a", "b"), [("lean", "lean"), ("stock", "stock"), ("lean", "stock"), ("stock", "lean")])
def test_two_hosts_exchange_offers_each_way_and_a_stream_past_the_window(a: str, b: str) -> None:
    """Lean and stock nodes interoperate (every override is local: the wire is the same), and a switched yamux
    stream carries 3 MiB, well past its 256 KiB window, so credit keeps flowing."""

    async def main() -> None:
        async with gossip_node(tuning=TUNINGS[a]) as left, gossip_node(tuning=TUNINGS[b]) as right:
            await left.host.connect(right.addr)
            await wait_until(lambda: left.host.peer_id in right.gossip.mesh_peers(), what="mesh at right")
            await wait_until(lambda: right.host.peer_id in left.gossip.mesh_peers(), what="mesh at left")
            one, other = make_offer(left.identity, 1), make_offer(right.identity, 2)
            assert await left.gossip.publish_offer(one) is None
            assert await right.gossip.publish_offer(other) is None
            await wait_until(lambda: one in right.heard and other in left.heard, what="an offer each way")

            size, got = 3 * 1024 * 1024, trio.Event()

            async def sink(stream: object) -> None:
                batch_credit(stream)
                reader: object = BufferedReader(stream)
                total = 0
                while total < size:
                    chunk = await reader.read(65536)  # type: ignore[attr-defined]
                    if not chunk:
                        break
                    total += len(chunk)
                if total >= size:
                    got.set()

            right.host.set_handler("/pin/bulk/1", sink)
            stream = await left.host.open_stream(right.host.peer_id, "/pin/bulk/1")
            for _ in range(size // 65536):
                await stream.write(b"q" * 65536)
            with trio.fail_after(30):
                await got.wait()

    run_trio(main)


def test_a_tuning_turns_each_override_off_alone() -> None:
    """Each field of PubsubTuning is read by the code it names (an override that breaks can be switched off)."""
    fields = set(PubsubTuning.__dataclass_fields__)
    root = Path(__file__).resolve().parent.parent / "transports"
    used = "".join(p.read_text() for p in root.rglob("*.py") if p.name != "tuning.py")
    assert {f for f in fields if f"tuning.{f}" not in used} == set()
