"""A load of dependent request pairs, which redis-benchmark cannot send: the second request is built
from the first one's reply (a worker's PFXGET, then PFXRELEASE of the lease it got).

``clients`` connections spread over ``processes`` client processes; each connection sends the
first request, reads its reply (hiredis), sends the second built from it, reads that reply, and
starts over, until ``pairs`` pairs are done in all. Every reply is checked by the caller's
function (an error reply stops the run). The same driver runs against pfxcached and against
redis-server (GET of a key + a small command), so the client's own cost is the same on both
sides of the ratio.
"""

from __future__ import annotations

import multiprocessing
import selectors
import socket
import time
from typing import Callable

import hiredis

from pfxcache.testing import encode_command

#: (first request bytes, function: first reply -> second request bytes, function: second reply -> ok)
Pair = tuple[bytes, Callable[[object], bytes], Callable[[object], bool]]


def _client(address: tuple[str, int], pair: Pair, connections: int, pairs: int, out) -> None:
    try:
        out.put(_drive(address, pair, connections, pairs))
    except BaseException as exc:  # the parent reports it: a child's traceback alone would leave it waiting
        out.put(f"{type(exc).__name__}: {exc}")


def _drive(address: tuple[str, int], pair: Pair, connections: int, pairs: int) -> tuple[int, float, int]:
    first, second_of, check = pair
    sel = selectors.DefaultSelector()
    done = 0
    started = 0
    for _ in range(connections):
        sock = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = hiredis.Reader()
        sel.register(sock, selectors.EVENT_READ, [reader, 0])  # state: 0 waits for the first reply, 1 the second
        sock.sendall(first)
        started += 1
    begin = time.perf_counter()
    failures = 0
    while done < pairs:
        for key, _ in sel.select():
            sock = key.fileobj
            reader, state = key.data[0], key.data[1]
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed a connection")
            reader.feed(data)
            while (reply := reader.gets()) is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise RuntimeError(f"error reply: {reply}")
                if state == 0:
                    sock.sendall(second_of(reply))
                    state = 1
                else:
                    failures += not check(reply)
                    done += 1
                    state = 0
                    if started < pairs:
                        sock.sendall(first)
                        started += 1
                key.data[1] = state
    elapsed = time.perf_counter() - begin
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return done, elapsed, failures


def run(address: tuple[str, int], pair: Pair, *, pairs: int = 20_000, clients: int = 50, processes: int = 2) -> dict:
    """Pairs per second over every client process (pairs done / the slowest process's time)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    share = [clients // processes + (i < clients % processes) for i in range(processes)]
    procs = [ctx.Process(target=_client, args=(address, pair, n, pairs // processes, queue)) for n in share]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    errors = [r for r in results if isinstance(r, str)]
    if errors:
        raise RuntimeError(f"a client process failed: {errors[0]}")
    done = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    failures = sum(r[2] for r in results)
    if failures:
        raise RuntimeError(f"{failures} of {done} pairs did not do what they should")
    return {"pairs": done, "seconds": elapsed, "pairs_per_s": done / elapsed}


def lease_pair(namespace: bytes, packed_prompt: bytes, tokens: int) -> Pair:
    """PFXGET with a lease of a cached prompt (must be a full hit), then PFXRELEASE of that lease."""
    def second(reply: object) -> bytes:
        fields = dict(zip(reply[::2], reply[1::2]))  # RESP2: a flat name/value array
        if fields[b"matched"] != tokens or not fields[b"lease"]:
            raise RuntimeError(f"PFXGET was not a leased full hit: {fields[b'matched']} tokens")
        return encode_command("PFXRELEASE", fields[b"lease"])

    return encode_command(b"PFXGET", namespace, b"PACKED", packed_prompt), second, lambda reply: reply == 1


def get_pair(key: bytes, small: list[bytes]) -> Pair:
    """GET of a key, then a small command (the redis-server reference)."""
    request = encode_command(*small)
    return encode_command(b"GET", key), (lambda reply: request), (lambda reply: not isinstance(reply, Exception))
