"""`edgecoder cancel`: stop a job this key offered, at the node running it (docs/jobs.md).

Built on first use (mesh.cli.LAZY_COMMANDS), like `coordinator`. A one-shot node (it takes no work, and is not
advertised) signs the cancel with the offer's own key and sends it to the runner, which answers with the signed
result the job ended with: `aborted` with the output so far, or how it had already ended.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mesh.cli_common import EXIT_REFUSED, InputError, emit, load_identity, run_command

if TYPE_CHECKING:
    from mesh.offerer import OfferOutcome
    from transports.wire.identity import NodeIdentity


@dataclass
class CancelOptions:
    identity: NodeIdentity
    to: str
    offer_id: bytes


async def run_cancel(options: CancelOptions) -> OfferOutcome:
    from mesh.node import MeshNode, NodeConfig
    from transports.addresses import ip_of, local_address_towards
    from transports.operator_addrs import parse_peer_addr
    from transports.wire.identity import NodeIdentity

    towards = ip_of(parse_peer_addr(options.to)[0])
    here = local_address_towards(towards) if towards else "127.0.0.1"
    # A throwaway key for the connection: the offer's key is the offering process's PeerID, and a second connection
    # under it would displace that process's (its offer stream with it). The cancel itself is signed with the
    # offer's key.
    config = NodeConfig(
        identity=NodeIdentity.generate(),
        listen=[f"/ip6/{here}/tcp/0" if ":" in here else f"/ip4/{here}/tcp/0"],
        sandbox_mode="none",
        mdns=False,
        advertise=False,
        forward_offers=False,
    )
    async with MeshNode.open(config) as node:
        return await node.cancel(options.to, options.offer_id, signer=options.identity)


@click.command()
@click.option("--key", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The offer's own key.")
@click.option("--to", "to", required=True, help="The multiaddr (ending in /p2p/PEERID) of the node running it.")
@click.argument("offer_id")
def cancel(key: Path, to: str, offer_id: str) -> None:
    """Cancel offer OFFER_ID (32 hex digits) at the node running it, and print the signed result it ended with
    (exit 0; `aborted` with the output so far, or its result if it had already ended), or the refusal (exit 3)."""
    from transports.operator_addrs import AddressError, parse_peer_addr
    from transports.wire.offers import OFFER_ID_SIZE

    try:
        oid = bytes.fromhex(offer_id)
    except ValueError:
        oid = b""
    if len(oid) != OFFER_ID_SIZE:
        raise InputError(f"OFFER_ID must be {OFFER_ID_SIZE * 2} hex digits (the offerId an offer prints)")
    try:
        parse_peer_addr(to)  # it names the runner's PeerID: the answer is checked against that key
    except AddressError as exc:
        raise InputError(str(exc)) from None
    outcome = run_command(run_cancel, CancelOptions(load_identity(key), to, oid))
    if outcome.refusal is not None:
        emit({"ok": False, "refusal": str(outcome.refusal.reason), "detail": outcome.refusal.detail})
        sys.exit(EXIT_REFUSED)
    assert outcome.result is not None
    shown: dict[str, Any] = outcome.result.to_json()
    emit(shown)
