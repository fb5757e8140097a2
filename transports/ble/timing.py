"""How long BLE takes: a model of one offer and its result over a real radio, from the link's parameters.

bumble's `LocalLink` (and the virtual controllers of `bumble.apps.controllers`) delivers packets as fast as the event
loop runs, so nothing timed on it says how long a radio takes. This model does, from three parameters of a
connection and from what this protocol sends (`framing`: a 7-byte first header, 2 bytes on every later frame, a
16-byte digest per message):

* ATT_MTU: a notification or a write request carries MTU-3 bytes of value, which is one frame.
* the connection interval: the two radios exchange packets only at connection events, one event per interval.
* packets per connection event: how many notifications the two stacks fit into one event.

Rules, one per kind of exchange:

* Notifications (offering side -> node: the offer, GRANT, RESULT_ACK) go `packets_per_event` frames per event.
* Write requests (node -> offering side: CLAIM, RESULT, REFUSAL) go one frame per interval: each write waits for its
  response, which is what paces the sender and keeps the frames in order.
* Every other ATT request and its response (a read or read blob, a discovery step, a CCCD write, SEND_OFFER) takes
  one interval. That is the best case; stacks that answer in the following event take two.
* Before the first packet, the node must hear an advertisement (half the advertising interval on average) and open
  the connection (one interval).

The presets are the defaults each platform gives a connection, checked against published figures (see docs/ble.md):
iOS 300-400 kbps at 15 ms, Android over 1 Mbps, Linux (BlueZ defaults, 48.75 ms, MTU 23) about 0.4 KB/s.

`LinkPacer` plays the same rules on a virtual radio (tests, `--ble-link-model`, the BLE simulation), so that what is
measured there can be set beside what the model computes.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from transports.ble.framing import DIGEST_SIZE, FIRST_HEADER_SIZE, SEQ, notify_frame_size

# What the node's central does on every link before the offer flows (transports/ble/central.py): discovery of the
# GATT database as the bumble backend runs it (3 services, 6 characteristics, their descriptors), then two reads,
# two CCCD writes and the SEND_OFFER write.
DISCOVERY_ROUND_TRIPS = 16
# Typical encoded sizes of the small messages (measured from this protocol's encoders with real identities).
IDENTITY_BYTES = 106
CAPABILITIES_BYTES = 50
CLAIM_BYTES = 187
ANSWER_BYTES = 14


@dataclass(frozen=True, slots=True)
class LinkProfile:
    name: str
    att_mtu: int
    connection_interval_ms: float
    packets_per_event: int
    advertising_interval_ms: float = 100.0
    note: str = ""

    @property
    def frame_size(self) -> int:
        return notify_frame_size(self.att_mtu)

    @property
    def interval_s(self) -> float:
        return self.connection_interval_ms / 1000

    @property
    def notify_bytes_per_s(self) -> float:
        """Raw value bytes a second in notifications (before this protocol's headers)."""
        return (self.att_mtu - 3) * self.packets_per_event / self.interval_s


PRESETS: dict[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile("ios", 185, 15.0, 4, note="iPhone: 15 ms minimum interval, MTU 185, ~4 packets an event"),
        LinkProfile("android", 247, 7.5, 4, note="Android high priority: 7.5 ms, DLE (MTU 247), 2M PHY"),
        LinkProfile("linux", 23, 48.75, 1, note="BlueZ defaults: 48.75 ms, no MTU exchange (23), 1 packet an event"),
    )
}


def frames_for(message_bytes: int, frame_size: int) -> int:
    """How many frames `framing.encode_frames` cuts a message of this size into (digest included)."""
    stream = message_bytes + DIGEST_SIZE
    first = frame_size - FIRST_HEADER_SIZE
    if stream <= first:
        return 1
    return 1 + math.ceil((stream - first) / (frame_size - SEQ.size))


