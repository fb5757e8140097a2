"""A bind tried once on a socket of our own, before Hypercorn binds the same address.

Hypercorn (0.18) leaves its socket open when its bind fails: `Config._create_sockets` makes the socket, and a
`bind` that raises leaves it to the garbage collector (a ResourceWarning, and an fd per attempt). Probing first
means a bad or busy address fails here, with our socket closed, and Hypercorn only binds what just bound.
"""

from __future__ import annotations

import socket


def probe_bind(host: str, port: int) -> None:
    """Bind (host, port) on a TCP socket as Hypercorn would, and close it at once. Raises the bind's OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Hypercorn binds: TIME_WAIT is no conflict
        probe.bind((host, port))
