"""The node's side of BLE: scan for offering peers, fetch their offers, claim, and carry results back.

Runs entirely on the asyncio side, through bleak's public API only (`BleakScanner`, `BleakClient`, with an optional
`backend=` class). It reaches the node only through a `NodePort` (implemented by the Trio-facing `BleTransport`
through the bridge), so it never touches Trio objects itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Protocol

from bleak import BleakClient, BleakScanner
from bleak.backends.client import BaseBleakClient
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData, BaseBleakScanner

from mesh.reasons import Rejection
from transports.base import Admitted, ClaimFn, ReplyFn, Verdict
from transports.ble.link import GattLink, Inbox
from transports.ble.outcomes import SessionOutcome
from transports.ble.policy import ProximityPolicy
from transports.ble.protocol import (
    CAPABILITIES_UUID,
    EXCHANGE_UUID,
    IDENTITY_UUID,
    MAX_SMALL_MESSAGE,
    OFFER_UUID,
    SEND_OFFER,
    SERVICE_UUID,
    Answer,
    Capabilities,
    Claim,
    Kind,
    PeerInfo,
    offer_digest,
)
from transports.ble.reasons import BleFault, BleReason

log = logging.getLogger(__name__)


class NodePort(Protocol):
    """How the asyncio side reaches the node. Every method is called on the asyncio loop."""

    async def deliver(
        self,
        raw: bytes,
        sender: str,
        claim: ClaimFn,
        reply: ReplyFn,
    ) -> Verdict: ...

    def report(self, outcome: SessionOutcome) -> None: ...


@dataclass(slots=True)
class CentralStats:
    too_far: int = 0
    busy: int = 0  # seen while all session slots were taken
    over_peer_budget: int = 0
    sessions_started: int = 0
    peak_sessions: int = 0
    scans_started: int = 0


@dataclass(slots=True)
class _PeerBudget:
    """At most `limit` new peers per sliding `window` seconds."""

    limit: int
    window: float
    starts: collections.deque[float] = field(default_factory=collections.deque)

    def take(self, now: float) -> bool:
        while self.starts and self.starts[0] <= now - self.window:
            self.starts.popleft()
        if len(self.starts) >= self.limit:
            return False
        self.starts.append(now)
        return True


class OfferSession:
    """One offer fetched from one peer: the claim and reply the node may call, bound to this link."""

    def __init__(self, link: GattLink, exchange: Inbox, offer: bytes, claimant: str, policy: ProximityPolicy) -> None:
        self.link = link
        self.exchange = exchange
        self.offer = offer
        self.claimant = claimant
        self.policy = policy
        self.granted = False
        self.result_delivered = False
        self.replied = asyncio.Event()  # set when a reply was attempted, delivered or not
        # Set once the node is done with this link: its claim was refused or failed, or its reply was attempted.
        self.settled = asyncio.Event()
        self.fault: BleFault | None = None
        self._lock = asyncio.Lock()  # one exchange at a time on the EXCHANGE characteristic

    async def _ask(self, message: bytes, expect: Kind, timeout: float) -> Answer:
        async with self._lock:
            await self.link.send(EXCHANGE_UUID, message)
            answer = Answer.decode(await self.exchange.next_message(self.policy.idle_timeout_s, timeout))
        if answer.kind != expect:
            raise BleFault(BleReason.MALFORMED_FRAME, f"expected {expect.name}, got {answer.kind.name}")
        return answer

    async def claim(self) -> bool:
        if self.granted:
            return True
        try:
            answer = await self._ask(
                Claim(self.claimant, offer_digest(self.offer)).encode(), Kind.GRANT, self.policy.claim_timeout_s
            )
        except BleFault as fault:
            self.fault = fault
            self.settled.set()
            return False
        if not answer.ok:
            self.fault = BleFault(BleReason.CLAIM_REFUSED, answer.detail)
            self.settled.set()
        self.granted = answer.ok
        return answer.ok

    async def reply(self, result: bytes) -> None:
        """Carry the signed result back. Raises `BleFault` if it could not be delivered or was refused."""
        try:
            if not self.granted:
                raise BleFault(BleReason.CLAIM_REFUSED, "reply without a granted claim")
            answer = await self._ask(bytes([Kind.RESULT]) + result, Kind.RESULT_ACK, self.policy.claim_timeout_s)
            if not answer.ok:
                raise BleFault(BleReason.RESULT_REFUSED, answer.detail)
            self.result_delivered = True
        except BleFault as fault:
            self.fault = fault
            raise
        finally:
            self.replied.set()
            self.settled.set()


class BleCentral:
    def __init__(
        self,
        port: NodePort,
        policy: ProximityPolicy,
        claimant_peer_id: str,
        scanner_backend: type[BaseBleakScanner] | None = None,
        client_backend: type[BaseBleakClient] | None = None,
    ) -> None:
        self.port = port
        self.policy = policy
        self.claimant = claimant_peer_id
        self._client_backend = client_backend
        self._scanner = BleakScanner(self._on_advertisement, [SERVICE_UUID], backend=scanner_backend)
        self.scanning = False
        self.participating = False
        self.stats = CentralStats()
        self._active: set[str] = set()
        self._cooldown: dict[str, float] = {}
        self._budget = _PeerBudget(policy.max_peers, policy.peer_window_s)
        self._sessions: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        """Own the session tasks until cancelled; then stop scanning and end every session."""
        try:
            async with asyncio.TaskGroup() as sessions:
                self._sessions = sessions
                try:
                    await asyncio.Event().wait()  # until cancelled: sessions are started by advertisements
                finally:
                    # Before the group starts shutting down: an advertisement arriving now must not hand it a task
                    # it would refuse (leaving the session coroutine never awaited).
                    self._sessions = None
        finally:
            with contextlib.suppress(Exception):
                await self._set_scanning(False)

    async def set_participating(self, participating: bool) -> None:
        """Scan only while the node takes offers. Sessions already under way finish (the intake has the last say)."""
        self.participating = participating
        await self._set_scanning(participating)

    async def _set_scanning(self, on: bool) -> None:
        if on and not self.scanning:
            await self._scanner.start()
            self.scanning = True
            self.stats.scans_started += 1
        elif not on and self.scanning:
            self.scanning = False
            await self._scanner.stop()

    def _on_advertisement(self, device: BLEDevice, adv: AdvertisementData) -> None:
        sessions = self._sessions
        if not self.participating or sessions is None:
            return
        address = device.address
        if adv.rssi < self.policy.min_rssi:
            self.stats.too_far += 1
            return
        now = asyncio.get_running_loop().time()
        if address in self._active or self._cooldown.get(address, 0.0) > now:
            return
        if len(self._active) >= self.policy.max_sessions:
            self.stats.busy += 1
            return
        if not self._budget.take(now):
            self.stats.over_peer_budget += 1
            return
        self._active.add(address)
        self.stats.sessions_started += 1
        self.stats.peak_sessions = max(self.stats.peak_sessions, len(self._active))
        sessions.create_task(self._session(device))

    async def _session(self, device: BLEDevice) -> None:
        outcome = SessionOutcome(device.address)
        try:
            outcome = await self._converse(device)
        except BleFault as fault:
            outcome = SessionOutcome(device.address, fault=fault.to_rejection())
        except Exception as exc:  # a bug or an unexpected backend error must not end the other sessions
            log.exception("BLE session with %s failed", device.address)
            outcome = SessionOutcome(device.address, fault=BleFault(BleReason.DISCONNECTED, repr(exc)).to_rejection())
        finally:
            self._active.discard(device.address)
            now = asyncio.get_running_loop().time()
            self._cooldown = {a: t for a, t in self._cooldown.items() if t > now}
            self._cooldown[device.address] = now + self.policy.retry_after_s
            self.port.report(outcome)

    async def _converse(self, device: BLEDevice) -> SessionOutcome:
        policy = self.policy
        link: GattLink | None = None

        def on_disconnect(_: BleakClient) -> None:
            if link is not None:
                link.on_disconnect()

        client = BleakClient(
            device,
            disconnected_callback=on_disconnect,
            timeout=policy.connect_timeout_s,
            backend=self._client_backend,
        )
        try:
            await asyncio.wait_for(client.connect(), policy.connect_timeout_s)
        except Exception as exc:
            raise BleFault(BleReason.CONNECT_FAILED, f"{type(exc).__name__}: {exc}") from None
        try:
            link = GattLink(client, policy.idle_timeout_s)
            if not client.is_connected:
                raise BleFault(BleReason.DISCONNECTED, "dropped during connect")
            if client.services.get_service(SERVICE_UUID) is None:
                raise BleFault(BleReason.NO_SERVICE, "peer does not offer the EdgeCoder service")
            peer = PeerInfo.decode(await link.read(IDENTITY_UUID))
            Capabilities.decode(await link.read(CAPABILITIES_UUID))
            offers = await link.subscribe(OFFER_UUID, policy.max_offer_bytes)
            exchange = await link.subscribe(EXCHANGE_UUID, MAX_SMALL_MESSAGE)
            await link.write_raw(OFFER_UUID, SEND_OFFER)
            offer = await offers.next_message(policy.idle_timeout_s, policy.transfer_timeout_s)
            session = OfferSession(link, exchange, offer, self.claimant, policy)
            verdict = await self.port.deliver(offer, device.address, session.claim, session.reply)
            if isinstance(verdict, Admitted):
                # An admitted offer waits in the intake's queue; a worker claims and runs it after `deliver`
                # returns. Hold the link until the node is done with it: claim refused, or reply attempted.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.settled.wait(), policy.result_timeout_s)
            fault: Rejection | None = session.fault.to_rejection() if session.fault else None
            if fault is None and isinstance(verdict, Admitted) and not session.settled.is_set():
                fault = BleFault(BleReason.TIMEOUT, "the node did not claim and reply in time").to_rejection()
            return SessionOutcome(
                device.address, peer.peer_id, verdict, fault, session.granted, session.result_delivered
            )
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), policy.idle_timeout_s)
