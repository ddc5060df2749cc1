"""Map process IDs to this server's kernels and the notebooks they run.

``refresh`` runs on the IO loop (the session manager is async); ``kernel_for`` runs on the sampler
thread and only reads the maps that ``refresh`` swaps in whole, so no lock is needed.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import psutil

Json = dict[str, Any]

# A GPU process is often not the kernel itself but its child: a DataLoader worker,
# or `!python train.py` started through a shell. Walk this many parents at most.
MAX_PARENT_DEPTH = 8

log = logging.getLogger(__name__)


class KernelIndex:
    """Which kernel (and notebook) a PID belongs to, by kernel PID or connection file."""

    def __init__(self, kernel_manager: Any = None, session_manager: Any = None) -> None:
        self._kernel_manager = kernel_manager
        self._session_manager = session_manager
        self._by_pid: dict[int, Json] = {}
        self._by_connection_file: dict[str, Json] = {}

    async def refresh(self) -> None:
        """Rebuild the maps from the kernel and session managers."""
        km = self._kernel_manager
        if km is None:
            return
        sessions: dict[str, Json] = {}
        if self._session_manager is not None:
            try:
                for s in await self._session_manager.list_sessions():
                    kernel = s.get("kernel") or {}
                    if kernel.get("id"):
                        sessions[kernel["id"]] = s
            except Exception:
                log.debug("perfmagic: listing sessions failed", exc_info=True)
        by_pid: dict[int, Json] = {}
        by_cf: dict[str, Json] = {}
        for kid in list(km.list_kernel_ids()):
            try:
                kernel = km.get_kernel(kid)
                info = kernel_info(kid, kernel, sessions.get(kid))
                pid = kernel_pid(kernel)
                cf = getattr(kernel, "connection_file", None)
            except Exception:  # shut down meanwhile, or a kernel manager we don't know
                log.debug("perfmagic: reading kernel %s failed", kid, exc_info=True)
                continue
            if pid is not None:
                by_pid[pid] = info
            if cf:
                by_cf[os.path.basename(cf)] = info
        self._by_pid, self._by_connection_file = by_pid, by_cf

    def kernel_for(self, pid: int) -> Json | None:
        """The kernel that is ``pid`` or one of its ancestors, else None."""
        by_pid, by_cf = self._by_pid, self._by_connection_file
        if not by_pid and not by_cf:
            return None
        try:
            proc: psutil.Process | None = psutil.Process(pid)
            for _ in range(MAX_PARENT_DEPTH):
                if proc is None or proc.pid <= 1:
                    break
                if proc.pid in by_pid:
                    return by_pid[proc.pid]
                found = _by_cmdline(proc, by_cf)
                if found is not None:
                    return found
                proc = proc.parent()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
        return None


def _by_cmdline(proc: psutil.Process, by_cf: dict[str, Json]) -> Json | None:
    """Kernels whose PID we don't know (e.g. started through a wrapper) still name their
    connection file on the command line."""
    if not by_cf:
        return None
    try:
        args = proc.cmdline()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return None
    for arg in args:
        hit = by_cf.get(os.path.basename(arg.split("=", 1)[-1]))
        if hit is not None:
            return hit
    return None


def kernel_pid(kernel: Any) -> int | None:
    """The local kernel's PID, from its provisioner (jupyter_client >= 7) or its Popen."""
    provisioner = getattr(kernel, "provisioner", None)
    for obj in (provisioner, getattr(provisioner, "process", None)):
        pid = getattr(obj, "pid", None)
        if isinstance(pid, int) and pid > 0:
            return pid
    return None


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def kernel_info(kid: str, kernel: Any, session: Json | None) -> Json:
    """What the sidebar shows about a kernel: ids, kernelspec, state and notebook path."""
    path = session.get("path") if session else None
    if path and _UUID.fullmatch(os.path.basename(path)) and session and session.get("name"):
        # JupyterLab may open a notebook's session under a unique id path; its name is the notebook's
        path = os.path.join(os.path.dirname(path), str(session["name"]))
    return {
        "id": kid,
        "name": getattr(kernel, "kernel_name", None),
        "execution_state": getattr(kernel, "execution_state", None),
        "session_id": session.get("id") if session else None,
        "session_type": session.get("type") if session else None,
        "path": path,
        "notebook": os.path.basename(path) if path else None,
    }
