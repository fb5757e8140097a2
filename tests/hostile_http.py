"""A scripted HTTP/1.1 server on loopback that plays a hostile or overloaded coordinator (h11 does the parsing).

`answer(method, path, body)` returns `(status, headers, body)`; every request is recorded with its arrival time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import trio

Answer = tuple[int, list[tuple[str, str]], bytes]
Script = Callable[[str, str, bytes], Answer]


@dataclass
class Recorded:
    method: str
    path: str
    body: bytes
    at: float = field(default_factory=time.monotonic)


class HostileHTTP:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Recorded] = []
        self.url = ""

    def paths(self, prefix: str = "") -> list[str]:
        return [r.path for r in self.requests if r.path.startswith(prefix)]

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started(self.url)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    method, path = event.method.decode(), event.target.decode()
                    body = b""
                    while True:
                        part = conn.next_event()
                        if part is h11.NEED_DATA:
                            conn.receive_data(await stream.receive_some(65536))
                            continue
                        if isinstance(part, h11.Data):
                            body += bytes(part.data)
                            continue
                        break  # EndOfMessage
                    self.requests.append(Recorded(method, path, body))
                    status, headers, content = self.script(method, path, body)
                    headers = [*headers, ("content-length", str(len(content)))]
                    await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                    await stream.send_all(conn.send(h11.Data(data=content)))
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    conn.start_next_cycle()
                    continue
                return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
