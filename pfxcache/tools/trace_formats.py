"""Reading workload traces for replay: the request model, the Mooncake token mapping and the file formats.

Formats (see replay's module docstring for the user's view):

  mooncake   JSONL, ``{"timestamp", "input_length", "hash_ids"}`` per line.
  tokens     JSONL, ``{"tokens": [...], "namespace": "..."}`` per line.
  kvtester   kv-cache-tester's native trace (github.com/callanjfox/kv-cache-tester, ``traces/*.json``):
             ONE JSON object per file and conversation, ``{"id", "block_size", "hash_id_scope"?,
             "requests": [{"t", "type", "in", "out", "hash_ids", "think_time"?, ...}, ...]}``, where an
             entry of type "subagent" nests its own ``requests``.

How kvtester conversations become one timeline follows the tester's ``trace_replay_tester.py``
(TestOrchestrator.run, UserSession, _compute_delay, spawn_subagent; docs/trace_replay_tester.md), with
the server made instant so that the result is deterministic:

* Each file is one user. ``users`` of them are active at a time (the tester's ``--max-users``, default
  50); a user that finishes is replaced at once by the next file (the tester's ``--recycle``), in the
  order given (a directory: by file name, i.e. trace id). The tester ramps users up from
  ``--start-users`` as the server's TTFT allows, which depends on the server; we start at full
  concurrency. ``users=0`` starts every conversation at time 0.
* Within a user a request fires when the previous one has completed (instantly here) plus a delay: its
  ``think_time`` when the trace has one (the tester's default ``--timing-strategy think-only``), else
  ``t - previous t`` (``original``), capped at ``max_delay`` seconds (the tester's ``--max-delay``, 60).
* Every entry is sent, streaming ("s") and non-streaming ("n") alike: the tester always sends each one
  (an "n" that repeats the "s" before it with the same hash ids is a full hit).
* A run of "subagent" entries spawns that many concurrent sub-users when the parent reaches it; the parent
  waits until they have all finished, then goes on after its next delay. Under ``hash_id_scope`` "global"
  sub-agents share the file's hash ids; otherwise ("local", the default "per_context") each has its own.
* ``max_context`` (the tester's ``--max-context``; 0 here = none, the tester's default is 128000): a
  context stops at its first request with more input tokens.

Hash ids are per file (and per context), starting at 1, so each id space is moved past the previous ones:
no two conversations share a block unless they are made to. Equal times go in conversation order, then in
the order of the file.

The one sharing the tester makes is optional here (``warm_prefix``, off by default: the traces as they
come share nothing): its ``--warm-prefix-pct`` (default 0.5) starts every user's first message, sub-agents'
too, with one canonical text of that share of the largest ``tool_tokens + system_tokens`` among the
traces, and later messages keep it as history. Here the whole blocks of a context's first request inside
that many tokens become shared blocks 0, 1, ..., wherever the context's later requests still hold them.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MOONCAKE_BLOCK = 512
DEFAULT_NS = "replay"
TOKEN_MASK = 0xFFFFFFFF
FORMATS = ("auto", "mooncake", "tokens", "kvtester")
KVTESTER_USERS = 50  # trace_replay_tester.py --max-users default
KVTESTER_MAX_DELAY = 60.0  # trace_replay_tester.py --max-delay default (seconds)
KVTESTER_TIMINGS = ("think-only", "original")


class TraceFormatError(ValueError):
    """A trace file that cannot be replayed; the message names the file and the line or request."""


@dataclass
class Request:
    """One prompt: its namespace and either Mooncake hash ids or explicit token ids."""

    namespace: str
    input_tokens: int
    hash_ids: list[int] | None = None
    tokens: np.ndarray | None = None  # uint32
    timestamp: float | None = None
    serial: int = 0  # its line in the trace: names the tokens past its hash ids, unique to it


@dataclass
class Trace:
    name: str
    requests: list[Request] = field(default_factory=list)
    block_tokens: int = MOONCAKE_BLOCK
    page_tokens: int | None = None  # the suite replays it in pages of this many tokens (default: its blocks)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests)


def unique_tokens(serial: int, n: int) -> np.ndarray:
    """``n`` token ids that only request ``serial`` has (a hash of (serial, position))."""
    x = (np.uint64(serial) << np.uint64(32)) + np.arange(n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(29)
    return (x & np.uint64(TOKEN_MASK)).astype(np.uint32)


def mooncake_tokens(hash_ids, input_length: int, block_tokens: int = MOONCAKE_BLOCK, serial: int = 0) -> np.ndarray:
    """The token ids of a Mooncake request: block h -> (h*B + j) & 0xffffffff, the last block cut to fit.

    Tokens past the last hash id's block (kv-cache-tester traces leave a
    partial last block without a hash id) are unique to the request: see unique_tokens.
    """
    ids = np.asarray(hash_ids, dtype=np.uint64)
    lo = block_tokens * (len(ids) - 1)
    if len(ids) and input_length <= lo:
        raise ValueError(f"input_length {input_length} does not fill {len(ids)} blocks of {block_tokens} tokens")
    full = (ids[:, None] * np.uint64(block_tokens) + np.arange(block_tokens, dtype=np.uint64)[None, :])
    flat = (full & np.uint64(TOKEN_MASK)).astype(np.uint32).reshape(-1)
    if input_length > len(flat):
        flat = np.concatenate([flat, unique_tokens(serial, input_length - len(flat))])
    return flat[:input_length]


# -- files and formats -------------------------------------------------------------------------------


def expand_paths(paths: list[Path]) -> list[Path]:
    """The trace files: a directory stands for its *.json and *.jsonl files, by name."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".jsonl"))
            if not found:
                raise TraceFormatError(f"{path}: a directory without .json or .jsonl trace files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise TraceFormatError(f"{path}: no such trace file or directory")
    return files


def _is_kvtester(obj) -> bool:
    return isinstance(obj, dict) and "requests" in obj and "block_size" in obj


def _load_json_document(path: Path):
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not a JSON document ({exc})") from None


def detect_format(path: Path) -> tuple[str, object | None]:
    """(the file's format, its kv-cache-tester object when it is one: read once, kept)."""
    try:
        with open(path) as f:
            first = next((line for line in f if line.strip()), "")
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path}: not a text file") from None
    if not first:
        raise TraceFormatError(f"{path}: empty trace file")
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        obj = None  # a JSON document over several lines (a pretty-printed kv-cache-tester trace)?
    if obj is None or _is_kvtester(obj):
        doc = obj if obj is not None else _load_json_document(path)
        if _is_kvtester(doc):
            return "kvtester", doc
        raise TraceFormatError(f"{path}: neither JSONL trace lines nor a kv-cache-tester trace "
                               "(one JSON object with \"requests\" and \"block_size\")")
    if isinstance(obj, dict) and "tokens" in obj:
        return "tokens", None
    return "mooncake", None


