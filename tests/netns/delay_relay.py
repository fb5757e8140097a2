"""A TCP relay that adds a fixed one-way delay: the kernel here has no netem, so delay is added in userspace.

    python -m tests.netns.delay_relay --listen 10.77.1.5:4001 --to 10.77.2.10:4001 --delay-ms 100

Each accepted connection gets its own connection to `--to`. Every chunk of bytes, either way, is written out
`delay-ms` after it was read (order kept; an EOF is delayed like data), so a round trip through the relay gains at
least twice the delay. TCP handshakes with the relay itself are not delayed. The first stdout line is
`{"event": "ready", ...}` once the relay listens; it runs until SIGTERM or SIGINT.

`tests.netns.processes.DelayRelay` starts one inside a topology's namespace.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import trio

# Chunks in flight per direction: bounds the relay's memory when the far side reads slowly (the near side then
# stops being read, and TCP flow control pushes back on the sender, as a slow link would).
IN_FLIGHT = 256
CHUNK = 65536


def _endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, delay: float) -> None:
    """source → sink, each chunk held until `delay` after it arrived. Returns after forwarding the EOF."""
    send, receive = trio.open_memory_channel[tuple[float, bytes]](IN_FLIGHT)

    async def read() -> None:
        async with send:
            while True:
                data = await source.receive_some(CHUNK)
                await send.send((trio.current_time() + delay, data))
                if not data:  # EOF, forwarded in its turn
                    return

    async def write() -> None:
        async with receive:
            async for due, data in receive:
                await trio.sleep_until(due)
                if not data:
                    await sink.send_eof()
                    return
                await sink.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        nursery.start_soon(write)


async def _relay_one(client: trio.SocketStream, target: tuple[str, int], delay: float) -> None:
    async with client:
        try:
            upstream = await trio.open_tcp_stream(*target)
        except OSError:
            return  # the far side is down: the client sees its connection close, as it would without the relay
        async with upstream:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, delay)
                    nursery.start_soon(_pump, upstream, client, delay)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # a reset on either side ends the pair; closing both tells the other side


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(listen[1], host=listen[0])
            port = listeners[0].socket.getsockname()[1]

            async def handle(stream: trio.SocketStream) -> None:
                await _relay_one(stream, target, delay)

            nursery.start_soon(trio.serve_listeners, handle, listeners)
            ready = {"event": "ready", "listen": f"{listen[0]}:{port}", "to": f"{target[0]}:{target[1]}"}
            print(json.dumps({**ready, "delayMs": round(delay * 1000)}), flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=_endpoint, required=True)
    parser.add_argument("--to", type=_endpoint, required=True)
    parser.add_argument("--delay-ms", type=int, required=True)
    options = parser.parse_args(argv)
    if options.delay_ms < 0:
        parser.error("--delay-ms must be >= 0")
    trio.run(serve, options.listen, options.to, options.delay_ms / 1000)


if __name__ == "__main__":
    main(sys.argv[1:])
