"""A libp2p node in a process of its own, so that a test can read the node's memory (its RSS) while attacking it.

    python -m tests.hardening_node {stock|hardened}

Prints its full multiaddr on the first line, then one line per refusal (`refusal <reason>`, hardened only), and
serves until its stdin closes. Its protocols:

- `/test/noread/1.0.0`: holds the stream and never reads it (a handler busy with something else);
- `/test/sink/1.0.0`: reads to the end, then answers with the number of bytes it read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamEOF

from tests.hardening_support import LOOPBACK, full_addr, stock_host
from transports.hardening import Refusal
from transports.p2p import P2PHost, open_host
from transports.wire.identity import NodeIdentity

NOREAD = "/test/noread/1.0.0"
SINK = "/test/sink/1.0.0"


async def noread(stream: INetStream) -> None:
    await trio.sleep_forever()


async def read_to_end(stream: INetStream) -> int:
    """Bytes read until the peer closed its side (py-libp2p raises `StreamEOF` there rather than returning b"")."""
    received = 0
    try:
        while chunk := await stream.read(65536):
            received += len(chunk)
    except StreamEOF:
        pass
    return received


async def sink(stream: INetStream) -> None:
    try:
        received = await read_to_end(stream)
        await stream.write(str(received).encode())
        await stream.close()
    except Exception:
        await stream.reset()


def report(reason: Refusal) -> None:
    print(f"refusal {reason}", flush=True)


@asynccontextmanager
async def node(kind: str) -> AsyncIterator[tuple[str, P2PHost | None]]:
    if kind == "stock":
        async with stock_host() as host:
            host.set_stream_handler(NOREAD, noread)  # type: ignore[arg-type]
            host.set_stream_handler(SINK, sink)  # type: ignore[arg-type]
            yield full_addr(host), None
    else:
        async with open_host(NodeIdentity.generate(), [LOOPBACK], on_refusal=report) as p2p:
            p2p.set_handler(NOREAD, noread)
            p2p.set_handler(SINK, sink)
            yield p2p.addrs[0], p2p


async def main(kind: str) -> None:
    async with node(kind) as (addr, _):
        print(addr, flush=True)
        # Serve until the test closes our stdin (or dies, which closes it too).
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        while await stdin.receive_some():
            pass


if __name__ == "__main__":
    from mesh.logs import configure

    configure()  # logs on stderr: stdout carries only the address the test reads
    trio.run(main, sys.argv[1])
