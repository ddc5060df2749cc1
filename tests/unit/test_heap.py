"""perfmagic's own commands hold glibc's mmap threshold, so a large trace's freed arrays leave the RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A process that frees a 16 MiB block, then asks for 1 MiB: prints whether it held the threshold and
# how many blocks malloc mapped for that 1 MiB (glibc's ``mallinfo2().hblks``).
SCRIPT = """
import ctypes, sys
from perfmagic.heap import hold_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
held = sys.argv[1] == "hold" and hold_mmap_threshold()
libc.free(libc.malloc(16 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
print(held, libc.mallinfo2().hblks - before)
"""


def mapped_after_a_large_free(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip(f"not glibc with mallinfo2: {out.stderr.strip().splitlines()[-1]}")
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_held_threshold_keeps_mapping_blocks_a_large_free_would_have_put_on_the_heap() -> None:
    assert mapped_after_a_large_free("default") == "False 0"  # the threshold rose to 16 MiB
    assert mapped_after_a_large_free("hold") == "True 1"
