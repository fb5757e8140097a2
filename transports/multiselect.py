"""A protocol handler removed while a peer's stream negotiates it: that stream is refused, the host keeps serving.

py-libp2p 0.8.1's `Multiselect.negotiate` checks `protocol in self.handlers`, echoes the protocol to the peer (a
write, so other tasks run), then reads `self.handlers[protocol]`. A transport that stops in between removes its
handler (`DirectTransport.run` does as a node stops), and the lookup raised KeyError out of the host's stream task:
a one-shot `edgecoder offer --gossip` whose result was in died with "unexpected error: KeyError:
'/edgecoder/claim/1.0.0'" when a late claimant's stream arrived as it stopped (tests/test_netns_mesh.py, in CI).
Here the KeyError is the `MultiselectError` the host already answers by resetting the stream.
"""

from __future__ import annotations

from libp2p.abc import IHost, IMultiselectCommunicator
from libp2p.custom_types import StreamHandlerFn, TProtocol
from libp2p.protocol_muxer.exceptions import MultiselectError
from libp2p.protocol_muxer.multiselect import DEFAULT_NEGOTIATE_TIMEOUT, Multiselect


class SettledMultiselect(Multiselect):
    async def negotiate(
        self, communicator: IMultiselectCommunicator, negotiate_timeout: int = DEFAULT_NEGOTIATE_TIMEOUT
    ) -> tuple[TProtocol | None, StreamHandlerFn | None]:
        try:
            return await super().negotiate(communicator, negotiate_timeout)
        except KeyError as exc:
            raise MultiselectError(f"the handler of {exc.args[0]} was removed during negotiation") from None


def install_settled_multiselect(host: IHost) -> None:
    """`new_host` takes no multiselect class: swap the class of the stock one it built."""
    multiselect = host.get_mux()
    if type(multiselect) is not Multiselect:
        raise TypeError(f"expected py-libp2p's Multiselect, got {type(multiselect).__name__}: revisit this module")
    multiselect.__class__ = SettledMultiselect
