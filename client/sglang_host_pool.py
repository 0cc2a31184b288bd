"""Where a page of SGLang's host KV pool sits in host memory, for HiCache's zero-copy v1 calls.

SGLang's ``get_page_buffer_meta`` gives each page's pieces as raw addresses (K and V for MHA
``page_first``, one per layer and kind for ``layer_first``). A storage page is SGLang's flat data page,
the pieces in ``get_data_page(flat=True)``'s order, so each piece has one place in a block.

Rules: the plan of pieces is read once, from page 0, and is used only when the pieces tile the flat
page exactly; otherwise (or for a pool without pieces) copies go through ``get_data_page`` /
``set_from_flat_data_page``. Copies reach a piece through a numpy view of the pool's own tensor that
holds it, never a pointer cast, unless no tensor of the pool spans the piece.
"""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .arena import readable_bytes, writable_bytes

Sink = Callable[[int, np.ndarray], None]  # page i's bytes -> where SGLang wants them
Source = Callable[[int, np.ndarray], None]  # page i's bytes <- from SGLang, into a block


class HostPages:
    """Where a storage page's bytes sit in SGLang's host pool, for the v1 calls.

    ``get_page_buffer_meta`` gives each page's pieces (K and V for MHA ``page_first``, one per layer and
    kind for ``layer_first``); their order in the flat data page is read once, from page 0's
    addresses, and the copies then reach each piece through numpy views of the pool's own tensors.
    A pool whose pieces do not tile its flat page goes through ``get_data_page`` /
    ``set_from_flat_data_page`` instead.
    """

    def __init__(self, pool: Any, page_bytes: int) -> None:
        self.pool = pool
        self.page_size = int(pool.page_size)
        self.plan = _piece_plan(pool, page_bytes)  # [(piece number, offset in page, bytes)] or None
        self._regions = _regions(pool) if self.plan is not None else []
        self._starts = [start for start, _, _ in self._regions]

    def _view(self, address: int, size: int) -> np.ndarray:
        at = bisect.bisect_right(self._starts, address) - 1
        if at >= 0:
            start, end, array = self._regions[at]
            if address + size <= end:
                return array[address - start:address - start + size]
        return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))

    def pages(self, host_indices: Any, n: int) -> list[list[tuple[int, np.ndarray]]] | None:
        """Per page: (offset in the page, the host memory it comes from / goes to); None: use flat pages."""
        if self.plan is None:
            return None
        pointers, _ = self.pool.get_page_buffer_meta(host_indices)
        per_page = len(pointers) // n
        return [[(offset, self._view(pointers[i * per_page + j], size)) for j, offset, size in self.plan]
                for i in range(n)]

    def sink(self, host_indices: Any, n: int) -> Sink:
        pages = self.pages(host_indices, n)
        if pages is not None:
            def into_pool(i: int, row: np.ndarray) -> None:
                for offset, dest in pages[i]:
                    np.copyto(dest, row[offset:offset + dest.size])
            return into_pool
        page = self.pool.get_dummy_flat_data_page()

        def into_flat(i: int, row: np.ndarray) -> None:
            np.copyto(writable_bytes(page), row)
            self.pool.set_from_flat_data_page(int(host_indices[i * self.page_size]), page)
        return into_flat

    def source(self, host_indices: Any, n: int) -> Source:
        pages = self.pages(host_indices, n)
        if pages is not None:
            def from_pool(i: int, row: np.ndarray) -> None:
                for offset, src in pages[i]:
                    np.copyto(row[offset:offset + src.size], src)
            return from_pool

        def from_flat(i: int, row: np.ndarray) -> None:
            np.copyto(row, readable_bytes(self.pool.get_data_page(int(host_indices[i * self.page_size]), flat=True)))
        return from_flat


def _runs(view: torch.Tensor) -> list[tuple[int, int]]:
    """(address, bytes) of the contiguous runs of a strided tensor, in its flattened order."""
    if view.is_contiguous():
        return [(view.data_ptr(), view.numel() * view.element_size())]
    return [run for i in range(view.shape[0]) for run in _runs(view[i])]


def _piece_plan(pool: Any, page_bytes: int) -> list[tuple[int, int, int]] | None:
    """For each piece of a page (get_page_buffer_meta's order): its place in the flat page; None when
    the pieces do not tile the flat page exactly."""
    try:
        pointers, sizes = pool.get_page_buffer_meta(torch.arange(int(pool.page_size), dtype=torch.int64))
        runs = _runs(pool.get_data_page(0, flat=False))
    except Exception:  # a pool without pieces (or not for index 0): its flat pages then
        return None
    if not pointers or not all(isinstance(p, int) for p in pointers):
        return None
    table, logical = [], 0
    for address, size in runs:
        table.append((address, size, logical))
        logical += size
    placed = []
    for number, (address, size) in enumerate(zip(pointers, sizes)):
        spot = next((off + address - run for run, length, off in table
                     if run <= address and address + size <= run + length), None)
        if spot is None:
            return None
        placed.append((spot, int(size), number))
    placed.sort()
    at = 0
    for offset, size, _ in placed:
        if offset != at:
            return None
        at += size
    if at != page_bytes or logical != page_bytes:
        return None
    return [(number, offset, size) for offset, size, number in placed]


def _regions(pool: Any) -> list[tuple[int, int, np.ndarray]]:
    """(start, end, uint8 view) of the pool's host tensors, sorted, none inside another."""
    found = []
    for value in vars(pool).values():
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and tensor.is_contiguous() \
                    and tensor.numel():
                size = tensor.numel() * tensor.element_size()
                found.append((tensor.data_ptr(), size, tensor))
    regions: list[tuple[int, int, np.ndarray]] = []
    for start, size, tensor in sorted(found, key=lambda r: (r[0], -r[1])):
        if regions and start + size <= regions[-1][1]:
            continue  # a view inside a tensor already taken
        regions.append((start, start + size, tensor.detach().reshape(-1).view(torch.uint8).numpy()))
    return regions
