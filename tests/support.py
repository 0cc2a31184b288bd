"""Test-only helpers: raw RESP exchanges over a loopback socket, polling, the environment of child processes.

The process launchers (pfxcached, redis-server on a free port) that tests,
benchmarks and tools share are in ``pfxcache.testing``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import time

from pfxcache.testing import encode_command


def exchange(address: tuple[str, int], payload: bytes, *, timeout: float = 2.0, settle: float = 0.3,
             source: str | None = None) -> tuple[bytes, bool]:
    """Send raw bytes; return (everything received, whether the server closed).

    Reads until the server closes or ``settle`` seconds pass with nothing new.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
    if source:
        sock.bind((source, 0))
    sock.settimeout(timeout)
    sock.connect(address)
    received = bytearray()
    closed = False
    try:
        sock.sendall(payload)
        sock.settimeout(settle)
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    finally:
        sock.close()
    return bytes(received), closed


class RawClient:
    """A blocking raw RESP connection for request/reply tests."""

    def __init__(self, address: tuple[str, int], timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        import hiredis

        self.reader = hiredis.Reader()

    def send(self, payload: bytes) -> None:
        self.sock.sendall(payload)

    def read_raw(self, settle: float = 0.2) -> bytes:
        self.sock.settimeout(settle)
        data = bytearray()
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        return bytes(data)

    def call_raw(self, *args: bytes | str, settle: float = 0.2) -> bytes:
        self.send(encode_command(*args))
        return self.read_raw(settle)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def wait_for(predicate, timeout: float, what: str):
    """Poll ``predicate`` (returns a truthy value when done) until ``timeout`` seconds; fail with ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# -- token pages whose bytes name their prefix (the tier tests) -------------------------------------

def prefix_pages(ns: str, tokens: list[int], page: int, block: int) -> bytes:
    """The bytes of every whole page of ``tokens``: page i is a hash stream of ns and tokens[:end of page i],
    so any bytes served can be checked against the prefix they were served for."""
    out = []
    for end in range(page, len(tokens) - len(tokens) % page + 1, page):
        seed = ns.encode() + b"\0" + struct.pack(f"<{end}I", *tokens[:end])
        out.append(hashlib.shake_256(seed).digest(block))
    return b"".join(out)


def store_prefix(r, ns: str, tokens: list[int], page: int, block: int) -> None:
    """PFXSET DATA of :func:`prefix_pages`."""
    r.execute_command("PFXSET", ns, "TOKENS", *tokens, "DATA", prefix_pages(ns, tokens, page, block))


def fetch_checked(r, ns: str, tokens: list[int], page: int, block: int) -> int:
    """Tokens matched; asserts the bytes served are the right ones."""
    reply = r.execute_command("PFXGET", ns, "TOKENS", *tokens, "NOLEASE", "WITHDATA")
    matched = reply[b"matched"]
    data = reply.get(b"data", b"")
    assert data == prefix_pages(ns, tokens[:matched], page, block), f"wrong bytes for {ns} {tokens[:matched]}"
    return matched
