"""Memory tuning of the daemon's process: the garbage collector paused and frozen around a
cycle (:func:`collector_paused`), glibc's allocator told to return free pages
(:func:`release_free_memory`) and to map large blocks apart (:func:`map_large_blocks`).
Nothing here decides what a cycle does; each call is a no-op where its facility is missing
(a libc without ``malloc_trim``/``mallopt``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from contextlib import contextmanager


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


_LIBC = _libc()
FULL_COLLECTION_EVERY = 60  # cycles between full passes over frozen objects
FEW_NEW_OBJECTS = 100_000  # a block that leaves fewer is collected at its end (a short pass)


class _Frozen:
    """About how many tracked objects :func:`collector_paused` froze: counted exactly only at a
    full collection (``gc.get_freeze_count()`` walks them all),
    else grown by each block's net new objects. Frozen objects freed later lower a later
    block's net count; where that count stopped at zero the sum runs high, which errs
    towards collecting."""

    objects = 0


@contextmanager
def collector_paused(full: bool = False) -> Iterator[None]:
    """Run the block without garbage-collector passes, then collect its cyclic garbage once and
    move every surviving object out of the collector's reach (``gc.freeze``).

    The model a daemon holds (a million replicas, their names, the site views) lives for many
    cycles and holds no reference cycles, yet the collector's passes over it while a cycle
    allocated cost seconds per cycle and found nothing. Frozen objects are still
    freed by reference counting when a later cycle drops them; the one collection scans only
    what is not frozen yet (the block's allocations). A cycle of objects that outlived a block
    and was dropped later is not seen while frozen: with ``full`` (every
    ``FULL_COLLECTION_EVERY`` cycles) everything is unfrozen and collected once.

    A block that leaves at least ``FEW_NEW_OBJECTS`` new objects the collector tracks, and
    more than were frozen before it, built most of the model (a startup that loads the state,
    a first cycle): it is frozen without that collection, which would scan the whole new
    model to find a few hundred objects (a first cycle's: rucio-clients' configuration
    parsers); its cyclic garbage waits for the next full collection (the costs:
    docs/performance.md)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        young = gc.get_count()[0]  # net new tracked objects since the last freeze
        if full:
            gc.unfreeze()
            gc.collect()
        elif young < FEW_NEW_OBJECTS or young <= _Frozen.objects:
            gc.collect()
        gc.freeze()
        _Frozen.objects = gc.get_freeze_count() if full else _Frozen.objects + young
        release_free_memory()


def release_free_memory() -> None:
    """Give the C allocator's free pages back to the system (glibc ``malloc_trim``; nothing
    elsewhere). A cycle's transient buffers (answers of megabytes, parsed chunks) are freed in
    the fetch thread's own malloc arena, which otherwise keeps them: at 100k replicas a third
    of the process's resident memory."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed
M_ARENA_MAX = -8  # glibc <malloc.h>
ARENAS = 1  # one malloc arena for every thread (glibc's default: 8 per core)


def map_large_blocks() -> None:
    """Keep glibc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` (``mallopt(M_MMAP_THRESHOLD)``;
    nothing elsewhere): a block that large which free heap space cannot serve gets a mapping
    of its own, unmapped when freed, instead of growing the heap.

    By default glibc raises that threshold each time such a block is freed, up to 32 MiB, and
    the heap's trim threshold with it (mallopt(3): setting either stops the adjustment). The
    tables a cycle copies and drops (indexes, sets, answers, lists) then
    grow a heap that stays resident between cycles; fixing it lowers the peak RSS
    (docs/performance.md).

    Also one arena for all threads (``mallopt(M_ARENA_MAX)``, as ``MALLOC_ARENA_MAX=1``
    does): a source fetches in a thread of its own, whose arena would keep the cycle's freed
    answers and parse buffers apart from the main one's free space until ``malloc_trim``.
    Threads here take turns under the GIL, so they gain nothing from arenas of their own."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        _LIBC.mallopt(M_ARENA_MAX, ARENAS)
