"""Loopback ports for test servers: outside the kernel's ephemeral range and never handed out
twice in one process, so a port kept for a restarted server cannot be taken meanwhile by another
test's server or by an outgoing connection's local port."""

from __future__ import annotations

import os
import random
import socket

__all__ = ["free_port"]

_LOW, _HIGH = 20000, 32000  # below Linux's default ephemeral range (32768-60999)
_given: set[int] = set()
_rng = random.Random(os.getpid())


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on and this process has not handed out."""
    for _ in range(1000):
        port = _rng.randrange(_LOW, _HIGH)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    raise RuntimeError("no free loopback port found")
