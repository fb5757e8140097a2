"""Radios the node and the offerer can open: a bumble host stack over an HCI transport, or BlueZ through bleak.

Both are checked *before* anything else starts, so that a radio that cannot work is a `BleSetupError` with the
problem and its fix (the CLI's exit 2, before `ready`), never a traceback later.

* `HciSpec.parse("usb:0")` checks the text of `--ble-hci` against the transports this project documents: `usb:N` or
  `usb:VID:PID`, `hci-socket:N`, `serial:/dev/...[,baud]`, `tcp-client:HOST:PORT`. bumble's `open_transport` takes
  many more; they are refused here, because each one the CLI accepts is a promise docs/ble.md keeps.
* `open_hci_device(spec)` opens the transport and powers a bumble `Device` on over it (HCI reset and set-up), bounded.
  This is the path of a USB dongle, of a laptop's own controller through an HCI user channel, and of the virtual
  controllers of `python -m bumble.apps.controllers` in the tests.
* `check_bluez()` checks what bleak's BlueZ backend needs, cheapest first: a kernel with Bluetooth, the D-Bus system
  bus, bluetoothd on it, and an adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bumble.device import Device
    from bumble.transport.common import Transport

SCHEMES = ("usb", "hci-socket", "serial", "tcp-client")
OPEN_TIMEOUT_S = 10.0
POWER_ON_TIMEOUT_S = 10.0
BLUEZ_TIMEOUT_S = 5.0
AF_BLUETOOTH = getattr(socket, "AF_BLUETOOTH", 31)

_FIXES = {
    "usb": (
        "plug in a Bluetooth USB dongle and check that it is listed by `bumble-usb-probe`; give your user access to "
        "it (a udev rule, see docs/ble.md) or run as root; on Linux unbind it from the kernel's btusb driver so that "
        "BlueZ does not hold it"
    ),
    "hci-socket": (
        "this needs a Linux kernel with Bluetooth and the adapter taken down in BlueZ (`sudo btmgmt --index N power "
        "off`), and CAP_NET_ADMIN (run as root); on a kernel without Bluetooth use a USB dongle with --ble-hci usb:0"
    ),
    "serial": "check the device path and that your user may open it (on Debian: the dialout group)",
    "tcp-client": (
        "start an HCI controller listening there first, for example `python -m bumble.apps.controllers "
        "tcp-server:127.0.0.1:P1 tcp-server:127.0.0.1:P2`"
    ),
}


class BleSetupError(Exception):
    """A radio that cannot be used, with what is wrong and how to fix it, for the person at the terminal."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}")
        self.problem = problem
        self.fix = fix


_USB = re.compile(r"\d+|[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}([/#][\w.-]+)?")
_SERIAL = re.compile(r"(/[\w./-]+|COM\d+)(,\d+)?")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class HciSpec:
    scheme: str
    target: str

    @property
    def text(self) -> str:
        return f"{self.scheme}:{self.target}"

    @property
    def fix(self) -> str:
        return _FIXES[self.scheme]

    @classmethod
    def parse(cls, text: str) -> HciSpec:
        scheme, sep, target = text.partition(":")
        if not sep or scheme not in SCHEMES:
            raise BleSetupError(
                f"--ble-hci {text!r} names no supported HCI transport",
                "give one of usb:0 (or usb:VID:PID), hci-socket:0, serial:/dev/ttyACM0[,1000000], tcp-client:HOST:PORT",
            )
        if scheme in ("usb", "hci-socket"):
            ok = bool(_USB.fullmatch(target)) if scheme == "usb" else target.isdigit()
            example = "usb:0 or usb:2fe3:000b" if scheme == "usb" else "hci-socket:0"
        elif scheme == "serial":
            ok, example = bool(_SERIAL.fullmatch(target)), "serial:/dev/ttyACM0 or serial:/dev/ttyUSB0,1000000"
        else:
            host, _, port = target.rpartition(":")
            ok = bool(_HOST.fullmatch(host)) and port.isdigit() and 0 < int(port) < 65536
            example = "tcp-client:127.0.0.1:6402"
        if not ok:
            raise BleSetupError(f"--ble-hci {text!r} is not a valid {scheme} transport", f"write it like {example}")
        return cls(scheme, target)


