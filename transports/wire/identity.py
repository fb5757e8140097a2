"""One identity per node: a 32-byte Ed25519 seed that is both the libp2p host key and the signing key.

Because the same key is behind the PeerID, a peer's PeerID is exactly the key its offers and results verify against.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SEED_SIZE = 32
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64


class KeyFileError(Exception):
    """A key file that cannot be used, with a message meant for the person at the terminal."""


def peer_id_of(public_key: bytes) -> str:
    """The libp2p PeerID (`12D3KooW...`) of a raw Ed25519 public key."""
    # libp2p is imported lazily: it costs most of a second, and the codec's hot path never needs it.
    from libp2p.crypto.ed25519 import Ed25519PublicKey as P2PPublicKey
    from libp2p.peer.id import ID

    return ID.from_pubkey(P2PPublicKey.from_bytes(public_key)).to_base58()


def public_key_of_peer_id(peer_id: str) -> bytes:
    """The raw Ed25519 key embedded in a PeerID. Raises ValueError for a PeerID that embeds no Ed25519 key."""
    from libp2p.peer.id import ID

    try:
        key = ID.from_base58(peer_id).extract_public_key()
        raw = None if key is None else bytes(key.to_bytes())
    except Exception as exc:  # base58, multihash and protobuf each raise their own types for a bad PeerID
        raise ValueError(f"{peer_id[:64]!r} is not a PeerID: {type(exc).__name__}") from None
    if raw is None or len(raw) != PUBLIC_KEY_SIZE:
        raise ValueError(f"PeerID {peer_id[:64]} does not embed an Ed25519 public key")
    return raw


@functools.lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> Ed25519PublicKey:
    # Offerers repeat; parsing the same key again for every offer is wasted work on the intake's hot path.
    return Ed25519PublicKey.from_public_bytes(raw)


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        _public_key(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


class NodeIdentity:
    __slots__ = ("_key", "public_key", "seed")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_SIZE:
            raise ValueError(f"an Ed25519 seed is exactly {SEED_SIZE} bytes, not {len(seed)}")
        self.seed = bytes(seed)
        self._key = Ed25519PrivateKey.from_private_bytes(self.seed)
        # public_bytes_raw(), not public_bytes(Encoding.Raw, ...): the serialization module costs `keygen` 5 ms.
        self.public_key = self._key.public_key().public_bytes_raw()

    def __repr__(self) -> str:  # never print the seed
        return f"NodeIdentity(public_key={self.public_key.hex()})"

    @classmethod
    def generate(cls) -> NodeIdentity:
        return cls(os.urandom(SEED_SIZE))

    @property
    def peer_id(self) -> str:
        return peer_id_of(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def libp2p_keypair(self) -> Any:
        """The same seed as a libp2p KeyPair, for the host."""
        from libp2p.crypto.ed25519 import Ed25519PrivateKey as P2PPrivateKey
        from libp2p.crypto.keys import KeyPair

        private = P2PPrivateKey.from_bytes(self.seed)
        return KeyPair(private, private.get_public_key())

    # -- key files -------------------------------------------------------------------------------------------

    def save(self, path: Path, *, force: bool = False) -> None:
        """Write the raw seed with mode 0600. Refuses to overwrite unless `force`."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise KeyFileError(f"{path} already exists; pass --force to overwrite it") from None
        except OSError as exc:
            raise KeyFileError(f"cannot write {path}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to an existing file
            f.write(self.seed)

    @classmethod
    def load(cls, path: Path) -> NodeIdentity:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise KeyFileError(f"key file {path} is not a regular file")
            if mode & 0o077:
                raise KeyFileError(
                    f"key file {path} has loose permissions {stat.S_IMODE(mode):04o}; run: chmod 600 {path}"
                )
            seed = os.read(fd, SEED_SIZE + 1)
        finally:
            os.close(fd)
        if len(seed) != SEED_SIZE:
            raise KeyFileError(
                f"key file {path} holds {len(seed) if len(seed) <= SEED_SIZE else 'more than 32'} bytes; "
                f"an identity is exactly a {SEED_SIZE}-byte Ed25519 seed"
            )
        return cls(seed)
