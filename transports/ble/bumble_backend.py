"""A bleak backend over a bumble `Device`: the node's BLE adapter on a simulated radio.

bumble runs a real HCI / link-layer / ATT / GATT stack against virtual controllers on an in-process `LocalLink`, so
the node's central code runs unchanged, through bleak's public API, against MTU exchange, long reads (Read Blob),
CCCD subscriptions and notifications as they really happen.

bleak takes a backend as a *class* (`BleakScanner(..., backend=cls)`), so `bind_central` makes a scanner and a client
class bound to one `BumbleCentral`. bleak documents its backend API as unstable: bleak is pinned (<3.2) and
`tests/test_ble_backend_conformance.py` checks this backend against the interface bleak actually calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from bleak.args import SizedBuffer
from bleak.backends.characteristic import BleakGATTCharacteristic
from bleak.backends.client import BaseBleakClient, NotifyCallback
from bleak.backends.descriptor import BleakGATTDescriptor
from bleak.backends.device import BLEDevice
from bleak.backends.scanner import AdvertisementData, AdvertisementDataCallback, BaseBleakScanner
from bleak.backends.service import BleakGATTService, BleakGATTServiceCollection
from bleak.exc import BleakError, BleakGATTProtocolError
from bleak.uuids import normalize_uuid_str
from bumble import att, core, hci
from bumble.device import Advertisement, Connection, Device, Peer
from bumble.gatt_client import CharacteristicProxy

from transports.ble.timing import DISCOVERY_ROUND_TRIPS, LinkPacer, LinkProfile, read_round_trips

log = logging.getLogger(__name__)

# What an OS stack asks for on connect (BlueZ and CoreBluetooth both exchange the MTU by themselves).
REQUESTED_MTU = 247

_UUID_LIST_TYPES = (
    core.AdvertisingData.COMPLETE_LIST_OF_16_BIT_SERVICE_CLASS_UUIDS,
    core.AdvertisingData.INCOMPLETE_LIST_OF_16_BIT_SERVICE_CLASS_UUIDS,
    core.AdvertisingData.COMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
    core.AdvertisingData.INCOMPLETE_LIST_OF_128_BIT_SERVICE_CLASS_UUIDS,
)
_PROPERTY_NAMES = {
    0x01: "broadcast",
    0x02: "read",
    0x04: "write-without-response",
    0x08: "write",
    0x10: "notify",
    0x20: "indicate",
    0x40: "authenticated-signed-writes",
    0x80: "extended-properties",
}

AdvertisementListener = Callable[[Advertisement], None]


def bleak_uuid(uuid: core.UUID) -> str:
    return normalize_uuid_str(uuid.to_hex_str("-"))


def address_text(address: hci.Address) -> str:
    return address.to_string(with_type_qualifier=False)


class BumbleCentral:
    """One powered-on bumble `Device` shared by every scanner and client bound to it.

    `rssi_of(address, reported)` lets a simulated radio model distance: bumble's virtual controllers report -50 dBm
    for every advertisement. `link_model` paces the clients' ATT requests and writes (`timing.LinkPacer`).
    """

    def __init__(
        self,
        device: Device,
        rssi_of: Callable[[str, int], int] | None = None,
        *,
        link_model: LinkProfile | None = None,
    ) -> None:
        self.device = device
        self.rssi_of = rssi_of or (lambda _address, reported: reported)
        # Virtual controllers deliver at once; a link model makes every client wait as that radio would.
        self.link_model = link_model
        # A controller has one pending LE connection at a time (bumble refuses a second), as real ones do.
        self.connect_lock = asyncio.Lock()
        self._listeners: list[AdvertisementListener] = []
        device.on(device.EVENT_ADVERTISEMENT, self._on_advertisement)

    def _on_advertisement(self, advertisement: Advertisement) -> None:
        for listener in list(self._listeners):
            listener(advertisement)

    async def add_listener(self, listener: AdvertisementListener, active: bool) -> None:
        self._listeners.append(listener)
        if not self.device.is_scanning:
            await self.device.start_scanning(active=active, filter_duplicates=False)

    async def remove_listener(self, listener: AdvertisementListener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)
        if not self._listeners and self.device.is_scanning:
            await self.device.stop_scanning()


def bind_central(central: BumbleCentral) -> tuple[type[BumbleScanner], type[BumbleClient]]:
    """Scanner and client classes for bleak's `backend=` argument, both bound to `central`."""
    scanner = type("BoundBumbleScanner", (BumbleScanner,), {"central": central})
    client = type("BoundBumbleClient", (BumbleClient,), {"central": central})
    return scanner, client


