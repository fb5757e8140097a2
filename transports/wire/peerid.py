"""PeerID text of an Ed25519 key without importing libp2p, for the commands that must start fast (`keygen`).

Importing libp2p costs about half a second, and `edgecoder keygen` needs only this one encoding. A libp2p PeerID
of an Ed25519 key is the base58btc text of an identity multihash over the key's protobuf `PublicKey` message (the
libp2p peer-ids spec): the key is short enough to be inlined rather than hashed. `tests/test_peerid.py` checks
this against libp2p's own `ID.from_pubkey` for arbitrary keys.
"""

from __future__ import annotations

import base58

# protobuf PublicKey { Type = 1 (Ed25519), Data = 32 bytes }: field 1 varint, field 2 length-delimited.
_ED25519_PUBLIC_KEY_PROTOBUF = bytes([0x08, 0x01, 0x12, 0x20])
_IDENTITY_MULTIHASH = 0x00
ED25519_KEY_SIZE = 32


def ed25519_peer_id(public_key: bytes) -> str:
    """`12D3KooW...`: the PeerID of a raw 32-byte Ed25519 public key."""
    if len(public_key) != ED25519_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key is {ED25519_KEY_SIZE} bytes, not {len(public_key)}")
    message = _ED25519_PUBLIC_KEY_PROTOBUF + public_key
    return base58.b58encode(bytes([_IDENTITY_MULTIHASH, len(message)]) + message).decode("ascii")
