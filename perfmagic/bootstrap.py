"""Profiling of an interpreter started with perfmagic's ``sitecustomize`` (``perfmagic.children``)
from its start until it exits, with no change to its code: :func:`start_from_env`."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from perfmagic.children import FULL_ENV, INTERVAL_ENV, RUN_DIR_ENV, TRACE_ENV, TUNE_ENV
from perfmagic.collect.worker_load import WorkerLoadSource
from perfmagic.session import Session


def is_helper_process() -> bool:
    """A multiprocessing service process (forkserver, resource tracker): never a rank.

    Those start as ``python -c "from multiprocessing.<module> import main ..."``.
    Spawned children (``spawn_main``) are profiled: ``torch.multiprocessing.spawn``
    starts ranks that way; a spawned DataLoader worker records no step, and the
    report leaves such processes out of the ranks.
    """
    argv = getattr(sys, "orig_argv", sys.argv)
    return any(arg.startswith("from multiprocessing.") and "spawn_main" not in arg for arg in argv)


def start_from_env() -> None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir or is_helper_process():
        return
    session = Session(
        interval=float(os.environ.get(INTERVAL_ENV, "0.1")),
        outdir=Path(run_dir) / f"proc-{os.getpid()}",
        # the perfmagic run process samples the hardware for the whole tree; this one, what only it can
        # see: the training thread's stack and the DataLoader workers' own timing and stacks
        sources=[WorkerLoadSource()],
        source="run",
        trace=int(os.environ.get(TRACE_ENV, "0")),
        tune=TUNE_ENV in os.environ,
        full=FULL_ENV in os.environ,
        tune_budget=float(os.environ[TUNE_ENV]) if os.environ.get(TUNE_ENV) else None,
    )
    session.start()
    atexit.register(_finish, session)
    handled = threading.Event()
    ours = []
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:  # the program's own handlers stay its own
            with contextlib.suppress(ValueError):  # not the main thread of the main interpreter
                signal.signal(sig, _ended_by(session, handled))
                ours.append(sig)
    if ours:
        _watch_for_a_stuck_main_thread(session, frozenset(ours), handled)


ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a process by default: its record is finished first, then it ends as it would have."""


STUCK_AFTER_S = 3.0
"""How long an ending signal may wait for the main thread before it is taken as stuck in native code."""


def _ended_by(session: Session, handled: threading.Event) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        handled.set()
        _finish(session)
        _die(signum)

    return handler


def _watch_for_a_stuck_main_thread(session: Session, ours: frozenset[int], handled: threading.Event) -> None:
    """A Python signal handler runs only when the main thread is back in the interpreter: one stuck in
    native code (a thread join in a library's destructor) would make SIGTERM, which ended it before
    perfmagic, do nothing at all. Python writes each signal's number to a wakeup fd as it arrives; a
    thread reads it and, if the handler has not run within :data:`STUCK_AFTER_S`, writes what the spool
    lacks and ends the process with the status the signal would have given (128 + its number)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        previous = None
    if previous != -1:  # the program's own wakeup fd (or none could be set): leave it as it is
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return

    def forget_in_child() -> None:  # a forked child's signals are its own, not this process's
        with contextlib.suppress(ValueError, OSError):
            if signal.set_wakeup_fd(-1) != write_fd:
                signal.set_wakeup_fd(-1)

    os.register_at_fork(after_in_child=forget_in_child)

    def watch() -> None:
        while True:
            try:
                received = os.read(read_fd, 64)
            except OSError:
                return
            if not received:
                return
            ending = [n for n in received if n in ours]
            if ending and not handled.wait(STUCK_AFTER_S):
                with contextlib.suppress(Exception):
                    sys.stderr.write(
                        f"perfmagic: signal {ending[0]} found the main thread stuck in native code for "
                        f"{STUCK_AFTER_S:.0f} s; ending the process with its record as spooled\n"
                    )
                    sys.stderr.flush()
                    session.flush_spool()
                os._exit(128 + ending[0])

    threading.Thread(target=watch, name="perfmagic-signals", daemon=True).start()


def _finish(session: Session) -> None:
    try:
        session.end_record()  # perfmagic run builds the report from the records: none is built here
    except Exception as e:
        sys.stderr.write(f"perfmagic: could not finish this process's profile ({e!r}); its spool is kept\n")
    if getattr(sys, "last_type", None) is KeyboardInterrupt:
        # An uncaught Ctrl-C ends Python with SIGINT (exit status 130), but only if no code ran after it:
        # finishing the record did, so end the way Python would have.
        _die(signal.SIGINT)


def _die(signum: int) -> None:
    """End this process by the signal ``signum``, as its default action does (the last atexit step)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
