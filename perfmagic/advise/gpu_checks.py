"""Nsight Systems' expert checks that no other card makes: synchronous copies and memsets, GPU gaps.

Its other checks are cards already: asynchronous copies from pageable memory are ``pin_memory``,
blocking synchronization calls ``sync_logging``, low GPU utilization ``low_gpu_util``. These read the
``gpu`` section of a trace or capture (``blocking_copies``, ``gaps``), so they fire on traced runs only.
"""

from __future__ import annotations

from perfmagic.advise.card import Card, make_card
from perfmagic.advise.gpu import LOW_UTIL, STAGE_FIX
from perfmagic.analyze import Analysis
from perfmagic.schema import COMPUTE_STAGES
from perfmagic.units import fmt_fraction, fmt_seconds

SYNC_COPY_SHARE = 0.02
"""The host's time in synchronous copies and memsets worth a card, as a share of the step (Nsight flags
any; below this an asynchronous copy saves less than a card's minor saving)."""
GAP_SHARE = 0.10
"""GPU starvation gaps worth a card, as a share of the traced time."""


def sync_copies(a: Analysis) -> Card | None:
    """Synchronous ``cudaMemcpy`` and ``cudaMemset`` calls: each waits for all the GPU work queued before it."""
    s = a.steady
    calls = a.gpu["blocking_copies"] if a.gpu else None
    if s is None or not calls or calls["time_per_step_s"] < SYNC_COPY_SHARE * s.step_s:
        return None
    spent, step = calls["time_per_step_s"], s.step_s
    counts = (
        (calls["memcpy_per_step"], "synchronous copies"),
        (calls["memset_per_step"], "synchronous memsets"),
    )
    said = [f"{n:.1f} {what} per step" for n, what in counts if n > 0]
    fix = "\n".join(
        [
            "# values for the host: keep them on the GPU, read them once in a while",
            "running_loss += loss.detach()",
            "# batches for the GPU: pinned memory, queued without waiting",
            "batch = batch.pin_memory().to(device, non_blocking=True)",
            "# buffers to clear: allocate once before the loop, zero them on the GPU's stream",
            "buffer.zero_()",
        ]
    )
    return make_card(
        "sync_copies",
        "Synchronous copies and memsets make the host wait for the GPU",
        f"In the GPU trace, {' and '.join(said)} held the host {fmt_seconds(spent)} of a {fmt_seconds(step)} "
        f"step ({fmt_fraction(spent / step)}): a cudaMemcpy or cudaMemset returns only when the GPU has run "
        "it, after everything queued before it, so the host cannot queue the next work meanwhile.",
        fix,
        {
            "memcpy_per_step": calls["memcpy_per_step"],
            "memset_per_step": calls["memset_per_step"],
            "blocking_s": spent,
        },
        saving_s=spent,
        step_s=step,
        model="the host's time in those calls, which asynchronous copies overlap with the GPU's work "
        "(an upper bound: a value the host needs is still waited for, once)",
    )


def gpu_gaps(a: Analysis) -> Card | None:
    """Long stretches in which the GPU ran nothing while it was otherwise busy (a low busy share is
    ``low_gpu_util``'s, which names the gaps too)."""
    s = a.steady
    gaps = a.gpu["gaps"] if a.gpu else None
    busy = a.gpu["busy_fraction"] if a.gpu else None
    share = gaps["fraction"] if gaps else None
    if s is None or not gaps or share is None or share < GAP_SHARE or busy is None or busy < LOW_UTIL:
        return None
    host = {n: s.stage_s(n) for n in s.stages if n not in COMPUTE_STAGES}
    worst = max(host, key=lambda n: host[n]) if host else None
    lead = f"; the largest non-compute stage is {worst}" if worst and host[worst] > 0 else ""
    fix = STAGE_FIX.get(
        worst or "",
        "# the host stalls between steps: overlap its work with the GPU's\n"
        "loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=4, pin_memory=True)",
    )
    return make_card(
        "gpu_gaps",
        f"The GPU starves: {gaps['count']} gaps of {fmt_seconds(gaps['min_s'])} or more",
        f"In the GPU trace, the GPU ran nothing {gaps['count']} times for {fmt_seconds(gaps['min_s'])} or more "
        f"(longest {fmt_seconds(gaps['longest_s'])}), {fmt_fraction(share)} of the traced time, while it was "
        f"busy {fmt_fraction(busy)} overall{lead}.",
        fix,
        {
            "gaps": gaps["count"],
            "gap_share": share,
            "longest_gap_s": gaps["longest_s"],
            "top_host_stage": worst,
        },
        saving_s=s.step_s * share,
        step_s=s.step_s,
        model="the gaps' share of the traced time, if the host's work in them overlapped the GPU's "
        "(an upper bound: the GPU had nothing queued)",
    )
