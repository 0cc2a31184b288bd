"""The prefix cache commands: PFXGET, PFXSET, PFXALLOC, PFXRELEASE, PFXEVICT, PFXINFO,
and PFXCHECK (verifies the store's invariants, like Redis's DEBUG family).

Argument grammar (the rows in ``defs/pfx*.json`` document it for COMMAND DOCS):
tokens are ``TOKENS t1 t2 ...`` (decimal uint32, the list ends at the first
argument that is not an integer) or ``PACKED blob`` (little-endian uint32s).
Bad input of any kind is an ``-ERR`` with the reason, and changes nothing.
Replies are maps: RESP3 maps, flat name/value arrays under RESP2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pfxcache.protocol.replies import OK, Error, ShortestDouble, quoted

from pfxcache.daemon.service.block_ids import block_ids_reply
from pfxcache.daemon.service.forked_check import CheckFailed
from pfxcache.daemon.service.prefix import PrefixService
from ..store.errors import StoreError
from . import handles, handles_now
from .context import LATER, Context

UINT32_MAX = 2**32 - 1
TTL_MAX_MS = 7 * 24 * 3600 * 1000  # a week: longer than any prefill, short of forever
#: The options that may follow a prompt (and end its TOKENS list), per command.
_PFXGET_OPTIONS = frozenset({b"NOLEASE", b"TTL", b"WITHDATA"})
_PFXSET_OPTIONS = frozenset({b"OFFSET", b"DATA", b"BLOCKS"})


class ArgumentError(Exception):
    """Bad arguments: the message is the whole error reply."""


def _is_decimal(raw: bytes) -> bool:
    """An integer as Redis's string2ll reads one: no sign but '-', no leading zero, no '-0'."""
    body = raw[1:] if raw[:1] == b"-" else raw
    return body.isdigit() and len(raw) <= 20 and (body[:1] != b"0" or raw == b"0")


def _integer(raw: bytes, what: str, low: int, high: int) -> int:
    if not _is_decimal(raw):
        raise ArgumentError(f"ERR {what} must be an integer, got '{_show(raw)}'")
    value = int(raw)
    if not low <= value <= high:
        raise ArgumentError(f"ERR {what} must be between {low} and {high}, got {value}")
    return value


def _show(raw: bytes, limit: int = 64) -> str:
    text = quoted(raw[:limit])
    return text + ("..." if len(raw) > limit else "")


def parse_tokens(argv: list[bytes], position: int, max_tokens: int,
                 options: frozenset[bytes] = frozenset()) -> tuple[bytes, int]:
    """Parse ``TOKENS t ...`` or ``PACKED blob`` at ``argv[position]``.

    A TOKENS list runs to the end of ``argv`` or to the first of the command's
    ``options`` (uppercase keywords that may follow it); every argument before
    that is a token id, so a word that is neither (``TOKENS a b c``) is refused
    as a token id, not taken for an unknown option. Returns the packed
    little-endian uint32 tokens and the position after them.
    """
    if position >= len(argv):
        raise ArgumentError("ERR missing TOKENS or PACKED")
    keyword = argv[position].upper()
    if keyword == b"PACKED":
        if position + 1 >= len(argv):
            raise ArgumentError("ERR PACKED needs a blob of little-endian uint32 token ids")
        blob = argv[position + 1]
        if len(blob) % 4:
            raise ArgumentError(f"ERR PACKED blob of {len(blob)} bytes is not a whole number of uint32 token ids")
        if len(blob) // 4 > max_tokens:
            raise ArgumentError(f"ERR prompt of {len(blob) // 4} tokens is over prompt-max-tokens ({max_tokens})")
        return blob, position + 2
    if keyword != b"TOKENS":
        raise ArgumentError(f"ERR expected TOKENS or PACKED, got '{_show(argv[position])}'")
    end = position + 1
    # Stop scanning one past the limit: a huge TOKENS list is refused without being read.
    stop = min(len(argv), position + 1 + max_tokens + 1)
    while end < stop and _is_decimal(argv[end]):
        end += 1
    if end < stop and argv[end].upper() not in options:
        raise ArgumentError(f"ERR token id '{_show(argv[end])}' is not an unsigned 32-bit integer")
    count = end - position - 1
    if count > max_tokens:
        raise ArgumentError(f"ERR prompt of more than prompt-max-tokens ({max_tokens}) tokens")
    if not count:
        return b"", end
    try:
        # One C-level conversion of the whole list (each argument is already known to be decimal).
        values = np.array(argv[position + 1 : end]).astype(np.int64)
    except (OverflowError, ValueError):
        values = None
    if values is None or values.min() < 0 or values.max() > UINT32_MAX:
        bad = next(raw for raw in argv[position + 1 : end] if not 0 <= int(raw) <= UINT32_MAX)
        raise ArgumentError(f"ERR token id '{_show(bad)}' is not an unsigned 32-bit integer")
    return values.astype("<u4").tobytes(), end


