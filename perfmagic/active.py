"""The one session profiling this process: claimed when it starts, released when it ends.

A child forked while profiling (multiprocessing's fork start method, ``os.fork``) must not write into
the parent's record: the hook registered here, once on import, tells the child's copy of the session
to record nothing (it does nothing unless a session is active).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfmagic.session import Session

_lock = threading.Lock()
_active: Session | None = None


def active_session() -> Session | None:
    """The session profiling this process right now, if any."""
    return _active


def claim(session: Session) -> None:
    """Make ``session`` the active one; RuntimeError while another is."""
    global _active
    with _lock:
        if _active is not None:
            raise RuntimeError(
                "perfmagic is already profiling in this process; nested profiles are not supported"
            )
        _active = session


def release() -> Session | None:
    """No session is active any more; the one that was, if any."""
    global _active
    with _lock:
        session, _active = _active, None
    return session


def _after_fork_in_child() -> None:
    session = release()
    if session is not None:
        session._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
