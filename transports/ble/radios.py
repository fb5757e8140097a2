"""The radios BLE runs on, seen from Trio: BlueZ (bleak's platform backend) and a bumble host stack over HCI.

Each is opened as an async context that checks the radio first (`BleSetupError` with a reason and a fix when it
cannot work), owns the asyncio thread its stack lives on, and closes everything on exit. They all fit
`BleTransport.open(..., backend=await radio.central_backend())`; an HCI radio can also serve one offer
(`HciRadio.offer`), which is what `edgecoder offer --ble-hci` does. The simulated radio is in `transports.ble.sim`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from transports.ble.bridge import AsyncioThread
from transports.ble.hci import BleSetupError, HciSpec, check_bluez, open_hci_device
from transports.ble.offer_server import PeripheralState, RefusalRecord, ResultVerifier, ServerLimits
from transports.ble.peripheral import BumbleOfferPeripheral, PeripheralFaults
from transports.ble.protocol import PeerInfo
from transports.ble.timing import LinkProfile
from transports.ble.transport import BleBackend, BleRadio

__all__ = ["BleSetupError", "BlueZRadio", "HciRadio", "HciSpec", "open_bluez_radio", "open_hci_radio", "open_radio"]


class HasPeerIdentity(Protocol):
    """What an offering peripheral needs of an identity (a `transports.wire.identity.NodeIdentity` fits)."""

    @property
    def peer_id(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...


def default_verifier() -> ResultVerifier:
    from transports.ble.results import verify_with_mesh_codec  # the mesh codec: only where results are checked

    return verify_with_mesh_codec


@dataclass(frozen=True, slots=True)
class OfferingPeerHandle:
    """An offering peripheral, seen from Trio."""

    thread: AsyncioThread
    peripheral: BumbleOfferPeripheral

    @property
    def address(self) -> str:
        return self.peripheral.address  # fixed at creation: safe to read from any thread

    async def wait_result(self) -> Any:
        """The verified result (a `transports.wire.results.TaskResult` with the default verifier)."""
        return await self.thread.run(self.peripheral.wait_result)

    async def wait_outcome(self, is_final: Callable[[RefusalRecord], bool]) -> Any:
        """The verified result, or the first refusal `is_final` accepts as the end of the offer (a `RefusalRecord`)."""

        async def wait() -> Any:
            peripheral = self.peripheral
            while True:
                if peripheral.result is not None:
                    return peripheral.result
                for refusal in peripheral.server.refusals:
                    if is_final(refusal):
                        return refusal
                await peripheral.wait_change()

        return await self.thread.run(wait)

    async def state(self) -> PeripheralState:
        async def snapshot() -> PeripheralState:
            return self.peripheral.state()

        return await self.thread.run(snapshot)


@dataclass(frozen=True, slots=True)
class BlueZRadio:
    """The platform's own stack through bleak (BlueZ on Linux), checked by `open_bluez_radio`."""

    thread: AsyncioThread

    async def central_backend(self) -> BleBackend:
        return BleBackend(thread=self.thread)


@contextlib.asynccontextmanager
async def open_bluez_radio() -> AsyncIterator[BlueZRadio]:
    async with AsyncioThread.open("ble-bluez") as thread:
        await thread.run(check_bluez)
        yield BlueZRadio(thread)


@dataclass(frozen=True, slots=True)
class HciRadio:
    """One bumble `Device`, powered on over an HCI transport, on its own asyncio thread."""

    thread: AsyncioThread
    device: Any  # bumble.device.Device
    spec: HciSpec
    link_model: LinkProfile | None = None

    async def central_backend(self) -> BleBackend:
        from transports.ble.bumble_backend import BumbleCentral, bind_central

        async def make() -> BumbleCentral:
            return BumbleCentral(self.device, link_model=self.link_model)

        scanner, client = bind_central(await self.thread.run(make))
        return BleBackend(scanner, client, self.thread)

    async def offer(
        self,
        identity: HasPeerIdentity,
        offer: bytes,
        *,
        verify_result: ResultVerifier | None = None,
        limits: ServerLimits | None = None,
        faults: PeripheralFaults | None = None,
    ) -> OfferingPeerHandle:
        """Advertise `offer` (signed wire bytes) from this radio until the block that opened it ends."""
        verifier = verify_result or default_verifier()

        async def start() -> BumbleOfferPeripheral:
            peripheral = BumbleOfferPeripheral(
                self.device,
                peer=PeerInfo(identity.peer_id, identity.public_key),
                offer=offer,
                verify_result=verifier,
                limits=limits,
                faults=faults,
                link_model=self.link_model,
            )
            self.thread.add_closer(peripheral.stop)
            await peripheral.start()
            return peripheral

        return OfferingPeerHandle(self.thread, await self.thread.run(start))


async def quiet_device(device: Any) -> None:
    """Stop a bumble device's scan and drop its links, each step ignoring a device already gone, so that no HCI
    command is left in flight when it powers off."""
    with contextlib.suppress(Exception):
        if device.is_scanning:
            await device.stop_scanning()
    for connection in list(device.connections.values()):
        with contextlib.suppress(Exception):
            await connection.disconnect()


@contextlib.asynccontextmanager
async def open_hci_radio(
    spec: HciSpec, *, name: str = "edgecoder", link_model: LinkProfile | None = None
) -> AsyncIterator[HciRadio]:
    """Power a bumble host stack on over `spec`; on exit, stop what runs on it, power off and close the transport."""
    async with AsyncioThread.open(f"ble-hci-{spec.scheme}") as thread:

        async def open_device() -> Any:
            device, transport = await open_hci_device(spec, name)

            async def close() -> None:
                await quiet_device(device)
                with contextlib.suppress(Exception):
                    await device.power_off()
                with contextlib.suppress(Exception):
                    await transport.close()

            thread.add_closer(close)  # runs after the closers added later (peripherals), newest first
            return device

        device = await thread.run(open_device)
        yield HciRadio(thread, device, spec, link_model)


@contextlib.asynccontextmanager
async def open_radio(choice: str | HciSpec, *, link_model: LinkProfile | None = None) -> AsyncIterator[BleRadio]:
    """The node's radio by name: "bluez" (checked), "sim" (a simulated radio in this process) or an `HciSpec`."""
    if isinstance(choice, HciSpec):
        async with open_hci_radio(choice, link_model=link_model) as hci_radio:
            yield hci_radio
    elif choice == "sim":
        from transports.ble.sim import open_simulated_radio

        async with open_simulated_radio(link_model) as sim_radio:
            yield sim_radio
    elif choice == "bluez":
        async with open_bluez_radio() as bluez_radio:
            yield bluez_radio
    else:
        raise ValueError(f"unknown radio {choice!r}")
