"""What the text and HTML reports both say, worded once: the savings, the hot lines, the plan, the
evaluation passes, the memory peak, where the report comes from, and the order of the ranks' stages."""

from __future__ import annotations

from perfmagic.advise.headline import cause_card_title
from perfmagic.contract import Card, Host, Rank, ReportData
from perfmagic.render.energy import energy_saving_words
from perfmagic.schema import MEMORY_NAME, STAGES, memory_kind
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_seconds


def most_to_gain(report: ReportData) -> str | None:
    """Why the first card is not about the largest stage, when it is not: it saves the most."""
    from perfmagic.advise.catalog import STAGE_OF

    advice, bottleneck = report["advice"], report["bottleneck"]
    if not advice or not bottleneck or not advice[0]["saving_s"]:
        return None
    top = advice[0]
    if (
        bottleneck in STAGE_OF.get(top["id"], "").split()
        or cause_card_title(report, bottleneck) == top["title"]
    ):
        return None  # about the bottleneck, or the bottleneck's cause the headline names
    return f"most to gain elsewhere: {top['title']} (saves ~{fmt_seconds(top['saving_s'])} per step)"


def saving_words(card: Card) -> str:
    """What fixing a card gains, in words: per step and as a speed-up, or once."""
    metrics = card["metrics"]
    once = metrics.get("one_time_s")
    if once:
        return f"one-time cost ~{fmt_seconds(once)}"
    parts = []
    if card["saving_s"]:
        parts.append(f"saves ~{fmt_seconds(card['saving_s'])} per step")
    speedup = card["speedup"]
    if speedup:
        parts.append(f"~{speedup:.2g}× faster" if speedup >= 1.1 else f"~{(speedup - 1) * 100:.0f}% faster")
    interval = metrics.get("saving_interval_s")
    if metrics.get("uncertain") and interval:
        parts.append(
            f"uncertain: {fmt_seconds(interval[0])}–{fmt_seconds(interval[1])} (p10–p90 of the steps)"
        )
    alone, saving = metrics.get("saving_alone_s"), card["saving_s"]
    if alone and saving is not None and alone > 1.05 * saving:
        parts.append(f"{fmt_seconds(alone)} on its own, less after the changes above")
    energy = energy_saving_words(card)
    if energy:
        parts.append(energy)
    return ", ".join(parts)


def plan_line(report: ReportData) -> str | None:
    """The plan's predicted step, where more than one change saving time makes it, and what its memory
    changes free and cost."""
    plan = report["plan"]
    if not plan:
        return None
    freed = [c for c in plan["changes"] if c["freed_bytes"] is not None]
    timed = len(plan["changes"]) - len(freed)
    memory = (
        f"the memory changes free {fmt_bytes(sum(c['freed_bytes'] or 0 for c in freed))} and cost "
        f"{fmt_seconds(0.0 - sum(c['saving_s'] for c in freed))} per step"
        if freed
        else ""
    )
    if timed < 2 or plan["predicted_step_s"] >= plan["step_s"]:
        return f"plan: {memory}" if memory else None
    return (
        f"plan: the {timed} changes{' that save time' if freed else ''} together predict a {fmt_seconds(plan['predicted_step_s'])}"
        f" step against {fmt_seconds(plan['step_s'])} now (an estimate: each saving counted once, in this order)"
        + (f"; {memory}" if memory else "")
    )


EXPLAINED_STAGES = ("other", "data")
"""Stages whose code the report names from stack samples: the rest is named by the stage itself."""
EXPLAIN_SHARE = 0.10
"""Share of the step from which those stages are explained."""


def hotspot_lines(report: ReportData) -> list[str]:
    """The lines a large ``other`` or ``data`` was sampled in: the training thread's, or in ``data`` the
    DataLoader workers' (where they sampled themselves)."""
    lines: list[str] = []
    stages, spots, loading = report["stages"], report["hotspots"], report["loading"]
    for stage in EXPLAINED_STAGES:
        share = stages[stage]["fraction"] if stage in stages else 0.0
        places = spots.get(stage) or []
        if share < EXPLAIN_SHARE or not places:
            continue
        first = places[0]
        samples = round(first["samples"] / first["share"]) if first["share"] else first["samples"]
        listed = ", ".join(f"{p['where']} {fmt_fraction(p['share'])}" for p in places[:3])
        if first["sampled"] == "workers":
            lines.append(
                f"{stage} ({fmt_fraction(share)} of the step) waits for the DataLoader workers, mostly in: "
                f"{listed} (of {samples} samples of the workers' stacks while they built batches)"
            )
            continue
        unsampled = (
            "; the DataLoader workers' stacks were not sampled (started before profiling, not forked, or "
            "their fetches too short to sample): their code is not named"
            if stage == "data" and loading and loading["loaders"] == "workers"
            else ""
        )
        lines.append(
            f"{stage} ({fmt_fraction(share)} of the step) was mostly in: {listed} "
            f"(of {samples} samples of the training thread's stack; name it with perfmagic.stage('...')"
            f"{unsampled})"
        )
    return lines