class BumbleScanner(BaseBleakScanner):
    central: ClassVar[BumbleCentral]

    def __init__(
        self,
        detection_callback: AdvertisementDataCallback | None,
        service_uuids: list[str] | None,
        scanning_mode: str = "active",
        **kwargs: Any,
    ) -> None:
        super().__init__(detection_callback, service_uuids)
        self._active = scanning_mode != "passive"

    async def start(self) -> None:
        self.seen_devices = {}
        await self.central.add_listener(self._on_advertisement, self._active)

    async def stop(self) -> None:
        await self.central.remove_listener(self._on_advertisement)

    def _on_advertisement(self, advertisement: Advertisement) -> None:
        data = advertisement.data
        uuids: list[str] = []
        for kind in _UUID_LIST_TYPES:
            listed = data.get(kind)
            if isinstance(listed, list):
                uuids.extend(bleak_uuid(u) for u in listed)
        if not self.is_allowed_uuid(uuids):
            return
        name = data.get(core.AdvertisingData.COMPLETE_LOCAL_NAME) or data.get(core.AdvertisingData.SHORTENED_LOCAL_NAME)
        manufacturer: dict[int, bytes] = {}
        for company, payload in data.get_all(core.AdvertisingData.MANUFACTURER_SPECIFIC_DATA):
            manufacturer[company] = bytes(payload)
        tx_power = data.get(core.AdvertisingData.TX_POWER_LEVEL)
        address = address_text(advertisement.address)
        adv = AdvertisementData(
            local_name=name if isinstance(name, str) else None,
            manufacturer_data=manufacturer,
            service_data={},
            service_uuids=uuids,
            tx_power=tx_power if isinstance(tx_power, int) else None,
            rssi=self.central.rssi_of(address, advertisement.rssi),
            platform_data=(advertisement,),
        )
        device = self.create_or_update_device(address, address, adv.local_name, advertisement.address, adv)
        self.call_detection_callbacks(device, adv)


