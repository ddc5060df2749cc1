"""What tuning must leave exactly as it found: the random streams and the thread count."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def untouched() -> Iterator[None]:
    """Restore Python's, numpy's and torch's random states (CUDA's on every device) and torch's
    intra-op thread count, however the block ends: the user's next step draws what it would have."""
    py_state = random.getstate()
    np_mod: Any = sys.modules.get("numpy")
    np_state = np_mod.random.get_state() if np_mod is not None else None
    torch: Any = sys.modules.get("torch")
    torch_state = torch.get_rng_state() if torch is not None else None
    cuda_states = (
        torch.cuda.get_rng_state_all()
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    threads = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(py_state)
        if np_state is not None:
            np_mod.random.set_state(np_state)
        if torch is not None:
            torch.set_rng_state(torch_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
            if threads is not None and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
