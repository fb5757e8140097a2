"""The offering side: a bumble `Device` that advertises one offer, grants one claim, and takes the result back.

On a real Linux laptop the same GATT service would be served by `bless` over BlueZ (an optional extra, not a
dependency here); on this machine it runs on a simulated radio (`transports.ble.sim`).

The peripheral verifies the result it receives (signature, signer = the claimant it granted, and the offer it answers)
through an injected `ResultVerifier`, by default the mesh codec's (`transports.ble.results`), and exposes the verified
result to its owner through `wait_result()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bumble import core, gatt
from bumble.device import Connection, Device

from transports.ble.framing import Reassembler, encode_frames, notify_frame_size
from transports.ble.protocol import (
    CAPABILITIES_UUID,
    DEFAULT_MAX_RESULT_BYTES,
    EXCHANGE_UUID,
    IDENTITY_UUID,
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
from transports.ble.reasons import BleFault

log = logging.getLogger(__name__)

# (raw result, claimant PeerID, offer bytes) -> the verified result; raises on anything wrong.
ResultVerifier = Callable[[bytes, str, bytes], Any]

ADVERTISED_NAME = "EdgeCoder"


@dataclass(slots=True)
class PeripheralFaults:
    """Misbehaviour on demand, for tests: what a broken or hostile offering peer does."""

    # Rewrites the offer's frames before they are sent: drop, duplicate, reorder or corrupt chunks.
    tamper_offer: Callable[[list[bytes]], list[bytes]] | None = None
    # Send only this many offer frames, then go silent with the link still up.
    stall_offer_after: int | None = None
    # Drop the link as soon as a claim arrives, without answering.
    disconnect_on_claim: bool = False


@dataclass(slots=True)
class _ConnectionState:
    exchange: Reassembler
    claimant: str | None = None  # set once this connection's claim was granted
    # Messages notified so far on this link, per characteristic: numbers the next one (see `framing`).
    offers_sent: int = 0
    answers_sent: int = 0


@dataclass(slots=True)
class ClaimRecord:
    claimant: str
    granted: bool
    detail: str = ""


@dataclass(slots=True)
class PeripheralState:
    """A copy of what the peripheral has seen, safe to hand to another thread."""

    address: str
    granted_to: str | None
    claims: list[ClaimRecord] = field(default_factory=list)
    results_refused: list[str] = field(default_factory=list)
    has_result: bool = False


class BumbleOfferPeripheral:
    def __init__(
        self,
        device: Device,
        *,
        peer: PeerInfo,
        offer: bytes,
        verify_result: ResultVerifier,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        faults: PeripheralFaults | None = None,
    ) -> None:
        self.device = device
        self.peer = peer
        self.offer = offer
        self.verify_result = verify_result
        self.max_result_bytes = max_result_bytes
        self.faults = faults or PeripheralFaults()
        self.granted_to: str | None = None
        self.claims: list[ClaimRecord] = []
        self.results_refused: list[str] = []
        self.result: Any = None
        self.result_raw: bytes | None = None
        self._result_ready = asyncio.Event()
        self._connections: dict[int, _ConnectionState] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._offer_char = self._characteristic(OFFER_UUID, self._on_offer_write)
        self._exchange_char = self._characteristic(EXCHANGE_UUID, self._on_exchange_write)
        device.add_service(
            gatt.Service(
                SERVICE_UUID,
                [
                    self._readable(IDENTITY_UUID, peer.encode()),
                    self._readable(CAPABILITIES_UUID, Capabilities(max_message=max_result_bytes).encode()),
                    self._offer_char,
                    self._exchange_char,
                ],
            )
        )
        device.on(device.EVENT_CONNECTION, self._on_connection)

    @staticmethod
    def _readable(uuid: str, value: bytes) -> gatt.Characteristic[bytes]:
        return gatt.Characteristic(uuid, gatt.Characteristic.Properties.READ, gatt.Characteristic.READABLE, value)

    @staticmethod
    def _characteristic(uuid: str, on_write: Callable[[Connection, bytes], None]) -> gatt.Characteristic[bytes]:
        return gatt.Characteristic(
            uuid,
            gatt.Characteristic.Properties.WRITE | gatt.Characteristic.Properties.NOTIFY,
            gatt.Characteristic.WRITEABLE,
            gatt.CharacteristicValue(write=on_write),
        )

    @property
    def address(self) -> str:
        return self.device.random_address.to_string(with_type_qualifier=False)

    def state(self) -> PeripheralState:
        return PeripheralState(
            self.address, self.granted_to, list(self.claims), list(self.results_refused), self.result is not None
        )

    async def start(self) -> None:
        advertising = bytes(
            core.AdvertisingData(
                [
                    (core.AdvertisingData.FLAGS, bytes([0x06])),  # LE general discoverable, no BR/EDR
                    (
                        core.AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
                        core.UUID(SERVICE_UUID).to_bytes(),
                    ),
                ]
            )
        )
        scan_response = bytes(
            core.AdvertisingData([(core.AdvertisingData.COMPLETE_LOCAL_NAME, ADVERTISED_NAME.encode())])
        )
        # auto_restart: a peripheral stops advertising when a central connects; keep offering to others.
        await self.device.start_advertising(
            advertising_data=advertising,
            scan_response_data=scan_response,
            auto_restart=True,
            advertising_interval_min=20,
            advertising_interval_max=20,
        )

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.device.stop_advertising()
        for connection in list(self.device.connections.values()):
            with contextlib.suppress(Exception):
                await connection.disconnect()

    async def wait_result(self) -> Any:
        """The verified result, once a granted claimant has delivered one."""
        await self._result_ready.wait()
        return self.result

    # -- connection bookkeeping -----------------------------------------------------------------------------

    def _on_connection(self, connection: Connection) -> None:
        # Room for a result plus its kind byte; a claim is far smaller.
        self._connections[connection.handle] = _ConnectionState(Reassembler(self.max_result_bytes + 1))
        connection.on(connection.EVENT_DISCONNECTION, lambda *_: self._connections.pop(connection.handle, None))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the offer --------------------------------------------------------------------------------------------

    def _on_offer_write(self, connection: Connection, value: bytes) -> None:
        if value == SEND_OFFER:
            # Not from inside the write handler: the write response must reach the central first.
            self._spawn(self._send_offer(connection))

    async def _send_offer(self, connection: Connection) -> None:
        state = self._connections.get(connection.handle)
        if state is None:
            return
        state.offers_sent += 1
        frames = encode_frames(self.offer, notify_frame_size(connection.att_mtu), state.offers_sent - 1)
        if self.faults.tamper_offer is not None:
            frames = self.faults.tamper_offer(frames)
        if self.faults.stall_offer_after is not None:
            frames = frames[: self.faults.stall_offer_after]
        for frame in frames:
            if connection.handle not in self._connections:
                return
            await self.device.notify_subscriber(connection, self._offer_char, frame)

    # -- claims and results -----------------------------------------------------------------------------------

    def _on_exchange_write(self, connection: Connection, value: bytes) -> None:
        state = self._connections.get(connection.handle)
        if state is None:
            return
        try:
            message = state.exchange.feed(value)
        except BleFault as fault:
            kind = Kind.GRANT if state.claimant is None else Kind.RESULT_ACK
            self._answer(connection, state, Answer(kind, False, f"ble/{fault.code}"))
            return
        if message is None:
            return
        if message[:1] == bytes([Kind.CLAIM]):
            self._on_claim(connection, state, message[1:])
        elif message[:1] == bytes([Kind.RESULT]):
            self._on_result(connection, state, message[1:])
        else:
            self._answer(connection, state, Answer(Kind.RESULT_ACK, False, "unknown message kind"))

    def _answer(self, connection: Connection, state: _ConnectionState, answer: Answer) -> None:
        number = state.answers_sent
        state.answers_sent += 1

        async def send() -> None:
            for frame in encode_frames(answer.encode(), notify_frame_size(connection.att_mtu), number):
                await self.device.notify_subscriber(connection, self._exchange_char, frame)

        self._spawn(send())

    def _on_claim(self, connection: Connection, state: _ConnectionState, body: bytes) -> None:
        if self.faults.disconnect_on_claim:
            self._spawn(connection.disconnect())
            return
        try:
            claim = Claim.decode_body(body)
        except BleFault as fault:
            self._answer(connection, state, Answer(Kind.GRANT, False, f"ble/{fault.code}"))
            return
        if claim.offer_digest != offer_digest(self.offer):
            granted, detail = False, "unknown offer"
        elif self.granted_to in (None, claim.claimant):
            # Exactly one claimant per offer; the same claimant asking again (a reconnect) is granted again.
            self.granted_to = claim.claimant
            granted, detail = True, ""
        else:
            granted, detail = False, "already claimed"
        if granted:
            state.claimant = claim.claimant
        self.claims.append(ClaimRecord(claim.claimant, granted, detail))
        self._answer(connection, state, Answer(Kind.GRANT, granted, detail))

    def _on_result(self, connection: Connection, state: _ConnectionState, raw: bytes) -> None:
        if state.claimant is None:
            self._refuse_result(connection, state, "no granted claim on this link")
            return
        try:
            verified = self.verify_result(raw, state.claimant, self.offer)
        except Exception as exc:  # the verifier's own typed rejection, or any decoding failure: all refusals
            self._refuse_result(connection, state, f"{type(exc).__name__}: {exc}")
            return
        if self.result is None:
            self.result, self.result_raw = verified, raw
            self._result_ready.set()
        self._answer(connection, state, Answer(Kind.RESULT_ACK, True))

    def _refuse_result(self, connection: Connection, state: _ConnectionState, detail: str) -> None:
        self.results_refused.append(detail)
        self._answer(connection, state, Answer(Kind.RESULT_ACK, False, detail))
