"""The ``comm`` stage of torch loops: ``torch.distributed`` collectives, and the process's rank.

Inside backward, DDP's wait for its gradient reduction is ``comm`` too: ``collect.ddp`` times it.
"""

from __future__ import annotations

import functools
from typing import Any

from perfmagic.collect.patching import Patcher
from perfmagic.collect.recorder import StageRecorder
from perfmagic.collect.tracebacks import drop_own_frame

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "send",
    "recv",
    "monitored_barrier",
)


def install_comm(torch: Any, rec: StageRecorder, p: Patcher) -> None:
    """Time the collectives as ``comm``; note the rank once ``init_process_group`` has given one."""
    if not torch.distributed.is_available():
        return
    dist = torch.distributed
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None:
            p.set(dist, name, rec.wrap(fn, "comm"))
    init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            result = init(*args, **kwargs)
            note_rank(dist, rec)
            return result
        except BaseException as e:
            drop_own_frame(e)
            raise

    p.set(dist, "init_process_group", functools.wraps(init)(init_process_group))


def note_rank(dist: Any, rec: StageRecorder) -> None:
    """The process's rank where its environment did not say (``torch.multiprocessing.spawn`` workers pass
    it to ``init_process_group``): the rank in the report is the job's, not an order of processes."""
    meta = rec.timeline.meta
    if meta.get("rank") is None and dist.is_initialized():
        meta["rank"], meta["world_size"] = dist.get_rank(), dist.get_world_size()
