"""glibc's allocator, set for the large arrays a training step makes and frees.

A pretraining step allocates arrays of tens of megabytes (the softmax's
logits, the LSTM's saved gates) and frees them before the next step. glibc
serves such sizes by mapping fresh pages and unmaps them when they are freed,
so every step faults in and zeroes thousands of pages again: at
configs/bilm.cfg's sizes, several thousand page faults a step, a tenth of the
bfloat16 step's time. Kept in the heap instead, freed arrays serve the next
step's. The price: the process holds on to its peak memory until it exits.
"""

import ctypes
import ctypes.util
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # bytes: mallopt takes an int


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep
    what is freed for later allocations, for the rest of the process (see
    the module docstring). Returns False, changing nothing, where the C
    library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