async def open_hci_device(spec: HciSpec, name: str) -> tuple[Device, Transport]:
    """Open the HCI transport and power a bumble `Device` on over it. Returns (device, transport). Asyncio side.

    Every failure is a `BleSetupError`. The caller closes the transport (`await transport.close()`).
    """
    from bumble import hci
    from bumble.device import Device
    from bumble.transport import open_transport

    try:
        transport = await asyncio.wait_for(open_transport(spec.text), OPEN_TIMEOUT_S)
    except TimeoutError:
        problem = f"opening HCI transport {spec.text} took more than {OPEN_TIMEOUT_S:.0f} s"
        raise BleSetupError(problem, spec.fix) from None
    except Exception as exc:  # libusb, serial, socket and bumble errors: all mean this transport cannot be opened
        raise BleSetupError(f"cannot open HCI transport {spec.text}: {_describe(exc)}", spec.fix) from None
    device = Device.with_hci(name, hci.Address.generate_static_address(), transport.source, transport.sink)
    try:
        await asyncio.wait_for(device.power_on(), POWER_ON_TIMEOUT_S)
        # A controller whose previous host died may still be advertising (bumble's virtual controller ignores HCI
        # reset); a real one stops on reset. Either way, this host starts from a quiet controller.
        with contextlib.suppress(Exception):
            await device.stop_advertising()
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await transport.close()
        if isinstance(exc, TimeoutError):
            raise BleSetupError(
                f"the controller on {spec.text} did not finish HCI set-up within {POWER_ON_TIMEOUT_S:.0f} s",
                f"check that {spec.text} is a Bluetooth controller and that no other program uses it; {spec.fix}",
            ) from None
        if isinstance(exc, Exception):
            problem = f"the controller on {spec.text} failed HCI set-up: {_describe(exc)}"
            raise BleSetupError(problem, spec.fix) from None
        raise
    return device, transport


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def check_bluez() -> None:
    """Raise `BleSetupError` unless bleak's BlueZ backend can scan here. Linux only; elsewhere bleak's own backends
    (CoreBluetooth, WinRT) are used and need no BlueZ. Asyncio side, on the loop the transport will use."""
    if not sys.platform.startswith("linux"):
        return
    alternatives = "or drive a USB dongle directly with `--ble-hci usb:0`, or try the simulated radio with --ble-sim"
    try:
        socket.socket(AF_BLUETOOTH, socket.SOCK_SEQPACKET, 0).close()  # L2CAP: any user may create one
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EINVAL):
            raise BleSetupError(
                f"--ble uses BlueZ, but this kernel has no Bluetooth support (socket(AF_BLUETOOTH): {exc.strerror})",
                f"use a kernel built with Bluetooth (CONFIG_BT) and install BlueZ, {alternatives}",
            ) from None
    from bleak.backends.bluezdbus.manager import get_global_bluez_manager
    from bleak.exc import BleakError

    try:
        manager = await asyncio.wait_for(get_global_bluez_manager(), BLUEZ_TIMEOUT_S)
    except (FileNotFoundError, ConnectionRefusedError, PermissionError) as exc:
        raise BleSetupError(
            f"--ble uses BlueZ over the D-Bus system bus, which is not reachable ({_describe(exc)})",
            f"start D-Bus and bluetoothd (`sudo systemctl start dbus bluetooth`), {alternatives}",
        ) from None
    except TimeoutError:
        raise BleSetupError(
            f"BlueZ did not answer on the D-Bus system bus within {BLUEZ_TIMEOUT_S:.0f} s",
            f"check `systemctl status bluetooth`, {alternatives}",
        ) from None
    except Exception as exc:  # dbus-fast's errors (org.bluez unknown) and bleak's
        raise BleSetupError(
            f"BlueZ (bluetoothd) is not running or refused us ({_describe(exc)})",
            f"install and start it (`sudo apt install bluez && sudo systemctl start bluetooth`), {alternatives}",
        ) from None
    try:
        manager.get_default_adapter()
    except BleakError as exc:
        raise BleSetupError(
            f"BlueZ runs but has no Bluetooth adapter ({exc})",
            "plug one in or unblock it (`rfkill unblock bluetooth`, then `bluetoothctl power on`)",
        ) from None