class BumbleClient(BaseBleakClient):
    central: ClassVar[BumbleCentral]

    def __init__(
        self,
        address_or_ble_device: BLEDevice | str,
        *,
        disconnected_callback: Callable[[], None] | None = None,
        timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(address_or_ble_device, disconnected_callback=disconnected_callback, timeout=timeout)
        details = address_or_ble_device.details if isinstance(address_or_ble_device, BLEDevice) else None
        self._peer_address = (
            details
            if isinstance(details, hci.Address)
            else hci.Address(self.address, hci.Address.RANDOM_DEVICE_ADDRESS)
        )
        self._connection: Connection | None = None
        self._peer: Peer | None = None
        self._closing = False
        model = self.central.link_model
        self._pacer = LinkPacer(model) if model is not None else None

    async def _pace(self, round_trips: int = 1) -> None:
        if self._pacer is not None:
            await self._pacer.round_trip(round_trips)

    @property
    def name(self) -> str:
        return self.address

    @property
    def mtu_size(self) -> int:
        mtu: int = self._connection.att_mtu if self._connection is not None else att.ATT_DEFAULT_MTU
        model = self.central.link_model
        # With a link model the client frames at the model's MTU too, so that the pacing plays the model's link.
        return min(mtu, model.att_mtu) if model is not None else mtu

    @property
    def is_connected(self) -> bool:
        return self._connection is not None

    async def connect(self, pair: bool, **kwargs: Any) -> None:
        if pair:
            log.info("simulated radio: pairing is not supported, connecting without it")
        device = self.central.device
        async with self.central.connect_lock:
            try:
                connection = await device.connect(self._peer_address, timeout=self._timeout)
            except (TimeoutError, core.TimeoutError) as exc:
                raise BleakError(f"connect to {self.address} timed out") from exc
            except hci.HCI_Error as exc:
                raise BleakError(f"connect to {self.address} failed: {exc}") from exc
        self._connection = connection
        self._closing = False
        connection.on(connection.EVENT_DISCONNECTION, self._on_disconnection)
        self._peer = Peer(connection)
        try:
            await self._gatt(self._peer.request_mtu(REQUESTED_MTU))
            self.services = await self._discover(self._peer)
            await self._pace(2 + DISCOVERY_ROUND_TRIPS)  # connection, MTU exchange, discovery
        except BaseException:
            await self.disconnect()
            raise

    def _on_disconnection(self, *_: Any) -> None:
        unsolicited = not self._closing
        self._connection = None
        self._peer = None
        if unsolicited and self._disconnected_callback is not None:
            self._disconnected_callback()

    async def _discover(self, peer: Peer) -> BleakGATTServiceCollection:
        collection = BleakGATTServiceCollection()
        await self._gatt(peer.discover_services())
        for service in peer.services:
            await self._gatt(service.discover_characteristics())
            bleak_service = BleakGATTService(service, service.handle, bleak_uuid(service.uuid))
            collection.add_service(bleak_service)
            for char in service.characteristics:
                await self._gatt(char.discover_descriptors())
                props = [name for bit, name in _PROPERTY_NAMES.items() if char.properties & bit]
                bleak_char = BleakGATTCharacteristic(
                    char,
                    char.handle,
                    bleak_uuid(char.uuid),
                    props,  # type: ignore[arg-type]  # bleak types these as a Literal union
                    lambda: self.mtu_size - 3,
                    bleak_service,
                )
                collection.add_characteristic(bleak_char)
                for desc in char.descriptors:
                    collection.add_descriptor(BleakGATTDescriptor(desc, desc.handle, bleak_uuid(desc.type), bleak_char))
        return collection

    async def _gatt(self, awaitable: Any) -> Any:
        """Await a bumble GATT call, giving its failures bleak's types.

        bumble cancels a pending ATT request when the link drops, which surfaces as CancelledError in the caller;
        that is a disconnection, not a cancellation of our task, so it is re-raised as a BleakError.
        """
        try:
            return await awaitable
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise BleakError(f"disconnected from {self.address}") from None
        except att.ATT_Error as exc:
            raise BleakGATTProtocolError(exc.error_code) from exc
        except core.TimeoutError as exc:
            raise BleakError(f"GATT request to {self.address} timed out") from exc

    def _require_peer(self) -> Peer:
        if self._peer is None:
            raise BleakError("Not connected")
        return self._peer

    async def disconnect(self) -> None:
        connection = self._connection
        if connection is None:
            return
        self._closing = True
        with contextlib.suppress(hci.HCI_Error, core.BaseBumbleError, asyncio.TimeoutError):
            await connection.disconnect()
        self._connection = None
        self._peer = None

    async def pair(self, *args: Any, **kwargs: Any) -> None:
        raise BleakError("the simulated radio does not pair")

    async def unpair(self) -> None:
        raise BleakError("the simulated radio does not pair")

    async def read_gatt_char(
        self, characteristic: BleakGATTCharacteristic, *, use_cached: bool = False, **kwargs: Any
    ) -> bytearray:
        self._require_peer()
        proxy: CharacteristicProxy[bytes] = characteristic.obj
        value = bytearray(await self._gatt(proxy.read_value()))
        await self._pace(read_round_trips(len(value), self.mtu_size))
        return value

    async def read_gatt_descriptor(
        self, descriptor: BleakGATTDescriptor, *, use_cached: bool = False, **kwargs: Any
    ) -> bytearray:
        peer = self._require_peer()
        return bytearray(await self._gatt(peer.read_value(descriptor.handle)))

    async def write_gatt_char(self, characteristic: BleakGATTCharacteristic, data: SizedBuffer, response: bool) -> None:
        self._require_peer()
        proxy: CharacteristicProxy[bytes] = characteristic.obj
        await self._gatt(proxy.write_value(bytes(data), with_response=response))
        await self._pace()

    async def write_gatt_descriptor(self, descriptor: BleakGATTDescriptor, data: SizedBuffer) -> None:
        peer = self._require_peer()
        await self._gatt(peer.write_value(descriptor.handle, bytes(data), with_response=True))

    async def start_notify(
        self, characteristic: BleakGATTCharacteristic, callback: NotifyCallback, **kwargs: Any
    ) -> None:
        peer = self._require_peer()
        proxy: CharacteristicProxy[bytes] = characteristic.obj
        await self._gatt(peer.subscribe(proxy, lambda value: callback(bytearray(value))))
        await self._pace()

    async def stop_notify(self, characteristic: BleakGATTCharacteristic) -> None:
        peer = self._require_peer()
        proxy: CharacteristicProxy[bytes] = characteristic.obj
        await self._gatt(peer.unsubscribe(proxy))