def read_trace(paths: list[Path], fmt: str, namespace_per_file: bool, block_tokens: int | None = None,
               limit: int | None = None, users: int = KVTESTER_USERS, max_delay: float = KVTESTER_MAX_DELAY,
               timing: str = "think-only", max_context: int = 0, warm_prefix: float = 0.0) -> Trace:
    """Read trace files or directories of them (formats: the module docstring; ``fmt`` may be "auto").

    ``block_tokens`` None means the format's own: 512 for mooncake, the files' ``block_size`` for kvtester.
    """
    if fmt not in FORMATS:
        raise TraceFormatError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    files = expand_paths(paths)
    if not files:
        raise TraceFormatError("no trace files given")
    if len(paths) == 1:
        name = paths[0].name if paths[0].is_dir() else paths[0].stem
    else:
        name = f"{paths[0].stem}+{len(paths) - 1}"
    first, _ = detect_format(files[0]) if fmt == "auto" else (fmt, None)
    if first == "kvtester":
        warm = 0
        if warm_prefix:  # the tester's share of the largest tool + system prompt: one pass to find it
            if not 0 <= warm_prefix <= 1:
                raise TraceFormatError(f"the warm prefix is a fraction 0..1, not {warm_prefix}")
            warm = int(warm_prefix * max(_prompt_tokens(f, doc) for f, doc in _kvtester_docs(files, fmt)))
        trace = read_kvtester(_kvtester_docs(files, fmt), namespace_per_file, block_tokens, users, max_delay,
                              timing, max_context, warm)
        trace.name = name
    else:
        for f in files[1:] if fmt == "auto" else ():
            kind, _ = detect_format(f)
            if kind != first:
                raise TraceFormatError(f"{f}: a {kind} trace, unlike {files[0]} ({first}): "
                                       "give files of one format")
        trace = Trace(name, _read_jsonl(files, first, namespace_per_file, block_tokens or MOONCAKE_BLOCK),
                      block_tokens or MOONCAKE_BLOCK)
    if limit:
        trace.requests = trace.requests[:limit]
    return trace


def _kvtester_docs(files: list[Path], fmt: str):
    """(path, document) of each kv-cache-tester file, one at a time: a corpus never sits in memory whole."""
    for f in files:
        kind, doc = detect_format(f)
        if kind != "kvtester":
            unlike = f", unlike {files[0]} (kvtester): give files of one format" if fmt == "auto" else ""
            raise TraceFormatError(f"{f}: not a kv-cache-tester trace (one JSON object with \"requests\" and "
                                   f"\"block_size\"){unlike}")
        yield f, doc


