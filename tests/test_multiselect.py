"""A handler removed while a peer's stream negotiates its protocol (a transport stopping as a node stops): the
stream is refused and the host keeps serving, where py-libp2p 0.8.1 raised KeyError out of the host
(transports/multiselect.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.network.stream.exceptions import StreamReset
from libp2p.protocol_muxer.exceptions import MultiselectError
from libp2p.protocol_muxer.multiselect import MULTISELECT_PROTOCOL_ID, Multiselect
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator

from tests.test_p2p_fakes import LOOPBACK, run_trio
from transports.framing import read_frame, write_frame
from transports.multiselect import SettledMultiselect
from transports.wire.identity import NodeIdentity

PROTOCOL = TProtocol("/edgecoder/test-removed/1.0.0")


async def echo(stream: Any) -> None:
    await write_frame(stream, await read_frame(stream, max_len=64, timeout=5))
    await stream.close()


class RemovedWhileEchoing:
    """A peer asking for PROTOCOL, over a communicator whose echo of it is when the handler goes away."""

    def __init__(self, multiselect: Multiselect) -> None:
        self.multiselect = multiselect
        self.reads = [MULTISELECT_PROTOCOL_ID, PROTOCOL]

    async def read(self) -> str:
        return self.reads.pop(0)

    async def write(self, message: str) -> None:
        if message == PROTOCOL:
            self.multiselect.remove_handler(PROTOCOL)
        await trio.lowlevel.checkpoint()


def test_pin_upstream_negotiate_raises_key_error_for_a_handler_removed_mid_negotiation() -> None:
    """If this starts failing, upstream fixed the race and SettledMultiselect can go."""
    multiselect = Multiselect({PROTOCOL: echo})

    async def main() -> None:
        with pytest.raises(KeyError):
            await multiselect.negotiate(RemovedWhileEchoing(multiselect))  # type: ignore[arg-type]

    run_trio(main)


def test_a_handler_removed_mid_negotiation_is_a_multiselect_error() -> None:
    multiselect = SettledMultiselect({PROTOCOL: echo})

    async def main() -> None:
        with pytest.raises(MultiselectError, match="removed during negotiation"):
            await multiselect.negotiate(RemovedWhileEchoing(multiselect))  # type: ignore[arg-type]

    run_trio(main)


def test_over_a_real_connection_the_stream_is_refused_and_the_host_keeps_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from libp2p.host import basic_host

    from transports.p2p import DialError, open_host

    server: Any = None

    class Removing(MultiselectCommunicator):
        """Both hosts' communicator. The client proposes PROTOCOL first; the second write of it is the server's echo,
        after its check that a handler is there: that is when the handler goes away (once)."""

        writes = 0
        armed = True

        async def write(self, msg_str: str) -> None:
            if msg_str == PROTOCOL:
                Removing.writes += 1
                if Removing.writes == 2 and Removing.armed:
                    Removing.armed = False
                    server.remove_handler(PROTOCOL)
            await super().write(msg_str)

    async def main() -> None:
        nonlocal server
        async with (
            open_host(NodeIdentity.generate(), [LOOPBACK]) as server,
            open_host(NodeIdentity.generate(), [LOOPBACK]) as client,
        ):
            server.set_handler(PROTOCOL, echo)
            peer = await client.connect(server.addrs[0])
            monkeypatch.setattr(basic_host, "MultiselectCommunicator", Removing)
            # The server resets the stream: as the client reads the echo (DialError) or its first frame.
            with pytest.raises((DialError, StreamReset)):
                stream = await client.open_stream(peer, PROTOCOL)
                await write_frame(stream, b"first")
                await read_frame(stream, max_len=64, timeout=5)
            assert not Removing.armed
            server.set_handler(PROTOCOL, echo)  # the host still serves: the next stream is answered
            stream = await client.open_stream(peer, PROTOCOL)
            await write_frame(stream, b"second")
            assert await read_frame(stream, max_len=64, timeout=5) == b"second"
            assert peer in client.connected_peers()

    run_trio(main)