def evaluation_line(report: ReportData) -> str | None:
    """Evaluation passes, kept out of the steps: "evaluation: 8% of wall time, every 10 steps (3 passes, 0.25 s)"."""
    ev = report["evaluation"]
    if not ev["passes"]:
        return None
    every = f", every {ev['every_steps']:g} steps" if ev["every_steps"] else ""
    passes = f"{ev['passes']} pass{'es' if ev['passes'] != 1 else ''}"
    return (
        f"evaluation: {fmt_fraction(ev['fraction_of_wall'])} of wall time{every} "
        f"({passes}, {fmt_seconds(ev['total_s'])}; not in the steps)"
    )


def minor_line(report: ReportData) -> str | None:
    """The rules that fired with too little to gain for a card, on one line."""
    minor = report["advice_minor"]
    if not minor:
        return None
    parts = [
        f"{m['id']} ({fmt_seconds(m['saving_s'])}, {m['saving_s'] / m['step_s'] * 100:.1f}%)"
        if m["step_s"] and m["saving_s"] is not None
        else str(m["id"])
        for m in minor
    ]
    return "also checked, each under 2% of a step to gain: " + ", ".join(parts)


def memory_peak(host: Host) -> tuple[str, int | None]:
    """The process tree's memory peak in its one measure (``schema.memory_kind``): ``("PSS", bytes)``."""
    pss = host["pss_peak_bytes"]
    kind = memory_kind(pss)
    return kind, pss if kind == "PSS" else host["rss_peak_bytes"]


def memory_words(host: Host) -> str:
    """The process tree's memory peak as every report says it: "process memory peak 331.4 MiB (PSS)"."""
    kind, peak = memory_peak(host)
    return f"{MEMORY_NAME} peak {fmt_bytes(peak)} ({kind})"


def origin_words(report: ReportData) -> str:
    """Where the report comes from: its source, framework and trainer (``live, pytorch, hf_trainer``)."""
    return ", ".join(str(v) for v in (report["source"], report["framework"], report["trainer"]) if v)


def rank_stages(ranks: list[Rank]) -> list[str]:
    """The stages any of the report's ``ranks`` has: built-in ones in pipeline order, then the user's."""
    stages = [n for n in STAGES if any(n in r["stages"] for r in ranks)]
    return stages + sorted({n for r in ranks for n in r["stages"]} - set(stages))


def recording_line(report: ReportData) -> str | None:
    """How the steps were recorded and what that cost them (the report's footer); None without steps."""
    rec = report["recording"]
    if not rec or not rec["steps"]:
        return None
    if rec["mode"] == "windowed":
        said = (
            f"recording: the stages of {rec['full_steps']:,} of {rec['steps']:,} steps (windows; every "
            "step's time), stage figures from those (--full records every step)"
        )
    else:
        said = f"recording: the stages of every step ({rec['steps']:,})"
    calls, share, measured = rec["calls_per_step"], rec["overhead_fraction"], rec["window_cost_s"]
    if calls is not None:
        said += f"; about {calls:.0f} Python calls added per step"
        if share is not None:
            said += f", ~{100 * share:.2g}% of the median step"  # a small share, not rounded to 0%
    if measured is not None:
        error = rec["window_cost_error_s"] or 0.0
        said += f"; the windows measured {_signed(measured)} ± {_signed(error)[1:]} a fully recorded step"
    return said


def _signed(seconds: float) -> str:
    """``+20 ms``, ``-3 µs``: a measured difference, however small, with its sign."""
    return f"{1e6 * seconds:+.0f} µs" if abs(seconds) < 1e-3 else f"{1e3 * seconds:+.2g} ms"