def _prompt_tokens(path: Path, doc: dict) -> int:
    """tool_tokens + system_tokens of a kv-cache-tester trace (0 when absent, as the tester reads them)."""
    total = 0
    for key in ("tool_tokens", "system_tokens"):
        value = doc.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceFormatError(f"{path}: {key!r} must be a token count, not {value!r}")
        total += value
    return total


def _read_jsonl(files: list[Path], fmt: str, namespace_per_file: bool, block_tokens: int) -> list[Request]:
    requests: list[Request] = []
    for path in files:
        file_ns = path.stem if namespace_per_file else DEFAULT_NS
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    requests.append(_jsonl_request(json.loads(line), fmt, file_ns, block_tokens, len(requests)))
                except (ValueError, KeyError, TypeError) as exc:
                    what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                    raise TraceFormatError(f"{path}:{lineno}: {what}") from None
    if len(files) > 1 and requests and all(r.timestamp is not None for r in requests):
        requests.sort(key=lambda r: r.timestamp)  # stable: ties keep file order
    return requests


def _jsonl_request(obj: dict, fmt: str, file_ns: str, block_tokens: int, serial: int) -> Request:
    if not isinstance(obj, dict):
        raise ValueError("a trace line must be a JSON object")
    ts = obj.get("timestamp")
    ns = str(obj.get("namespace", file_ns))
    if fmt == "mooncake":
        ids = [int(h) for h in obj["hash_ids"]]
        n = int(obj["input_length"])
        if ids and n <= block_tokens * (len(ids) - 1):
            raise ValueError(f"input_length {n} does not fill {len(ids)} blocks")
        return Request(ns, n, hash_ids=ids, timestamp=ts, serial=serial)
    toks = np.asarray(obj["tokens"], dtype=np.int64)
    if toks.size and (toks.min() < 0 or toks.max() > TOKEN_MASK):
        raise ValueError("token ids must be 0..2**32-1")
    return Request(ns, int(toks.size), tokens=toks.astype(np.uint32), timestamp=ts)


# -- kv-cache-tester ---------------------------------------------------------------------------------


class _IdSpace:
    """The hash ids of one context (a file, or a sub-agent of a "local"/"per_context" trace)."""

    __slots__ = ("largest", "offset", "first", "first_tokens", "warm", "_ints", "_last")

    def __init__(self) -> None:
        self.largest = -1
        self.offset = 0
        self.first: list[int] | None = None  # the hash ids of its first request
        self.first_tokens = 0  # and its input tokens
        self.warm = 0  # how many of those are the shared warm prefix's blocks 0, 1, ...
        self._ints: list[int] | None = None
        self._last: tuple[list[int], list[int]] | None = None

    def moved(self, ids: list[int]) -> list[int]:
        """``ids`` moved by the offset. A corpus holds ~10^8 ids: the moved ints are shared, and so is the
        list of a request that repeats the previous one's ids (an "n" after its "s")."""
        if self._last is not None and self._last[0] == ids:
            return self._last[1]
        if self._ints is None:
            self._ints = list(range(self.offset, self.offset + self.largest + 1))
            for block, h in enumerate(self.first[: self.warm] if self.first else ()):
                self._ints[h] = block
        moved = [self._ints[h] for h in ids]
        self._last = (ids, moved)
        return moved


@dataclass
class _Entry:
    t: float
    think: float | None
    input_tokens: int = 0
    hash_ids: list[int] | None = None  # None: a group of sub-agents
    space: _IdSpace | None = None
    subagents: list[list[_Entry]] | None = None


def _number(req: dict, key: str, where: str, required: bool = True) -> float | None:
    value = req.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(f"{where}: {key!r} must be a number >= 0, not {value!r}")
    return float(value)


def _parse_context(requests, block: int, space: _IdSpace, global_scope: bool, where: str) -> list[_Entry]:
    if not isinstance(requests, list):
        raise TraceFormatError(f"{where}: \"requests\" must be a list")
    entries: list[_Entry] = []
    for i, req in enumerate(requests):
        at = f"{where}[{i}]"
        if not isinstance(req, dict):
            raise TraceFormatError(f"{at}: a request must be a JSON object")
        t = _number(req, "t", at)
        if req.get("type") == "subagent":
            sub_space = space if global_scope else _IdSpace()
            sub = _parse_context(req.get("requests"), block, sub_space, global_scope, f"{at}.requests")
            if entries and entries[-1].subagents is not None:
                entries[-1].subagents.append(sub)  # consecutive sub-agents start together
                entries[-1].t = t
            else:
                entries.append(_Entry(t, None, subagents=[sub]))
            continue
        n = req.get("in")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TraceFormatError(f"{at}: \"in\" must be a token count (an integer >= 0), not {n!r}")
        ids = req.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                for h in ids):
            raise TraceFormatError(f"{at}: \"hash_ids\" must be a list of integers >= 0")
        if ids and n <= block * (len(ids) - 1):
            raise TraceFormatError(f"{at}: {len(ids)} hash ids of {block}-token blocks do not fit \"in\" {n} "
                                   f"(they need more than {block * (len(ids) - 1)} tokens)")
        if ids:
            space.largest = max(space.largest, max(ids))
        if space.first is None:
            space.first, space.first_tokens = ids, n
        entries.append(_Entry(t, _number(req, "think_time", at, required=False), n, ids, space))
    return entries


