"""The Trio-facing BLE transport: `async with BleTransport.open(sink, policy, ...) as transport:`.

It starts (or borrows) the asyncio thread, runs the `BleCentral` there, and turns each fetched offer into a
`Delivery(transport="ble")` for the node's intake. It follows `sink.participating`: no scanning, so no offers, while
the sandbox gate has withdrawn the node. On exit every session and the central are cancelled and awaited, and an
owned asyncio thread is stopped and joined.

Sender: BLE gives no authenticated identity, so `Delivery.sender` is the peer's BLE address as bleak reports it
(a random address that may rotate), never the PeerID the peer claims over GATT. The offer's own signature is what
authenticates the offerer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
import trio
from bleak.backends.client import BaseBleakClient
from bleak.backends.scanner import BaseBleakScanner

from transports.base import Admitted, ClaimFn, Delivery, OfferSink, ReplyFn, Verdict
from transports.ble.bridge import AsyncioThread, TrioPortal
from transports.ble.central import BleCentral, CentralStats
from transports.ble.outcomes import OutcomeLog, SessionOutcome
from transports.ble.policy import ProximityPolicy
from transports.ble.protocol import ClaimSigner

TRANSPORT_NAME = "ble"
log = structlog.get_logger("edgecoder.ble")


@dataclass(frozen=True, slots=True)
class BleBackend:
    """Which bleak backend the central uses, and on which asyncio thread.

    The default (all None) is bleak's platform backend (BlueZ on Linux) on a thread the transport starts itself. A
    simulated radio supplies bumble-backed classes and its own thread, because every bumble device on one virtual
    link must live on the same asyncio loop.
    """

    scanner: type[BaseBleakScanner] | None = None
    client: type[BaseBleakClient] | None = None
    thread: AsyncioThread | None = None


class BleRadio(Protocol):
    """Where the node's central runs: BlueZ, a bumble host stack over HCI, or a simulated radio (see `radios`)."""

    async def central_backend(self) -> BleBackend: ...


class _Port:
    """The node as the asyncio-side central sees it. Methods run on the asyncio loop and cross over via the bridge."""

    def __init__(self, transport: BleTransport, portal: TrioPortal) -> None:
        self._transport = transport
        self._portal = portal

    async def deliver(self, raw: bytes, sender: str, claim: ClaimFn, reply: ReplyFn) -> Verdict:
        return await self._portal.call(self._transport._deliver, raw, sender, claim, reply)

    def report(self, outcome: SessionOutcome) -> None:
        self._portal.post(self._transport.record, outcome)


class BleTransport:
    def __init__(self, sink: OfferSink, policy: ProximityPolicy, thread: AsyncioThread) -> None:
        self.sink = sink
        self.policy = policy
        self.outcomes = OutcomeLog()
        self._thread = thread
        self._central: BleCentral | None = None
        self._scanning = False
        self._scanning_changed = trio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        sink: OfferSink,
        policy: ProximityPolicy | None = None,
        *,
        claimant: ClaimSigner,
        backend: BleBackend | None = None,
    ) -> AsyncIterator[BleTransport]:
        """Run the transport for the duration of the block. `claimant` is this node's identity: it signs each claim
        (over the link's nonce), and offerers then expect the result to be signed by the same key."""
        backend = backend or BleBackend()
        async with contextlib.AsyncExitStack() as stack:
            thread = backend.thread
            if thread is None:
                thread = await stack.enter_async_context(AsyncioThread.open())
            self = cls(sink, policy or ProximityPolicy(), thread)
            async with trio.open_nursery() as nursery:
                port = _Port(self, TrioPortal(nursery))

                async def make_central() -> BleCentral:
                    # Built on the asyncio loop: bleak objects belong to the loop that uses them.
                    return BleCentral(port, self.policy, claimant, backend.scanner, backend.client)

                central = self._central = await thread.run(make_central)
                nursery.start_soon(thread.run, central.run)
                nursery.start_soon(self._follow_participation)
                try:
                    yield self
                finally:
                    nursery.cancel_scope.cancel()

    def record(self, outcome: SessionOutcome) -> None:
        """Keep a session's outcome (tests wait on `outcomes`) and log it: every fault a peer caused is typed."""
        self.outcomes.append(outcome)
        verdict = outcome.verdict
        log.info(
            "ble session",
            address=outcome.address,
            advertised_peer_id=outcome.advertised_peer_id,
            verdict="admitted" if isinstance(verdict, Admitted) else getattr(verdict, "reason", None),
            fault=outcome.fault.detail if outcome.fault is not None else None,
            claimed=outcome.claimed,
            replied=outcome.replied,
            connect_attempts=outcome.connect_attempts,
            reconnects=outcome.reconnects,
        )

    @property
    def scanning(self) -> bool:
        return self._scanning

    async def wait_scanning(self, on: bool) -> None:
        while self._scanning != on:
            await self._scanning_changed.wait()

    async def stats(self) -> CentralStats:
        central = self._central
        assert central is not None

        async def copy() -> CentralStats:
            s = central.stats
            return CentralStats(**{name: getattr(s, name) for name in CentralStats.__slots__})

        return await self._thread.run(copy)

    async def _follow_participation(self) -> None:
        central = self._central
        assert central is not None
        applied: bool | None = None
        while True:
            wanted = bool(self.sink.participating)
            if wanted != applied:
                await self._thread.run(central.set_participating, wanted)
                applied = wanted
                self._scanning = wanted
                self._scanning_changed.set()
                self._scanning_changed = trio.Event()
            await trio.sleep(self.policy.participation_poll_s)

    async def _deliver(self, raw: bytes, sender: str, claim: ClaimFn, reply: ReplyFn) -> Verdict:
        """On Trio: hand the offer to the sink, with claim and reply that run on the asyncio side."""
        thread = self._thread

        async def claim_on_ble() -> bool:
            return await thread.run(claim)

        async def reply_on_ble(result: bytes) -> None:
            await thread.run(reply, result)

        return await self.sink.deliver(Delivery(raw, TRANSPORT_NAME, sender, reply_on_ble, claim_on_ble))


class BleRadioTransport:
    """BLE as one of the node's transports: `run(sink)` takes offers from nearby peers on `radio` until cancelled.

    `radio` None is bleak's platform backend (BlueZ) unchecked; `transports.ble.radios` opens and checks one.
    The radio itself is opened by whoever owns it, before the node starts, and closed after it stops.
    """

    name = TRANSPORT_NAME

    def __init__(self, radio: BleRadio | None, claimant: ClaimSigner, policy: ProximityPolicy | None = None) -> None:
        self.radio = radio
        self.claimant = claimant
        self.policy = policy
        self.active: BleTransport | None = None

    async def run(self, sink: OfferSink, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        backend = await self.radio.central_backend() if self.radio is not None else None
        async with BleTransport.open(sink, self.policy, claimant=self.claimant, backend=backend) as transport:
            self.active = transport
            try:
                task_status.started(transport)
                await trio.sleep_forever()
            finally:
                self.active = None
