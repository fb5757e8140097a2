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
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from bleak import BleakClient, BleakScanner
from bleak.backends.client import BaseBleakClient
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData, BaseBleakScanner

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
    ClaimSigner,
    Kind,
    PeerInfo,
    Refusal,
    offer_digest,
)
from transports.ble.reasons import BleFault, BleReason
from transports.wire.reasons import Reason, Rejection

log = logging.getLogger(__name__)


class NodePort(Protocol):
    """How the asyncio side reaches the node. Every method is called on the asyncio loop."""

    async def deliver(self, raw: bytes, sender: str, claim: ClaimFn, reply: ReplyFn) -> Verdict: ...

    def report(self, outcome: SessionOutcome) -> None: ...


@dataclass(slots=True)
class CentralStats:
    too_far: int = 0
    busy: int = 0  # seen while all session slots were taken
    over_peer_budget: int = 0
    sessions_started: int = 0
    peak_sessions: int = 0
    scans_started: int = 0
    connect_retries: int = 0  # attempts beyond the first, over all sessions
    reply_reconnects: int = 0


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


async def connect_with_retries(
    connect: Callable[[], Awaitable[None]], policy: ProximityPolicy, rng: random.Random | None = None
) -> int:
    """Run `connect()` up to `policy.connect_attempts` times, each bounded by the connect timeout, with full-jitter
    exponential backoff between tries. Returns how many attempts it took; raises CONNECT_FAILED after the last.

    Not bleak-retry-connector: on Linux it asks BlueZ over D-Bus about connected devices (there is none on the
    bumble/HCI backends), and its back-off times are fixed per error rather than jittered.
    """
    rng = rng or random.Random()
    last: BaseException | None = None
    for attempt in range(max(1, policy.connect_attempts)):
        if attempt:
            ceiling = min(policy.connect_backoff_cap_s, policy.connect_backoff_s * 2**attempt)
            await asyncio.sleep(rng.uniform(0, ceiling))
        try:
            await asyncio.wait_for(connect(), policy.connect_timeout_s)
            return attempt + 1
        except Exception as exc:  # bleak, backend and timeout errors alike: this attempt failed
            last = exc
    raise BleFault(BleReason.CONNECT_FAILED, f"{policy.connect_attempts} attempts; last: {type(last).__name__}: {last}")


@dataclass(slots=True)
class _Link:
    """One connected link to the peer: the bleak client, the protocol link over it and this link's claim nonce."""

    client: BleakClient
    link: GattLink
    nonce: bytes
    exchange: Inbox | None = None
    attempts: int = 1  # connection attempts it took


class OfferSession:
    """One offer fetched from one peer: the claim and reply the node may call.

    Bound to the peer rather than to one link: if the link drops while the result is on its way, the session
    reconnects, claims again over the new link (the offering side re-grants the key it granted) and sends the result
    again.
    """

    def __init__(self, central: BleCentral, device: BLEDevice, current: _Link, offer: bytes) -> None:
        self.central = central
        self.device = device
        self.policy = central.policy
        self.current = current
        self.offer = offer
        self.granted = False
        self.result_delivered = False
        self.reconnects = 0
        self.replied = asyncio.Event()  # set when a reply was attempted, delivered or not
        # Set once the node is done with this link: its claim was refused or failed, or its reply was attempted.
        self.settled = asyncio.Event()
        self.fault: BleFault | None = None
        self._lock = asyncio.Lock()  # one exchange at a time on the EXCHANGE characteristic

    async def _exchange(self) -> Inbox:
        if self.current.exchange is None:
            self.current.exchange = await self.current.link.subscribe(EXCHANGE_UUID, MAX_SMALL_MESSAGE)
        return self.current.exchange

    async def _ask(self, message: bytes, expect: Kind, timeout: float) -> Answer:
        async with self._lock:
            exchange = await self._exchange()
            await self.current.link.send(EXCHANGE_UUID, message)
            answer = Answer.decode(await exchange.next_message(self.policy.idle_timeout_s, timeout))
        if answer.kind != expect:
            raise BleFault(BleReason.MALFORMED_FRAME, f"expected {expect.name}, got {answer.kind.name}")
        return answer

    async def _claim_on_link(self) -> Answer:
        claim = Claim.signed(self.central.claimant, self.current.nonce, offer_digest(self.offer))
        return await self._ask(claim.encode(), Kind.GRANT, self.policy.claim_timeout_s)

    async def claim(self) -> bool:
        if self.granted:
            return True
        try:
            answer = await self._claim_on_link()
        except BleFault as fault:
            self.fault = fault
            self.settled.set()
            return False
        if not answer.ok:
            self.fault = BleFault(BleReason.CLAIM_REFUSED, answer.detail)
            self.settled.set()
        self.granted = answer.ok
        return answer.ok

    async def refuse(self, rejection: Rejection) -> None:
        """Tell the offering side why the intake refused its offer. Best effort: the offerer treats it as a hint."""
        with contextlib.suppress(BleFault):
            await asyncio.wait_for(
                self.current.link.send(EXCHANGE_UUID, Refusal(str(rejection.reason), rejection.detail).encode()),
                self.policy.claim_timeout_s,
            )

    async def reply(self, result: bytes) -> None:
        """Carry the signed result back. Raises `BleFault` if it could not be delivered or was refused."""
        try:
            if not self.granted:
                raise BleFault(BleReason.CLAIM_REFUSED, "reply without a granted claim")
            while True:
                try:
                    answer = await self._ask(
                        bytes([Kind.RESULT]) + result, Kind.RESULT_ACK, self._result_timeout(len(result))
                    )
                    break
                except BleFault as fault:
                    if fault.code != BleReason.DISCONNECTED or self.reconnects >= self.policy.reply_reconnects:
                        raise
                await self._resume()
            if not answer.ok:
                raise BleFault(BleReason.RESULT_REFUSED, answer.detail)
            self.result_delivered = True
        except BleFault as fault:
            self.fault = fault
            raise
        finally:
            self.replied.set()
            self.settled.set()

    def _result_timeout(self, size: int) -> float:
        # Each frame of the result is one acknowledged write; on a slow link that is one connection interval each.
        policy = self.policy
        return policy.claim_timeout_s + policy.transfer_timeout_s * max(1.0, size / policy.max_offer_bytes)

    async def _resume(self) -> None:
        """A new link to the same peer, and the grant renewed on it."""
        self.reconnects += 1
        self.central.stats.reply_reconnects += 1
        log.info("BLE link to %s dropped mid-reply: reconnecting (%d)", self.device.address, self.reconnects)
        old, self.current = self.current, await self.central.open_link(self.device)
        await self.central.close_link(old)
        answer = await self._claim_on_link()
        if not answer.ok:
            raise BleFault(BleReason.CLAIM_REFUSED, f"after reconnecting: {answer.detail}")


