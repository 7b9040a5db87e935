"""glibc's allocator, set for the large arrays a training step makes and frees:
glibc would unmap them when freed and fault fresh pages in at every step
(`benchmarks/pretrain_throughput.py`). Kept in the heap, they serve the next
step's; `release_freed_memory` gives the heap back between dev batches.
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
