"""What tuning must leave exactly as it found (the random streams, the thread count), and what it needs
of torch at interpreter exit."""

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


@contextmanager
def workers_stoppable() -> Iterator[None]:
    """Let DataLoaders shut their workers down while tuning runs in an atexit handler.

    ``perfmagic run`` ends each process's profile at exit, after torch's own atexit hook has marked
    Python as exiting; from then on a DataLoader iterator skips shutting down its workers, so each
    loader tried would leave its worker processes running and their pids registered (a later
    iterator at the same address then fails to start). Exit handlers run before modules are torn
    down, so the workers can still be stopped: the mark is lifted for the tuning and put back.
    """
    utils: Any = sys.modules.get("torch.utils.data._utils")
    if utils is None or getattr(utils, "python_exit_status", None) is not True:
        yield
        return
    utils.python_exit_status = False
    try:
        yield
    finally:
        utils.python_exit_status = True