class BleCentral:
    def __init__(
        self,
        port: NodePort,
        policy: ProximityPolicy,
        claimant: ClaimSigner,
        scanner_backend: type[BaseBleakScanner] | None = None,
        client_backend: type[BaseBleakClient] | None = None,
    ) -> None:
        self.port = port
        self.policy = policy
        self.claimant = claimant
        self._rng = random.Random()
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

    async def open_link(self, device: BLEDevice) -> _Link:
        """Connect (with retries), check the service and read this link's claim nonce."""
        policy = self.policy
        holder: list[GattLink] = []

        def on_disconnect(_: BleakClient) -> None:
            if holder:
                holder[0].on_disconnect()

        client = BleakClient(
            device, disconnected_callback=on_disconnect, timeout=policy.connect_timeout_s, backend=self._client_backend
        )

        async def connect() -> None:
            try:
                await client.connect()
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.disconnect(), policy.idle_timeout_s)
                raise

        attempts = await connect_with_retries(connect, policy, self._rng)
        self.stats.connect_retries += attempts - 1
        link = GattLink(client, policy.idle_timeout_s)
        holder.append(link)
        current = _Link(client, link, b"", attempts=attempts)
        try:
            if not client.is_connected:
                raise BleFault(BleReason.DISCONNECTED, "dropped during connect")
            if client.services.get_service(SERVICE_UUID) is None:
                raise BleFault(BleReason.NO_SERVICE, "peer does not offer the EdgeCoder service")
            current.nonce = Capabilities.decode(await link.read(CAPABILITIES_UUID)).nonce
        except BaseException:
            await self.close_link(current)
            raise
        return current

    async def close_link(self, current: _Link) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(current.client.disconnect(), self.policy.idle_timeout_s)

    async def _converse(self, device: BLEDevice) -> SessionOutcome:
        policy = self.policy
        session: OfferSession | None = None
        current = await self.open_link(device)
        try:
            peer = PeerInfo.decode(await current.link.read(IDENTITY_UUID))
            offers = await current.link.subscribe(OFFER_UUID, policy.max_offer_bytes)
            current.exchange = await current.link.subscribe(EXCHANGE_UUID, MAX_SMALL_MESSAGE)
            await current.link.write_raw(OFFER_UUID, SEND_OFFER)
            offer = await offers.next_message(policy.idle_timeout_s, policy.transfer_timeout_s)
            session = OfferSession(self, device, current, offer)
            verdict = await self.port.deliver(offer, device.address, session.claim, session.reply)
            if isinstance(verdict, Admitted):
                # An admitted offer waits in the intake's queue; a worker claims and runs it after `deliver`
                # returns. Hold the link until the node is done with it: claim refused, or reply attempted.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.settled.wait(), policy.result_timeout_s)
            elif verdict.reason != Reason.CLAIM_REFUSED:
                await session.refuse(verdict)
            fault: Rejection | None = session.fault.to_rejection() if session.fault else None
            if fault is None and isinstance(verdict, Admitted) and not session.settled.is_set():
                fault = BleFault(BleReason.TIMEOUT, "the node did not claim and reply in time").to_rejection()
            return SessionOutcome(
                device.address,
                peer.peer_id,
                verdict,
                fault,
                session.granted,
                session.result_delivered,
                current.attempts,
                session.reconnects,
            )
        finally:
            await self.close_link(session.current if session is not None else current)
