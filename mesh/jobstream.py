"""One run's output as it comes, for a follower (`edgecoder offer --follow`): framed, ordered, bounded.

The sandbox hands every piece of output within the result's caps to `push` (executor/runcontrol.py), from its read
loop, so `push` never blocks: pieces become `OutputChunk`s (at most 16 KiB each, numbered in order) in a buffer of
`budget` chunks, which `forward` drains to the follower at the follower's pace. When the follower is slower than the
program and the buffer is full, a chunk is dropped and counted instead (its number is skipped, so the follower sees
the gap): a slow reader never slows the sandbox. A follower that stops taking chunks has the rest counted as
dropped. The digest covers exactly the chunks delivered, in order, and goes into the signed result
(`streamDigest`, `streamDropped`), so the follower can check that what it showed is what the runner signed.

Without a follower nothing is buffered; the pieces are only counted (`bytes`), which tells `/status` a run has
spoken.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from transports.wire.jobs import MAX_CHUNK_BYTES, OutputChunk, StreamDigest

# Chunks held for a slow follower: with 16 KiB chunks, the two 64 KiB output caps several times over.
STREAM_BUDGET = 64


class JobStream:
    def __init__(self, *, follow: bool, budget: int = STREAM_BUDGET) -> None:
        self.follow = follow
        self.bytes = 0
        self.seq = 0
        self.dropped = 0
        self.delivered = 0
        self.digest = StreamDigest()
        self._send, self._chunks = trio.open_memory_channel[OutputChunk](budget if follow else 0)
        if not follow:
            self._send.close()

    def push(self, stream: str, data: bytes) -> None:
        self.bytes += len(data)
        if not self.follow:
            return
        for start in range(0, len(data), MAX_CHUNK_BYTES):
            chunk = OutputChunk(self.seq, stream, data[start : start + MAX_CHUNK_BYTES])
            self.seq += 1
            try:
                self._send.send_nowait(chunk)
            except (trio.WouldBlock, trio.ClosedResourceError):
                self.dropped += 1

    def close(self) -> None:
        """The run has ended: `forward` sends what is queued, then returns."""
        self._send.close()

    async def forward(self, send: Callable[[OutputChunk], Awaitable[bool]]) -> None:
        """Carry the chunks to the follower, in order, until `close` and the queue is empty."""
        gone = False
        async with self._chunks:
            async for chunk in self._chunks:
                if not gone and await send(chunk):
                    self.digest.update(chunk)
                    self.delivered += 1
                else:
                    gone = True
                    self.dropped += 1

    def abandon(self) -> None:
        """The follower took too long to drain what was left: the rest counts as dropped."""
        self._send.close()
        while True:
            try:
                self._chunks.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            self.dropped += 1