def _ttl(argv: list[bytes], position: int) -> int:
    if position + 1 >= len(argv):
        raise ArgumentError("ERR TTL needs a number of milliseconds")
    return _integer(argv[position + 1], "TTL", 1, TTL_MAX_MS)


def _ids(blocks: list[int]) -> Any:
    """Block ids as a reply value: encoded once per tree node (see block_ids), or one integer array."""
    return block_ids_reply(blocks)


def _store_error(error: StoreError) -> Error:
    return Error(error.line)


def _service(ctx: Context) -> PrefixService:
    return ctx.server.prefix


def _namespace(raw: bytes) -> bytes:
    if not raw:
        raise ArgumentError("ERR the namespace (key) must not be empty")
    return raw


def _prompt(ctx: Context, argv: list[bytes], options: frozenset[bytes]) -> tuple[bytes, bytes, int, bool]:
    """``key (TOKENS ...|PACKED blob|HASHES n k1 .. kn)`` at argv[1:], the command's ``options`` after
    it: namespace, packed tokens (key pages for HASHES), position after them, whether they are keys."""
    namespace = _namespace(argv[1])
    if len(argv) > 2 and argv[2].upper() == b"HASHES":
        tokens, position = parse_hashes(ctx, argv, 2)
        return namespace, tokens, position, True
    tokens, position = parse_tokens(argv, 2, ctx.server.config["prompt-max-tokens"], options)
    return namespace, tokens, position, False


