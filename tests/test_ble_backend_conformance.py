"""Conformance of the bumble-backed bleak backend, driven only through bleak's public API.

bleak documents its backend API as unstable. These tests pin what our backend must provide (every abstract method,
the constructor arguments bleak passes) and check that the radio behaves like a real one through `BleakScanner` and
`BleakClient`: discovery with a service filter, MTU exchange, long reads, notifications, writes, disconnect callback.
"""

from __future__ import annotations

import asyncio
import inspect

from bleak import BleakClient, BleakScanner
from bleak.backends.client import BaseBleakClient
from bleak.backends.scanner import BaseBleakScanner
from bleak.exc import BleakError

from tests.test_ble_support import NODE, OFFERER, signed_offer
from transports.ble.bumble_backend import BumbleClient, BumbleScanner, bind_central
from transports.ble.framing import DEFAULT_ATT_MTU, Reassembler
from transports.ble.protocol import (
    CAPABILITIES_UUID,
    EXCHANGE_UUID,
    IDENTITY_UUID,
    OFFER_UUID,
    SEND_OFFER,
    SERVICE_UUID,
    Capabilities,
    PeerInfo,
)
from transports.ble.sim import SimulatedRadio


def test_backend_implements_every_abstract_method() -> None:
    assert not inspect.isabstract(BumbleScanner)
    assert not inspect.isabstract(BumbleClient)
    for base, ours in ((BaseBleakScanner, BumbleScanner), (BaseBleakClient, BumbleClient)):
        for name in getattr(base, "__abstractmethods__", ()):
            assert getattr(ours, name) is not getattr(base, name), name


def test_scanner_and_client_accept_what_bleak_passes() -> None:
    # bleak 3.1 constructs the backend with these arguments (bleak/__init__.py); a change here breaks us.
    scanner_params = inspect.signature(BumbleScanner.__init__).parameters
    assert list(scanner_params)[1:4] == ["detection_callback", "service_uuids", "scanning_mode"]
    assert any(p.kind is p.VAR_KEYWORD for p in scanner_params.values())  # bluez=, cb=
    client_params = inspect.signature(BumbleClient.__init__).parameters
    assert {"disconnected_callback", "timeout"} <= set(client_params)
    assert any(p.kind is p.VAR_KEYWORD for p in client_params.values())  # services=, bluez=, winrt=
    connect_params = inspect.signature(BumbleClient.connect).parameters
    assert "pair" in connect_params


async def _through_bleak() -> None:
    radio = SimulatedRadio()
    offer = signed_offer(pad=2000)
    peripheral = await radio.add_offering_peer(OFFERER, offer, verify_result=lambda *_: None)
    await radio.add_offering_peer(OFFERER, offer, rssi=-90, verify_result=lambda *_: None)
    scanner_cls, client_cls = bind_central(await radio.new_central())
    try:
        found = await BleakScanner.find_device_by_filter(
            lambda d, adv: adv.rssi > -60, timeout=5, service_uuids=[SERVICE_UUID], backend=scanner_cls
        )
        assert found is not None and found.address == peripheral.address

        dropped = asyncio.Event()
        client = BleakClient(found, disconnected_callback=lambda _: dropped.set(), backend=client_cls, timeout=5)
        await client.connect()
        assert client.is_connected and client.mtu_size > DEFAULT_ATT_MTU  # the MTU exchange happened
        service = client.services.get_service(SERVICE_UUID)
        assert service is not None
        expected = {IDENTITY_UUID, CAPABILITIES_UUID, OFFER_UUID, EXCHANGE_UUID}
        assert {c.uuid for c in service.characteristics} == expected
        assert "notify" in service.get_characteristic(OFFER_UUID).properties  # type: ignore[union-attr]

        assert PeerInfo.decode(bytes(await client.read_gatt_char(IDENTITY_UUID))).peer_id == OFFERER.peer_id
        Capabilities.decode(bytes(await client.read_gatt_char(CAPABILITIES_UUID)))

        received: asyncio.Queue[bytes] = asyncio.Queue()
        await client.start_notify(OFFER_UUID, lambda _c, data: received.put_nowait(bytes(data)))
        await client.write_gatt_char(OFFER_UUID, SEND_OFFER, response=True)
        reassembler = Reassembler(1 << 20)
        message = None
        while message is None:
            frame = await asyncio.wait_for(received.get(), 5)
            assert len(frame) <= client.mtu_size - 3
            message = reassembler.feed(frame)
        assert message == offer
        await client.stop_notify(OFFER_UUID)

        # The peer hanging up is reported through the disconnected callback, and later calls fail cleanly.
        await peripheral.stop()
        await asyncio.wait_for(dropped.wait(), 5)
        assert not client.is_connected
        try:
            await client.read_gatt_char(IDENTITY_UUID)
        except BleakError:
            pass
        else:
            raise AssertionError("read on a dropped link must raise BleakError")
    finally:
        await radio.close()


def test_radio_through_bleak_public_api() -> None:
    asyncio.run(asyncio.wait_for(_through_bleak(), 20))


def test_claimant_identity_is_a_peer_id() -> None:
    assert NODE.peer_id.startswith("12D3KooW")
