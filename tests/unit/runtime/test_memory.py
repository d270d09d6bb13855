"""The process's memory around a cycle (:mod:`hydrator.runtime.memory`): large blocks
mapped apart, one malloc arena for every thread, the garbage collector paused during a cycle
and run after it. Each probe runs in a fresh interpreter."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

_MALLOC_PROBE = """
import ctypes
from hydrator.runtime.memory import map_large_blocks

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks".split()
                + "uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if MAP:
    map_large_blocks()
big = bytearray(16 << 20)
del big  # freed: raises glibc's dynamic mmap threshold to 16 MiB, unless it is fixed
mapped = libc.mallinfo2().hblkhd
block = bytearray(4 << 20)
print(libc.mallinfo2().hblkhd - mapped)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc < 2.33")
def test_a_large_block_is_mapped_even_after_a_larger_one_was_freed() -> None:
    """glibc would raise its mmap threshold past a freed 16 MiB block and grow the heap for
    the next 4 MiB table, where it stays resident once freed; the service keeps the block a
    mapping of its own (returned to the system when freed). In a fresh interpreter, whose
    heap has no free 4 MiB to reuse."""

    def mapped_bytes(fixed: bool) -> int:
        code = _MALLOC_PROBE.replace("MAP", str(fixed))
        command = [sys.executable, "-c", code]
        found = subprocess.run(command, check=False, capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
        return int(found.stdout)

    assert mapped_bytes(fixed=True) >= 4 << 20
    assert mapped_bytes(fixed=False) == 0  # what the fix is for: glibc's own default


_ARENA_PROBE = """
import ctypes, threading
from hydrator.runtime.memory import map_large_blocks

if MAP:
    map_large_blocks()
held = []
thread = threading.Thread(target=lambda: held.extend(bytearray(64 << 10) for _ in range(64)))
thread.start()
thread.join()
ctypes.CDLL(None).malloc_stats()  # to stderr: one "Arena N:" block per arena
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_stats"), reason="not glibc")
def test_a_fetch_thread_allocates_from_the_main_arena() -> None:
    """What a thread (a source's fetch) allocates comes from the one arena the process keeps,
    where the next cycle reuses it, not from an arena of its own that keeps its freed space
    apart. In a fresh interpreter: 4 MiB made in a thread."""

    def arenas(fixed: bool) -> int:
        code = _ARENA_PROBE.replace("MAP", str(fixed))
        command = [sys.executable, "-c", code]
        found = subprocess.run(command, check=False, capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
        return sum(line.startswith("Arena ") for line in found.stderr.splitlines())

    assert arenas(fixed=True) == 1
    assert arenas(fixed=False) == 2  # glibc's default: the thread got an arena of its own


_COLLECTION_PROBE = """
import gc
import weakref
from hydrator.runtime.memory import FEW_NEW_OBJECTS, collector_paused

class Node:
    pass

def cyclic_garbage():
    node = Node()
    node.self = node
    return weakref.ref(node)

with collector_paused():  # the interpreter's own objects frozen, as after a startup
    pass
with collector_paused():  # a churn cycle: a few new objects
    small = cyclic_garbage()
print(small() is None)
with collector_paused():  # a first cycle: more new objects than were frozen (the model)
    model = [[i] for i in range(FEW_NEW_OBJECTS + gc.get_freeze_count())]
    big = cyclic_garbage()
print(big() is None)
with collector_paused(full=True):  # the periodic full collection
    pass
print(big() is None)
with collector_paused():  # a large churn cycle: many new objects, fewer than the model's
    churn = [[i] for i in range(FEW_NEW_OBJECTS)]
    large = cyclic_garbage()
print(large() is None)
"""


def test_cyclic_garbage_is_collected_after_the_cycle_or_at_the_next_full_collection() -> None:
    """A cycle's cyclic garbage is collected at its end, unless the cycle built many more new
    objects than were kept from before (a first cycle, which would scan its whole new model
    for it); then the periodic full collection does. In a fresh interpreter, whose frozen
    objects are the probe's alone."""
    command = [sys.executable, "-c", _COLLECTION_PROBE]
    found = subprocess.run(command, check=False, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["True", "False", "True", "True"]
