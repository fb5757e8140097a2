"""The BLE timing model: its presets reproduce the published figures, and it counts frames as the framing cuts them.

No timing asserts here: the model is arithmetic. The simulation (`python -m simulations ble`) sets it beside what a
paced virtual radio measures.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from transports.ble import timing
from transports.ble.framing import encode_frames, notify_frame_size
from transports.ble.protocol import Answer, Capabilities, Claim, Kind, PeerInfo
from transports.ble.timing import PRESETS, frames_for, largest_offer_delivered_within, offer_timing
from transports.wire.identity import NodeIdentity


@given(st.integers(0, 20_000), st.integers(23, 517))
def test_frames_for_counts_what_encode_frames_cuts(size: int, mtu: int) -> None:
    assert frames_for(size, notify_frame_size(mtu)) == len(encode_frames(b"x" * size, notify_frame_size(mtu)))


def test_presets_reproduce_the_published_throughputs() -> None:
    ios, android, linux = PRESETS["ios"], PRESETS["android"], PRESETS["linux"]
    assert 300_000 <= ios.notify_bytes_per_s * 8 <= 400_000  # iPhone: 300-400 kbps at 15 ms
    assert android.notify_bytes_per_s * 8 > 1_000_000  # Android: over 1 Mbps
    assert 380 <= linux.notify_bytes_per_s <= 420  # Linux defaults: about 0.4 KB/s
    assert 9.5 <= timing.notify_time(4096, linux) <= 12.0  # "a 4 KB offer takes about 10 s"


def test_the_message_sizes_in_the_model_are_the_encoders() -> None:
    identity = NodeIdentity.generate()
    assert len(PeerInfo(identity.peer_id, identity.public_key).encode()) == timing.IDENTITY_BYTES
    assert len(Capabilities(bytes(16)).encode()) == timing.CAPABILITIES_BYTES
    assert len(Claim.signed(identity, bytes(16), bytes(32)).encode()) == timing.CLAIM_BYTES
    assert len(Answer(Kind.GRANT, True).encode()) == timing.ANSWER_BYTES


def test_time_grows_with_size_and_the_budget_is_the_inverse() -> None:
    for profile in PRESETS.values():
        times = [offer_timing(kb * 1024, 1024, profile).total for kb in (1, 4, 16, 64)]
        assert times == sorted(times)
        budget = largest_offer_delivered_within(60, profile)
        assert offer_timing(budget, 0, profile).to_offer <= 60 < offer_timing(budget + 64, 0, profile).to_offer
    # The size budget of docs/ble.md: a Linux-default link delivers about 21 KB within a node's 60 s deadline.
    assert 20_000 <= largest_offer_delivered_within(60, PRESETS["linux"]) <= 23_000
