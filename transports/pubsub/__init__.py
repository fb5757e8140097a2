"""py-libp2p 0.8.1's pubsub path made cheaper and defended, by configuration and subclassing only (no fork).

| module | what |
|---|---|
| `tuning` | `PubsubTuning`: every switch below in one value; `LEAN` (ours) and `STOCK` (py-libp2p's path) |
| `reads` | buffered Noise and pubsub reads; yamux credit every half window on pubsub streams |
| `service` | `LeanPubsub`: coalesced writes, early duplicates, bans, the message being validated; `CachedAddrsHost` |
| `holders` | `Holders`: which peers sent us each recent message, so that nobody is sent back what it sent |
| `router` | `LeanGossipSub`: peer record once per stream, IDONTWANT only for large messages, history trimmed, scoring |
| `scoring` | real thresholds, IGNORE, `GossipScorer` and `ScoreEnforcer` (peers below graylist cut off) |

Measured by `benchmarks/bench_pubsub.py` (CPU per message received, `STOCK` against `LEAN`, side by side); every
upstream behaviour relied on is pinned by tests/test_pubsub_pins.py, which fails when an upgrade changes one.
"""

from transports.pubsub.holders import Holders
from transports.pubsub.reads import BufferedNoiseTransport, BufferedReader, batch_credit
from transports.pubsub.router import LeanGossipSub, trim_delivery_history
from transports.pubsub.scoring import REJECTED, GossipScorer, ScoreEnforcer, score_params
from transports.pubsub.service import CachedAddrsHost, ForwarderNotingReader, LeanPubsub
from transports.pubsub.tuning import LEAN, STOCK, PubsubTuning

__all__ = [
    "LEAN",
    "REJECTED",
    "STOCK",
    "BufferedNoiseTransport",
    "BufferedReader",
    "CachedAddrsHost",
    "ForwarderNotingReader",
    "GossipScorer",
    "Holders",
    "LeanGossipSub",
    "LeanPubsub",
    "PubsubTuning",
    "ScoreEnforcer",
    "batch_credit",
    "score_params",
    "trim_delivery_history",
]
