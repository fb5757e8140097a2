"""One connected GATT link to an offering peer, seen from the central, over bleak's public client API.

Every wait here is bounded: reads and writes by the idle timeout, messages by an idle timeout that restarts on each
chunk plus a total deadline. A dropped link wakes every waiter at once. Runs on the asyncio side.
"""

from __future__ import annotations

import asyncio
import collections

from bleak import BleakClient
from bleak.backends.characteristic import BleakGATTCharacteristic
from bleak.exc import BleakError

from transports.ble.framing import Reassembler, encode_frames, notify_frame_size
from transports.ble.reasons import BleFault, BleReason

# Complete messages waiting to be read. Each step of the protocol expects one answer; more than this is a peer
# talking out of turn, and is a fault rather than a queue that grows.
MAX_PENDING_MESSAGES = 4


class Inbox:
    """Reassembles the notifications of one characteristic into messages, in bounded memory."""

    def __init__(self, max_message: int) -> None:
        self._reassembler = Reassembler(max_message)
        self._items: collections.deque[bytes | BleFault] = collections.deque()
        self._wakeup = asyncio.Event()
        self._failed = False
        self._disconnected = False

    def on_frame(self, _char: BleakGATTCharacteristic, frame: bytearray) -> None:
        if self._failed:
            return
        try:
            message = self._reassembler.feed(bytes(frame))
        except BleFault as fault:
            self._fail(fault)
            return
        if message is not None:
            if len(self._items) >= MAX_PENDING_MESSAGES:
                self._fail(BleFault(BleReason.MALFORMED_FRAME, "peer sent messages out of turn"))
                return
            self._items.append(message)
        self._wakeup.set()  # progress, even without a complete message, restarts the idle clock

    def _fail(self, fault: BleFault) -> None:
        # The first fault is the one that matters; what follows it is noise from the same broken transfer.
        self._failed = True
        self._items.append(fault)
        self._wakeup.set()

    def on_disconnect(self) -> None:
        self._disconnected = True
        self._wakeup.set()

    async def next_message(self, idle_timeout: float, total_timeout: float) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total_timeout
        while True:
            if self._items:
                item = self._items.popleft()
                if isinstance(item, BleFault):
                    raise item
                return item
            if self._disconnected:
                raise BleFault(BleReason.DISCONNECTED, "link dropped while waiting for a message")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise BleFault(BleReason.TIMEOUT, f"message not complete within {total_timeout}s")
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), min(idle_timeout, remaining))
            except TimeoutError:
                if loop.time() < deadline:
                    raise BleFault(BleReason.TIMEOUT, f"peer stalled: nothing for {idle_timeout}s") from None


class GattLink:
    """A connected `BleakClient` plus the protocol's reads, framed writes and notification inboxes."""

    def __init__(self, client: BleakClient, idle_timeout: float) -> None:
        self.client = client
        self.idle_timeout = idle_timeout
        self._inboxes: list[Inbox] = []
        self._sent: dict[str, int] = {}  # messages sent so far, per characteristic: numbers the next one

    def on_disconnect(self) -> None:
        for inbox in self._inboxes:
            inbox.on_disconnect()

    async def _bounded(self, what: str, coro: object) -> object:
        try:
            return await asyncio.wait_for(coro, self.idle_timeout)  # type: ignore[arg-type]
        except TimeoutError:
            raise BleFault(BleReason.TIMEOUT, f"{what} took longer than {self.idle_timeout}s") from None
        except BleakError as exc:
            code = BleReason.DISCONNECTED if not self.client.is_connected else BleReason.BAD_PEER_INFO
            raise BleFault(code, f"{what}: {exc}") from None

    async def read(self, uuid: str) -> bytes:
        value = await self._bounded(f"read {uuid}", self.client.read_gatt_char(uuid))
        assert isinstance(value, bytearray | bytes)
        return bytes(value)

    async def subscribe(self, uuid: str, max_message: int) -> Inbox:
        inbox = Inbox(max_message)
        self._inboxes.append(inbox)
        await self._bounded(f"subscribe {uuid}", self.client.start_notify(uuid, inbox.on_frame))
        return inbox

    async def write_raw(self, uuid: str, data: bytes) -> None:
        await self._bounded(f"write {uuid}", self.client.write_gatt_char(uuid, data, response=True))

    async def send(self, uuid: str, message: bytes) -> None:
        """Write a framed message, one write request per frame (each acknowledged, so the peer sets the pace)."""
        number = self._sent.get(uuid, 0)
        self._sent[uuid] = number + 1
        for frame in encode_frames(message, notify_frame_size(self.client.mtu_size), number):
            await self.write_raw(uuid, frame)
