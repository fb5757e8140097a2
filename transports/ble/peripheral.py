"""The offering side on a bumble `Device`: advertise one offer, serve its GATT service, run `OfferServer` on it.

The protocol itself (claims, grants, lapses, results, budgets) is the I/O-free `OfferServer`; this module is its
radio: it turns GATT writes into `OfferServer.write` calls and the actions that come back into notifications and
disconnections, in order per link. The device may sit on a simulated `LocalLink` (`transports.ble.sim`) or on any
HCI transport (`transports.ble.radios`): a USB dongle, a laptop's controller, or virtual controllers over TCP.

Why not `bless` (BlueZ / CoreBluetooth / WinRT) for an offering laptop: see docs/ble.md, "Offering from a laptop".

The peripheral verifies the result it receives (signature, signer = the claimant it granted, and the offer it answers)
through an injected `ResultVerifier`, by default the mesh codec's (`transports.ble.results`), and exposes the verified
result to its owner through `wait_result()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bumble import core, gatt
from bumble.device import Connection, Device

from transports.ble.offer_server import (
    Action,
    Disconnect,
    Notify,
    OfferServer,
    PeripheralState,
    ResultVerifier,
    ServerLimits,
)
from transports.ble.protocol import CAPABILITIES_UUID, EXCHANGE_UUID, IDENTITY_UUID, OFFER_UUID, SERVICE_UUID, PeerInfo
from transports.ble.timing import LinkPacer, LinkProfile

log = logging.getLogger(__name__)

ADVERTISED_NAME = "EdgeCoder"
TICK_S = 0.5  # how often grants are checked for lapse and idle links for dropping

__all__ = ["BumbleOfferPeripheral", "PeripheralFaults", "PeripheralState", "ResultVerifier", "ServerLimits"]


@dataclass(slots=True)
class PeripheralFaults:
    """Misbehaviour on demand, for tests: what a broken or hostile offering peer (or a bad radio) does."""

    # Rewrites the offer's frames before they are sent: drop, duplicate, reorder or corrupt chunks.
    tamper_offer: Callable[[list[bytes]], list[bytes]] | None = None
    # Send only this many offer frames, then go silent with the link still up.
    stall_offer_after: int | None = None
    # Drop the link as soon as a claim arrives, without answering.
    disconnect_on_claim: bool = False
    # Drop the link when the first frame of a result arrives, this many times (a radio losing the link mid-reply).
    drop_link_on_result: int = 0


class BumbleOfferPeripheral:
    def __init__(
        self,
        device: Device,
        *,
        peer: PeerInfo,
        offer: bytes,
        verify_result: ResultVerifier,
        limits: ServerLimits | None = None,
        faults: PeripheralFaults | None = None,
        link_model: LinkProfile | None = None,
    ) -> None:
        self.device = device
        self.peer = peer
        self.server = OfferServer(offer, verify_result, limits=limits)
        self.faults = faults or PeripheralFaults()
        self.link_model = link_model
        self._changed = asyncio.Event()
        self._connections: dict[int, Connection] = {}
        self._send_locks: dict[int, asyncio.Lock] = {}
        self._pacers: dict[int, LinkPacer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._offer_char = self._writable(OFFER_UUID)
        self._exchange_char = self._writable(EXCHANGE_UUID)
        # Read per link: each link gets its own claim nonce.
        capabilities_value: gatt.CharacteristicValue[bytes] = gatt.CharacteristicValue(
            read=lambda connection: self.server.capabilities(connection.handle)
        )
        capabilities: gatt.Characteristic[bytes] = gatt.Characteristic(
            CAPABILITIES_UUID, gatt.Characteristic.Properties.READ, gatt.Characteristic.READABLE, capabilities_value
        )
        identity = gatt.Characteristic(
            IDENTITY_UUID, gatt.Characteristic.Properties.READ, gatt.Characteristic.READABLE, peer.encode()
        )
        device.add_service(gatt.Service(SERVICE_UUID, [identity, capabilities, self._offer_char, self._exchange_char]))
        device.on(device.EVENT_CONNECTION, self._on_connection)

    def _writable(self, uuid: str) -> gatt.Characteristic[bytes]:
        return gatt.Characteristic(
            uuid,
            gatt.Characteristic.Properties.WRITE | gatt.Characteristic.Properties.NOTIFY,
            gatt.Characteristic.WRITEABLE,
            gatt.CharacteristicValue(write=lambda connection, value: self._on_write(connection, uuid, value)),
        )

    # -- what the owner sees ------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.device.random_address.to_string(with_type_qualifier=False)

    @property
    def result(self) -> Any:
        return self.server.result

    def state(self) -> PeripheralState:
        return self.server.state(self.address)

    async def wait_result(self) -> Any:
        """The verified result, once a granted claimant has delivered one."""
        while self.server.result is None:
            await self.wait_change()
        return self.server.result

    async def wait_change(self) -> None:
        """Until the next claim, refusal or result."""
        self._changed.clear()
        await self._changed.wait()

    # -- lifecycle ----------------------------------------------------------------------------------------------

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
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            self._perform(self.server.tick())

    async def stop(self, drain_s: float = 2.0) -> None:
        """Stop advertising, let what is being sent finish (bounded: the RESULT_ACK of a result just verified must
        reach its node), drop every link: nothing of this peripheral is left running."""
        if self._ticker is not None:
            self._ticker.cancel()
        with contextlib.suppress(Exception):
            await self.device.stop_advertising()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=drain_s)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for connection in list(self._connections.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.disconnect(), 5)

    # -- the radio side of OfferServer --------------------------------------------------------------------------

    def _on_connection(self, connection: Connection) -> None:
        handle = connection.handle
        self._connections[handle] = connection
        self._send_locks[handle] = asyncio.Lock()
        if self.link_model is not None:
            self._pacers[handle] = LinkPacer(self.link_model)

        def gone(*_: Any) -> None:
            self.server.disconnect(handle)
            self._connections.pop(handle, None)
            self._send_locks.pop(handle, None)
            self._pacers.pop(handle, None)

        connection.on(connection.EVENT_DISCONNECTION, gone)
        self._perform(self.server.connect(handle))

    def _on_write(self, connection: Connection, uuid: str, value: bytes) -> None:
        handle = connection.handle
        faults = self.faults
        # The first frame (seq 0) of the message after the grant is the result.
        granted = uuid == EXCHANGE_UUID and self.server.is_granted_link(handle)
        if granted and faults.drop_link_on_result > 0 and value[:2] == b"\x00\x00":
            faults.drop_link_on_result -= 1
            self._perform([Disconnect(handle, "fault: drop the link mid-reply")])
            return
        claims_before = len(self.server.claims)
        actions = self.server.write(handle, uuid, bytes(value), self._mtu(connection))
        if faults.disconnect_on_claim and len(self.server.claims) != claims_before:
            actions = [Disconnect(handle, "fault: drop the link on a claim")]
        self._perform(actions)
        self._changed.set()

    def _mtu(self, connection: Connection) -> int:
        # With a link model, frames are cut to the model's MTU too, so that the pacing plays the model's link.
        mtu: int = connection.att_mtu
        return min(mtu, self.link_model.att_mtu) if self.link_model is not None else mtu

    def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Disconnect):
                log.info("dropping link %s: %s", action.link, action.why)
                self._spawn(self._disconnect(action.link))
            elif isinstance(action, Notify):
                frames = list(action.frames)
                if action.characteristic == OFFER_UUID:
                    if self.faults.tamper_offer is not None:
                        frames = self.faults.tamper_offer(frames)
                    if self.faults.stall_offer_after is not None:
                        frames = frames[: self.faults.stall_offer_after]
                # Not from inside the write handler: the write response must reach the central first.
                self._spawn(self._notify(action.link, action.characteristic, frames))

    async def _notify(self, handle: int, uuid: str, frames: list[bytes]) -> None:
        lock = self._send_locks.get(handle)
        if lock is None:
            return
        characteristic = self._offer_char if uuid == OFFER_UUID else self._exchange_char
        async with lock:  # one message at a time on a link, in the order the server produced them
            for frame in frames:
                connection = self._connections.get(handle)
                if connection is None:
                    return
                pacer = self._pacers.get(handle)
                if pacer is not None:
                    await pacer.notification()
                await self.device.notify_subscriber(connection, characteristic, frame)

    async def _disconnect(self, handle: int) -> None:
        connection = self._connections.get(handle)
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.disconnect(), 5)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