def parse_hashes(ctx: Context, argv: list[bytes], position: int) -> tuple[bytes, int]:
    """``HASHES n k1 .. kn`` at ``argv[position]``: the key pages standing for the keys (store/page_keys.py)
    and the position after them. n is a count, like Redis's numkeys: keys are binary and may look
    like an option word."""
    store = _service(ctx).store
    if position + 1 >= len(argv):
        raise ArgumentError("ERR HASHES needs a key count and the keys: HASHES n k1 ... kn")
    most = max(1, ctx.server.config["prompt-max-tokens"] // store.page_size)
    count = _integer(argv[position + 1], "the HASHES key count", 1, most)
    end = position + 2 + count
    if end > len(argv):
        raise ArgumentError(f"ERR HASHES says {count} keys but {len(argv) - position - 2} arguments follow")
    try:
        return store.key_pages(argv[position + 2 : end]), end
    except StoreError as exc:
        raise ArgumentError(exc.line) from None


def _pfxget_arguments(ctx: Context, argv: list[bytes]) -> tuple[bytes, bytes, bool, int | None, bool] | Error:
    """PFXGET's arguments: namespace, tokens, lease, ttl_ms, with_data (or the Error reply)."""
    try:
        namespace, tokens, position, keys = _prompt(ctx, argv, _PFXGET_OPTIONS)
        lease, ttl_ms, with_data = True, None, False
        while position < len(argv):
            option = argv[position].upper()
            if option == b"NOLEASE":
                lease = False
                position += 1
            elif option == b"TTL":
                ttl_ms = _ttl(argv, position)
                position += 2
            elif option == b"WITHDATA":
                with_data = True
                position += 1
            else:
                raise ArgumentError(f"ERR unknown option '{_show(argv[position])}' for 'pfxget'")
    except ArgumentError as exc:
        return Error(str(exc))
    return namespace, tokens, lease, ttl_ms, with_data, keys


def _lookup_reply(ctx: Context, found: Any, with_data: bool, keys: bool) -> dict:
    # HASHES counts keys (pages), TOKENS/PACKED tokens.
    matched = found.matched_tokens // _service(ctx).store.page_size if keys else found.matched_tokens
    reply = {"matched": matched, "lease": found.lease_id, "blocks": _ids(found.blocks)}
    if with_data:
        reply["data"] = found.data
    return reply


@handles("pfxget")
async def pfxget(ctx: Context, argv: list[bytes]) -> Any:
    parsed = _pfxget_arguments(ctx, argv)
    if parsed.__class__ is Error:
        return parsed
    namespace, tokens, lease, ttl_ms, with_data, keys = parsed
    try:
        found = await _service(ctx).lookup(namespace, tokens, owner=ctx.client.id, lease=lease, ttl_ms=ttl_ms,
                                           with_data=with_data, keys=keys)
    except StoreError as exc:  # a lease past client-lease-limit or the tenant's quota, the other kind of pages
        return _store_error(exc)
    return _lookup_reply(ctx, found, with_data, keys)


@handles_now("pfxget")
def pfxget_now(ctx: Context, argv: list[bytes]) -> Any:
    """PFXGET without WITHDATA whose shard lock is free: done without an await (else LATER)."""
    parsed = _pfxget_arguments(ctx, argv)
    if parsed.__class__ is Error:
        return parsed
    namespace, tokens, lease, ttl_ms, with_data, keys = parsed
    if with_data:
        return LATER
    try:
        found = _service(ctx).lookup_now(namespace, tokens, owner=ctx.client.id, lease=lease, ttl_ms=ttl_ms,
                                         keys=keys)
    except StoreError as exc:
        return _store_error(exc)
    return LATER if found is None else _lookup_reply(ctx, found, False, keys)


def _pfxset_arguments(ctx: Context, argv: list[bytes]) -> tuple[bytes, bytes, int, Any, list[int] | None] | Error:
    """PFXSET's arguments: namespace, tokens, offset, data, blocks (or the Error reply)."""
    try:
        namespace, tokens, position, keys = _prompt(ctx, argv, _PFXSET_OPTIONS)
        offset, data, blocks = 0, None, None
        while position < len(argv):
            option = argv[position].upper()
            if option == b"OFFSET" and position + 1 < len(argv):
                if keys:  # keys already cached, as tokens of key pages
                    page_size = _service(ctx).store.page_size
                    offset = _integer(argv[position + 1], "OFFSET", 0, len(tokens) // 4 // page_size) * page_size
                else:
                    offset = _integer(argv[position + 1], "OFFSET", 0, len(tokens) // 4)
                position += 2
            elif option == b"DATA" and position + 1 < len(argv) and data is None and blocks is None:
                data = argv[position + 1]
                position += 2
            elif option == b"BLOCKS" and data is None and blocks is None:
                end = position + 1  # like a TOKENS list, the ids run to the next option
                while end < len(argv) and argv[end].upper() not in _PFXSET_OPTIONS:
                    end += 1
                blocks = [_integer(raw, "block id", 0, UINT32_MAX) for raw in argv[position + 1 : end]]
                position = end
            else:
                raise ArgumentError(f"ERR unknown or repeated option '{_show(argv[position])}' for 'pfxset'")
        if data is None and blocks is None:
            raise ArgumentError("ERR PFXSET needs DATA blob or BLOCKS id ...")
    except ArgumentError as exc:
        return Error(str(exc))
    return namespace, tokens, offset, data, blocks, keys


def _insert_reply(result: Any) -> dict:
    return {"stored": result.stored, "existing": result.existing, "blocks": _ids(result.blocks)}


@handles("pfxset")
async def pfxset(ctx: Context, argv: list[bytes]) -> Any:
    parsed = _pfxset_arguments(ctx, argv)
    if parsed.__class__ is Error:
        return parsed
    namespace, tokens, offset, data, blocks, keys = parsed
    try:
        result = await _service(ctx).insert(namespace, tokens, owner=ctx.client.id, offset=offset, data=data,
                                            blocks=blocks, keys=keys)
    except StoreError as exc:
        return _store_error(exc)
    return _insert_reply(result)


@handles_now("pfxset")
def pfxset_now(ctx: Context, argv: list[bytes]) -> Any:
    """PFXSET whose shard lock is free and whose DATA is small: done without an await (else LATER)."""
    parsed = _pfxset_arguments(ctx, argv)
    if parsed.__class__ is Error:
        return parsed
    namespace, tokens, offset, data, blocks, keys = parsed
    try:
        result = _service(ctx).insert_now(namespace, tokens, owner=ctx.client.id, offset=offset, data=data,
                                          blocks=blocks, keys=keys)
    except StoreError as exc:
        return _store_error(exc)
    return LATER if result is None else _insert_reply(result)


@handles("pfxalloc")
def pfxalloc(ctx: Context, argv: list[bytes]) -> Any:
    service = _service(ctx)
    try:
        namespace = _namespace(argv[1])
        count = _integer(argv[2], "the number of blocks", 1, service.max_alloc)
        ttl_ms = None
        if len(argv) == 5 and argv[3].upper() == b"TTL":
            ttl_ms = _ttl(argv, 3)
        elif len(argv) != 3:
            raise ArgumentError("ERR syntax error, expected PFXALLOC key count [TTL ms]")
        result = service.alloc(namespace, count, ttl_ms=ttl_ms, owner=ctx.client.id)
    except ArgumentError as exc:
        return Error(str(exc))
    except StoreError as exc:
        return _store_error(exc)
    return {"lease": result.lease_id, "blocks": _ids(result.blocks)}


@handles("pfxrelease")
def pfxrelease(ctx: Context, argv: list[bytes]) -> Any:
    try:
        leases = [_integer(raw, "lease id", 1, 2**63 - 1) for raw in argv[1:]]
    except ArgumentError as exc:
        return Error(str(exc))
    return _service(ctx).release(leases, ctx.client.id)


@handles("pfxrenew")
def pfxrenew(ctx: Context, argv: list[bytes]) -> Any:
    """1 when the lease got its new deadline; 0 when it is gone, expired (fenced) or another's."""
    try:
        lease = _integer(argv[1], "lease id", 1, 2**63 - 1)
        ttl_ms = None
        if len(argv) == 4 and argv[2].upper() == b"TTL":
            ttl_ms = _ttl(argv, 2)
        elif len(argv) != 2:
            raise ArgumentError("ERR syntax error, expected PFXRENEW lease [TTL ms]")
    except ArgumentError as exc:
        return Error(str(exc))
    return int(_service(ctx).renew(lease, ctx.client.id, ttl_ms))


@handles("pfxevict")
def pfxevict(ctx: Context, argv: list[bytes]) -> Any:
    service = _service(ctx)
    try:
        namespace = _namespace(argv[1])
        mode = argv[2].upper()
        if mode in (b"TOKENS", b"PACKED", b"HASHES"):
            keys = mode == b"HASHES"
            if keys:
                tokens, position = parse_hashes(ctx, argv, 2)
            else:
                tokens, position = parse_tokens(argv, 2, ctx.server.config["prompt-max-tokens"])
            if position != len(argv):
                raise ArgumentError(f"ERR unexpected argument '{_show(argv[position])}' for 'pfxevict'")
            result = service.evict(namespace, prefix=tokens, keys=keys)
        elif mode in (b"PAGES", b"BYTES") and len(argv) == 4:
            amount = _integer(argv[3], mode.decode(), 0, 2**63 - 1)
            if mode == b"PAGES":
                result = service.evict(namespace, pages=amount)
            else:
                result = service.evict(namespace, nbytes=amount)
        elif mode == b"ALL" and len(argv) == 3:
            result = service.evict(namespace)
        else:
            raise ArgumentError("ERR syntax error, expected PFXEVICT key "
                                "(TOKENS ...|PACKED blob|HASHES n k ...|PAGES n|BYTES n|ALL)")
    except ArgumentError as exc:
        return Error(str(exc))
    except StoreError as exc:
        return _store_error(exc)
    return {"evicted": result.evicted, "freed": result.freed_bytes, "pinned": result.pinned}


@handles("pfxinfo")
def pfxinfo(ctx: Context, argv: list[bytes]) -> Any:
    if len(argv) > 2:
        return Error("ERR wrong number of arguments for 'pfxinfo' command")
    service = _service(ctx)
    user = ctx.server.acl.users.get(ctx.client.user)
    if user is not None and user.all_keys:
        visible = None
    else:  # a tenant sees its own namespaces (a user deleted meanwhile: none)
        visible = user.key_allowed if user is not None else (lambda _name: False)
    return _shortest_doubles(service.describe(argv[1] if len(argv) == 2 else None, visible))


def _shortest_doubles(value: Any) -> Any:
    """PFXINFO's figures with their doubles written shortest (``hit_rate 0.8``): the reply is ours, not Redis's."""
    if value.__class__ is float:
        return ShortestDouble(value)
    if isinstance(value, dict):
        return {key: _shortest_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shortest_doubles(item) for item in value]
    return value


@handles("pfxcheck")
async def pfxcheck_command(ctx: Context, argv: list[bytes]) -> Any:
    """PFXCHECK: the service checks a large store in a forked copy, so no client waits for it."""
    try:
        problems = await _service(ctx).check()
    except CheckFailed as exc:
        return Error(f"ERR PFXCHECK could not complete: {exc}")
    return check_reply(problems)


def pfxcheck(ctx: Context, argv: list[bytes]) -> Any:
    """Verify every invariant of the store (like Redis's DEBUG family) here and now: +OK or -ERR
    listing the violations."""
    # The invariants are the store core's own (each part's check()), read with no lock:
    # the check is synchronous, so it sees the store between two awaits, consistent.
    return check_reply(_service(ctx).store.check())


def check_reply(problems: list[str]) -> Any:
    """+OK, or one -ERR line listing (the first 20 of) the violations."""
    if not problems:
        return OK
    shown = problems[:20]
    more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
    text = "; ".join(p.replace("\r", " ").replace("\n", " ") for p in shown)
    return Error(f"ERR store check failed, {len(problems)} violation(s): {text}{more}")
