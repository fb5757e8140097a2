"""A simulated radio: bumble virtual controllers on one in-process `LocalLink`.

For the node, the CLI (`edgecoder node --ble --ble-sim`), the demo and simulations. Two layers:

* `SimulatedRadio` lives on an asyncio loop: it makes powered-on bumble devices, the node's central adapter
  (`new_central`) and offering peripherals (`add_offering_peer`), and models distance per address (`set_rssi`),
  since virtual controllers report -50 dBm for everything.
* `open_simulated_radio()` is the Trio harness: it runs a `SimulatedRadio` on its own asyncio thread and hands back a
  `SimulatedRadioHandle`, whose `central_backend()` plugs into `BleTransport.open(..., backend=...)`.

Quirks kept on purpose (see docs/ble.md): devices keep bumble's default random static address (advertising with a
public address broke the link), and LL privacy stays off (bumble issue #841).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from bumble.controller import Controller
from bumble.device import Device
from bumble.host import Host
from bumble.link import LocalLink
from bumble.transport.common import AsyncPipeSink

from transports.ble.bridge import AsyncioThread
from transports.ble.bumble_backend import BumbleCentral, bind_central
from transports.ble.offer_server import ResultVerifier, ServerLimits
from transports.ble.peripheral import BumbleOfferPeripheral, PeripheralFaults
from transports.ble.protocol import PeerInfo
from transports.ble.radios import HasPeerIdentity, OfferingPeerHandle, default_verifier, quiet_device
from transports.ble.timing import LinkProfile
from transports.ble.transport import BleBackend

DEFAULT_RSSI = -50


class SimulatedRadio:
    """One virtual link and everything on it. Use from the asyncio loop it was made on."""

    def __init__(self, link_model: LinkProfile | None = None) -> None:
        self.link = LocalLink()
        # Paces every peripheral's notifications and every central's requests as this radio would (`timing`).
        self.link_model = link_model
        self._rssi: dict[str, int] = {}
        self._devices: list[Device] = []
        self._peripherals: list[BumbleOfferPeripheral] = []
        self._names = itertools.count()

    async def new_device(self, name: str | None = None) -> Device:
        name = name or f"sim-{next(self._names)}"
        controller = Controller(name, link=self.link)
        device = Device(name=name, host=Host(controller, AsyncPipeSink(controller)))
        await device.power_on()
        self._devices.append(device)
        return device

    def set_rssi(self, address: str, rssi: int) -> None:
        self._rssi[address] = rssi

    def rssi_of(self, address: str, reported: int) -> int:
        return self._rssi.get(address, reported)

    async def new_central(self) -> BumbleCentral:
        return BumbleCentral(await self.new_device("central"), self.rssi_of, link_model=self.link_model)

    async def add_offering_peer(
        self,
        identity: HasPeerIdentity,
        offer: bytes,
        *,
        rssi: int = DEFAULT_RSSI,
        verify_result: ResultVerifier | None = None,
        faults: PeripheralFaults | None = None,
        limits: ServerLimits | None = None,
    ) -> BumbleOfferPeripheral:
        """A nearby laptop advertising `offer` (signed wire bytes). By default results are checked with the
        mesh codec against the claimant's PeerID."""
        peripheral = BumbleOfferPeripheral(
            await self.new_device(),
            peer=PeerInfo(identity.peer_id, identity.public_key),
            offer=offer,
            verify_result=verify_result or default_verifier(),
            limits=limits,
            faults=faults,
            link_model=self.link_model,
        )
        self.set_rssi(peripheral.address, rssi)
        await peripheral.start()
        self._peripherals.append(peripheral)
        return peripheral

    async def close(self) -> None:
        """Stop advertising, drop links and flush every host, so that no HCI command is left in flight."""
        for peripheral in self._peripherals:
            await peripheral.stop()
        for device in self._devices:
            await quiet_device(device)
        for device in self._devices:
            with contextlib.suppress(Exception):
                await device.power_off()


@dataclass(frozen=True, slots=True)
class SimulatedRadioHandle:
    """A `SimulatedRadio` on its own asyncio thread, seen from Trio."""

    thread: AsyncioThread
    radio: SimulatedRadio

    async def central_backend(self) -> BleBackend:
        """A fresh central adapter on this radio, for `BleTransport.open(..., backend=...)`."""
        central = await self.thread.run(self.radio.new_central)
        scanner, client = bind_central(central)
        return BleBackend(scanner, client, self.thread)

    async def add_offering_peer(self, identity: HasPeerIdentity, offer: bytes, **options: Any) -> OfferingPeerHandle:
        """See `SimulatedRadio.add_offering_peer`."""

        async def add() -> BumbleOfferPeripheral:
            return await self.radio.add_offering_peer(identity, offer, **options)

        return OfferingPeerHandle(self.thread, await self.thread.run(add))


@contextlib.asynccontextmanager
async def open_simulated_radio(link_model: LinkProfile | None = None) -> AsyncIterator[SimulatedRadioHandle]:
    """From Trio: a simulated radio for the duration of the block. Close transports using it first."""
    async with AsyncioThread.open("ble-sim") as thread:

        async def make() -> SimulatedRadio:
            radio = SimulatedRadio(link_model)
            thread.add_closer(radio.close)
            return radio

        yield SimulatedRadioHandle(thread, await thread.run(make))
