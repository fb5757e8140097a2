"""`edgecoder`: the command line, the contract that users and tests rely on."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mesh.identity import KeyFileError, NodeIdentity


def load_identity(path: Path) -> NodeIdentity:
    """A key file problem is a message and exit code 2, never a traceback."""
    try:
        return NodeIdentity.load(path)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A mesh node that runs strangers' signed task offers, only ever inside a hardened Docker sandbox."""


@main.command()
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the 32-byte Ed25519 seed (mode 0600).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing key file.")
def keygen(out: Path, force: bool) -> None:
    """Write a new node identity and print its PeerID."""
    identity = NodeIdentity.generate()
    try:
        identity.save(out, force=force)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(identity.peer_id)


if __name__ == "__main__":
    sys.exit(main())
