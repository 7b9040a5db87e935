"""glibc's allocator, set for the large arrays a training step makes and frees.

A pretraining step allocates arrays of tens of megabytes (the softmax's
logits, the LSTM's saved gates) and frees them before the next step. glibc
serves such sizes by mapping fresh pages and unmaps them when they are freed,
so every step faults in and zeroes thousands of pages again (at
configs/bilm.cfg's sizes a sizeable share of the step: `python
benchmarks/pretrain_throughput.py`). Kept in the heap instead, freed arrays serve the next
step's. The price: the process holds on to its peak memory until it exits,
and arrays of many different sizes (measuring dev perplexity: batches of
every length) leave the heap in pieces that add up;
`release_freed_memory` gives what is free back between such batches.
"""

import ctypes
import ctypes.util
import functools
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # bytes: mallopt takes an int


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the OS (glibc's malloc_trim); False,
    doing nothing, where the C library is not glibc."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep
    what is freed for later allocations, for the rest of the process (see
    the module docstring). Returns False, changing nothing, where the C
    library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
