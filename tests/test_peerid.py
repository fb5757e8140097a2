"""The PeerID text `keygen` prints without importing libp2p is libp2p's own, for every key."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import Ed25519PublicKey
from libp2p.peer.id import ID

from transports.wire.peerid import ed25519_peer_id


@given(st.binary(min_size=32, max_size=32))
def test_the_peer_id_matches_libp2p(raw: bytes) -> None:
    try:
        key = Ed25519PublicKey.from_bytes(raw)
    except ValueError:  # not a point on the curve: libp2p cannot even build it, and no identity has it
        return
    assert ed25519_peer_id(raw) == ID.from_pubkey(key).to_base58()


def test_a_key_of_another_size_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="32 bytes"):
        ed25519_peer_id(b"\x00" * 31)