def _schedule(entries: list[_Entry], start: float, max_delay: float, timing: str, max_context: int,
              out: list) -> float:
    """Append (time, entry) for each request of one context that starts at ``start``; its end time."""
    last = start  # when its latest request fired (and, the server being instant, completed)
    ready = start  # not before: its sub-agents' end
    prev_t = None
    for e in entries:
        if e.subagents is not None:
            ready = max([ready, *(_schedule(sub, last, max_delay, timing, max_context, out)
                                  for sub in e.subagents)])
            prev_t = e.t
            continue
        if max_context and e.input_tokens > max_context:
            break  # the tester truncates the conversation here
        if prev_t is None:
            fire = ready  # a context's first request fires when it starts
        else:
            gap = e.think if timing == "think-only" and e.think is not None else max(0.0, e.t - prev_t)
            fire = max(ready, last + min(gap, max_delay))
        out.append((fire, e))
        last = ready = fire
        prev_t = e.t
    return max(last, ready)


def read_kvtester(docs, namespace_per_file: bool, block_tokens: int | None, users: int = KVTESTER_USERS,
                  max_delay: float = KVTESTER_MAX_DELAY, timing: str = "think-only", max_context: int = 0,
                  warm_tokens: int = 0) -> Trace:
    """kv-cache-tester conversations, ``docs`` an iterable of (path, document), merged on one timeline as
    the tester plays them (module docstring); ``warm_tokens``: the tester's warm prefix (module docstring)."""
    if timing not in KVTESTER_TIMINGS:
        raise TraceFormatError(f"unknown kv-cache-tester timing {timing!r} (known: {', '.join(KVTESTER_TIMINGS)})")
    if users < 0 or not max_delay >= 0:
        raise TraceFormatError("kv-cache-tester users and max delay must be >= 0")
    block = first = None
    offset = warm_blocks = 0
    slots = [(0.0, k) for k in range(users)]
    timed: list[tuple[float, int, int, str, int, list[int]]] = []
    for conv, (path, doc) in enumerate(docs):
        size = doc.get("block_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TraceFormatError(f"{path}: \"block_size\" must be a positive integer, not {size!r}")
        if block_tokens is not None and size != block_tokens:
            raise TraceFormatError(f"{path}: block_size {size} disagrees with --block-tokens {block_tokens}")
        if block is not None and size != block:
            raise TraceFormatError(f"{path}: block_size {size} disagrees with {first}'s {block}: "
                                   "replay files of one block size together")
        block, first = size, first or path
        root = _IdSpace()
        entries = _parse_context(doc["requests"], size, root, doc.get("hash_id_scope") == "global",
                                 f"{path}: requests")
        if conv == 0:
            warm_blocks = offset = warm_tokens // size  # ids 0 .. warm_blocks - 1: the shared prefix
        for space in _spaces(entries, root):  # each context's ids past all earlier ones': no collisions
            space.offset = offset
            offset += space.largest + 1
            if space.first:
                space.warm = min(warm_blocks, len(space.first), min(warm_tokens, space.first_tokens) // size)
        start, slot = heapq.heappop(slots) if users else (0.0, conv)
        fired: list[tuple[float, _Entry]] = []
        end = _schedule(entries, start, max_delay, timing, max_context, fired)
        if users:
            heapq.heappush(slots, (end, slot))
        ns = path.stem if namespace_per_file else DEFAULT_NS
        timed.extend((when, conv, seq, ns, e.input_tokens, e.space.moved(e.hash_ids))
                     for seq, (when, e) in enumerate(fired))
    timed.sort(key=lambda x: x[:3])
    requests = [Request(ns, n, hash_ids=ids, timestamp=when * 1000.0, serial=i)  # milliseconds, as Mooncake's
                for i, (when, _, _, ns, n, ids) in enumerate(timed)]
    return Trace("kvtester", requests, block or MOONCAKE_BLOCK)


def _spaces(entries: list[_Entry], root: _IdSpace) -> list[_IdSpace]:
    """The distinct id spaces of a file, in the order of the file (its own first)."""
    seen = {id(root): root}

    def visit(context: list[_Entry]) -> None:
        for e in context:
            if e.space is not None:
                seen.setdefault(id(e.space), e.space)
            for sub in e.subagents or ():
                visit(sub)

    visit(entries)
    return list(seen.values())
