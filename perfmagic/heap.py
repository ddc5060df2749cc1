"""Freed memory given back to the OS, in processes perfmagic owns (``perfmagic report``), never the user's.

glibc's malloc serves a block at or above its mmap threshold with a mapping of its own, unmapped when
the block is freed; smaller blocks come from its heap, which keeps what is freed for reuse. The
threshold starts at 128 KiB, but rises to the size of each mapped block freed, up to 32 MiB. Reading a
large trace frees many arrays of a few MiB, so after the first one they all come from the heap and its
freed pages stay resident. Reading a 3.4 GB Nsight Systems capture peaked at 303 MB of RSS that way,
and at 265 MB with the threshold held at its starting value (``docs/benchmarks.md``).

Holding the threshold is a setting of the whole process, and it makes a program that allocates and frees
large blocks often map memory more often; so only commands that own their process hold it.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameter number for the threshold (glibc's ``malloc.h``)."""
THRESHOLD_BYTES = 128 * 1024
"""glibc's own starting threshold: set, it no longer rises."""


def hold_mmap_threshold() -> bool:
    """Keep malloc's mmap threshold at its starting value in this process; False where the C library
    has no such setting (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES))
