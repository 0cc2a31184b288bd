"""What the tools share: their command line, progress bars, plots, where outputs go, a raw RESP connection.

Progress bars and plots are optional: without tqdm a bar is silent (the tools then print a plain
line where it matters), without matplotlib a plot is skipped with a note. Both come with the
``tools`` extra, which ``scripts/setup`` installs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from pfxcache.testing import encode_command

try:
    from tqdm import tqdm
except ImportError:  # progress bars fall back to silence (and plain lines where the tools print them)
    tqdm = None

# The checkout this package is installed from (editable, as scripts/setup does), and its ignored output folder.
ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("PFXCACHE_OUT") or ROOT / "scripts" / "out")


def tool_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``scripts/<name>``: the module docstring is its --help."""
    return argparse.ArgumentParser(prog=f"scripts/{name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def command_line(name: str, argv: list[str] | None = None) -> str:
    """The command as a user typed it, for the output and the plot titles: ``scripts/<name> ARGS``."""
    return " ".join([f"scripts/{name}", *(sys.argv[1:] if argv is None else argv)]).strip()


@contextlib.contextmanager
def guard_sample_pages(pages: int | None):
    """Within: every guard a store makes has miniatures of at most ``pages`` pages (None: the default).

    For tools that ask what the sample's size buys (``--guard-sample-pages``); the default is back after.
    """
    from pfxcache.daemon.store import guard

    default = guard.SAMPLE_PAGES
    if pages is not None:
        guard.SAMPLE_PAGES = pages  # read whenever a store makes its guard
    try:
        yield guard.SAMPLE_PAGES
    finally:
        guard.SAMPLE_PAGES = default


def _sample_pages(text: str) -> int:
    pages = int(text)
    if pages < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return pages


def add_guard_sample_pages(parser: argparse.ArgumentParser) -> None:
    """The ``--guard-sample-pages N`` option (N >= 1; for guard_sample_pages())."""
    from pfxcache.daemon.store import guard

    parser.add_argument("--guard-sample-pages", type=_sample_pages, metavar="N",
                        help=f"guard's miniatures hold at most N pages (default {guard.SAMPLE_PAGES}): "
                             "what the sample's size buys")


def machine() -> dict:
    """Where the figures come from."""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}


def timed_loop(fn, items: list, min_time: float) -> float:
    """Ops/s of fn(item) over items, cycling until min_time of CPU time has passed (the store benchmarks' loop)."""
    done = 0
    elapsed = 0.0
    while elapsed < min_time:
        start = time.process_time()
        for item in items:
            fn(item)
        elapsed += time.process_time() - start
        done += len(items)
    return done / elapsed


def shown(path: Path) -> Path:
    """A path as printed: relative to the checkout when inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


class SilentBar:
    """The progress bar when tqdm is missing or progress is off: every call does nothing."""

    disable = True

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: float, desc: str, unit: str, *, quiet: bool = False, **options: Any):
    """A tqdm bar on stderr, or a SilentBar (``bar.disable`` tells which)."""
    if quiet or tqdm is None:
        return SilentBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, **options)


def new_plot(figsize: tuple[float, float] = (8, 5)):
    """``(fig, ax)`` of a new figure on matplotlib's file backend, or None (with a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (the tools extra: scripts/setup): no plot", file=sys.stderr)
        return None
    return plt.subplots(figsize=figsize)


def save_plot(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class RespConnection:
    """One blocking RESP2 connection over TCP, replies decoded by hiredis (errors come back as values)."""

    def __init__(self, address: tuple[str, int], timeout: float = 60) -> None:
        import hiredis

        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.received = 0  # reply bytes read so far

    def reply(self) -> Any:
        while True:
            got = self.reader.gets()
            if got is not False:
                return got
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection before the reply")
            self.received += len(chunk)
            self.reader.feed(chunk)

    def call(self, *args: bytes | str | int) -> Any:
        self.sock.sendall(encode_command(*args))
        return self.reply()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RespConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pairs(reply: list) -> dict:
    """A RESP2 flat name/value array as a dict with str keys."""
    if isinstance(reply, Exception):
        raise RuntimeError(f"error reply: {reply}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in zip(reply[::2], reply[1::2])}