def read_round_trips(value_bytes: int, att_mtu: int) -> int:
    """A read returns MTU-1 bytes; the rest comes in Read Blob requests of MTU-1 bytes each."""
    return max(1, math.ceil(value_bytes / (att_mtu - 1)))


@dataclass(frozen=True, slots=True)
class OfferTiming:
    """Where the time of one offer goes, in seconds, on one link profile."""

    profile: str
    offer_bytes: int
    result_bytes: int
    discover_and_connect: float
    setup: float  # GATT discovery, reads, subscriptions, SEND_OFFER
    offer: float
    claim: float  # the CLAIM writes and the GRANT notification
    result: float  # the RESULT writes and the RESULT_ACK notification

    @property
    def to_offer(self) -> float:
        """From advertising to the whole offer at the node: what the node's transfer deadline must cover."""
        return self.discover_and_connect + self.setup + self.offer

    @property
    def total(self) -> float:
        """Advertising to the verified result at the offerer, not counting the run itself."""
        return self.to_offer + self.claim + self.result


def notify_time(message_bytes: int, profile: LinkProfile) -> float:
    events = math.ceil(frames_for(message_bytes, profile.frame_size) / profile.packets_per_event)
    return events * profile.interval_s


def write_time(message_bytes: int, profile: LinkProfile) -> float:
    return frames_for(message_bytes, profile.frame_size) * profile.interval_s


def offer_timing(offer_bytes: int, result_bytes: int, profile: LinkProfile) -> OfferTiming:
    rt = profile.interval_s
    reads = read_round_trips(IDENTITY_BYTES, profile.att_mtu) + read_round_trips(CAPABILITIES_BYTES, profile.att_mtu)
    mtu_exchange = 1 if profile.att_mtu > 23 else 0
    return OfferTiming(
        profile=profile.name,
        offer_bytes=offer_bytes,
        result_bytes=result_bytes,
        discover_and_connect=profile.advertising_interval_ms / 2000 + rt,
        setup=(mtu_exchange + DISCOVERY_ROUND_TRIPS + reads + 2 + 1) * rt,
        offer=notify_time(offer_bytes, profile),
        claim=write_time(CLAIM_BYTES, profile) + notify_time(ANSWER_BYTES, profile),
        result=write_time(result_bytes, profile) + notify_time(ANSWER_BYTES, profile),
    )


def largest_offer_within(seconds: float, profile: LinkProfile, *, result_bytes: int = 1024) -> int:
    """The largest offer (bytes) whose whole exchange, result included, fits in `seconds` on this profile."""
    low, high = 0, 1 << 24
    if offer_timing(0, result_bytes, profile).total > seconds:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if offer_timing(middle, result_bytes, profile).total <= seconds:
            low = middle
        else:
            high = middle - 1
    return low


def largest_offer_delivered_within(seconds: float, profile: LinkProfile) -> int:
    """The largest offer the node can fetch before a transfer deadline of `seconds` (advertising to last frame)."""
    low, high = 0, 1 << 24
    if offer_timing(0, 0, profile).to_offer > seconds:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if offer_timing(middle, 0, profile).to_offer <= seconds:
            low = middle
        else:
            high = middle - 1
    return low


class LinkPacer:
    """Plays a `LinkProfile` on a virtual radio: waits where a real radio would wait for its next connection event.

    One pacer per link and direction of use. Asyncio side.
    """

    def __init__(self, profile: LinkProfile) -> None:
        self.profile = profile
        self._in_event = 0

    async def notification(self) -> None:
        """Before each notification frame: `packets_per_event` frames share one connection event."""
        if self._in_event == self.profile.packets_per_event:
            await asyncio.sleep(self.profile.interval_s)
            self._in_event = 0
        self._in_event += 1

    async def round_trip(self, count: int = 1) -> None:
        """A write request and its response, or any other ATT request and its response."""
        await asyncio.sleep(count * self.profile.interval_s)
