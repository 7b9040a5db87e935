"""glibc's allocator, set for the large arrays a training step makes and frees.

A pretraining step allocates arrays of tens of megabytes (the softmax's
logits, the LSTM's saved gates) and frees them before the next step. glibc
maps fresh pages for such sizes and unmaps them when freed, so every step
faults in and zeroes thousands of pages again (a sizeable share of the step:
`python benchmarks/pretrain_throughput.py`). Kept in the heap instead, freed
arrays serve the next step's. The price: the process holds on to its peak
memory, and arrays of many sizes (dev perplexity's batches) leave the heap
in pieces, which `release_freed_memory` gives back between such batches.
"""

import ctypes
import ctypes.util
import functools
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # bytes: mallopt takes an int


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the OS (malloc_trim); False,
    doing nothing, where the C library is not glibc."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def keep_freed_memory() -> bool:
    """Have malloc serve every allocation from its heap and keep what is freed,
    for the rest of the process; False, changing nothing, without glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
