"""What this node changes in py-libp2p's pubsub path, as one value: `LEAN` (ours) or `STOCK` (py-libp2p's own).

Every override of `transports.pubsub` is switched here, so that the benchmark (`benchmarks/bench_pubsub.py`) can
build both configurations through the very same construction code and compare them side by side, and so that each
override can be turned off alone when an upgrade of libp2p breaks its pin. `open_host(..., tuning=...)` takes it;
the host's transports (gossip, and through the host its Noise and yamux) read it from `P2PHost.tuning`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Below this an IDONTWANT (an RPC, a frame and a signed peer record to every mesh peer) costs more than the duplicate
# it saves: measured with every other override on, IDONTWANT for every message cost 0.65 ms per message received
# against 0.46 without (libp2p-pubsub research, bench lean_idw). Our heartbeats are ~200 B and offers ~1 KB; a large
# offer (tens of KB of code) still gets one. go-libp2p's own threshold is 1 KiB.
IDONTWANT_THRESHOLD = 8 * 1024


@dataclass(frozen=True, slots=True)
class PubsubTuning:
    # Transport: reads served from one buffer instead of a syscall and a scheduler pass per length prefix.
    buffered_noise: bool = True  # Noise reads its 2-byte length and its body from one 64 KiB socket read
    buffered_reads: bool = True  # pubsub reads each RPC's varint byte by byte: served from one yamux read
    batched_credit: bool = True  # a yamux WINDOW_UPDATE every half window on pubsub streams, not after each read
    control_reads: bool = True  # control streams (claims, grants, results) read as pubsub's: one buffer, batched credit
    # Pubsub: fewer RPCs, and records not rebuilt for each.
    strip_sender_record: bool = True  # our signed peer record once per stream (the hello), not in every RPC
    cached_addrs: bool = True  # pubsub's view of our addresses recomputed at most once a second
    coalesce_writes: bool = True  # everything queued for a peer in one write: one frame, one Noise message
    early_duplicates: bool = True  # a copy of a message already forwarded is dropped before pubsub spawns its task
    skip_holders: bool = True  # a message is not sent to a peer that sent it to us
    idontwant_threshold: int = IDONTWANT_THRESHOLD  # 0: an IDONTWANT for every message, as upstream
    # Scoring with real thresholds, penalties for invalid messages, peers below the graylist cut off; and with it
    # the per-topic forward limit off (it penalises honest relays and never sees invalid messages).
    scoring: bool = True
    # GossipSub v2 features of py-libp2p (upstream defaults: both on). Ours: adaptive gossip off (it stretches the
    # heartbeat to 30-60 s in a small mesh), eclipse protection on (inert in 0.8.1: peer IPs are never recorded).
    adaptive_gossip: bool = False
    eclipse_protection: bool = True


LEAN = PubsubTuning()
# py-libp2p 0.8.1's receive and forward path as the node ran it before these overrides: stock Noise, yamux credit,
# pubsub reads and writes, a peer record in every RPC, IDONTWANT for every message, neutral scoring and the forward
# limit on. The mesh settings of `transports.gossip.GossipRouter` (degree, 1 s heartbeat, protocols) are kept.
STOCK = PubsubTuning(
    buffered_noise=False,
    buffered_reads=False,
    batched_credit=False,
    control_reads=False,
    strip_sender_record=False,
    cached_addrs=False,
    coalesce_writes=False,
    early_duplicates=False,
    skip_holders=False,
    idontwant_threshold=0,
    scoring=False,
)


def with_gossip_features(tuning: PubsubTuning, *, adaptive_gossip: bool, eclipse_protection: bool) -> PubsubTuning:
    return replace(tuning, adaptive_gossip=adaptive_gossip, eclipse_protection=eclipse_protection)
