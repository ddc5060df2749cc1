"""Plain-text rendering of a report, for terminals and ``print(report)``."""

from __future__ import annotations

from perfmagic.advise.headline import cause_card_title, caused
from perfmagic.contract import Card, Host, Rank, ReportData, Steps
from perfmagic.schema import MEMORY_NAME, STAGES, memory_kind
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_rate, fmt_seconds

_BAR_WIDTH = 30


def most_to_gain(report: ReportData) -> str | None:
    """Why the first card is not about the largest stage, when it is not: it saves the most."""
    from perfmagic.advise.catalog import STAGE_OF

    advice, bottleneck = report.get("advice") or [], report.get("bottleneck")
    if not advice or not bottleneck or not advice[0].get("saving_s"):
        return None
    top = advice[0]
    if (
        bottleneck in STAGE_OF.get(str(top.get("id")), "").split()
        or cause_card_title(report, bottleneck) == top["title"]
    ):
        return None  # about the bottleneck, or the bottleneck's cause the headline names
    return f"most to gain elsewhere: {top.get('title')} (saves ~{fmt_seconds(top['saving_s'])} per step)"


def saving_words(card: Card) -> str:
    """What fixing a card gains, in words: per step and as a speed-up, or once."""
    once = (card.get("metrics") or {}).get("one_time_s")
    if once:
        return f"one-time cost ~{fmt_seconds(once)}"
    parts = []
    if card.get("saving_s"):
        parts.append(f"saves ~{fmt_seconds(card['saving_s'])} per step")
    speedup = card.get("speedup")
    if speedup:
        parts.append(f"~{speedup:.2g}× faster" if speedup >= 1.1 else f"~{(speedup - 1) * 100:.0f}% faster")
    metrics = card.get("metrics") or {}
    interval = metrics.get("saving_interval_s")
    if metrics.get("uncertain") and interval:
        parts.append(
            f"uncertain: {fmt_seconds(interval[0])}–{fmt_seconds(interval[1])} (p10–p90 of the steps)"
        )
    alone, saving = metrics.get("saving_alone_s"), card.get("saving_s")
    if alone and saving is not None and alone > 1.05 * saving:
        parts.append(f"{fmt_seconds(alone)} on its own, less after the changes above")
    return ", ".join(parts)


def plan_line(report: ReportData) -> str | None:
    """The plan's predicted step, where more than one change makes it."""
    plan = report.get("plan")
    if not plan or len(plan["changes"]) < 2 or plan["predicted_step_s"] >= plan["step_s"]:
        return None
    return (
        f"plan: the {len(plan['changes'])} changes together predict a {fmt_seconds(plan['predicted_step_s'])}"
        f" step against {fmt_seconds(plan['step_s'])} now (an estimate: each saving counted once, in this order)"
    )


EXPLAINED_STAGES = ("other", "data")
"""Stages whose code the report names from stack samples: the rest is named by the stage itself."""
EXPLAIN_SHARE = 0.10
"""Share of the step from which those stages are explained."""


def hotspot_lines(report: ReportData) -> list[str]:
    """The lines a large ``other`` or ``data`` was sampled in: the training thread's, or in ``data`` the
    DataLoader workers' (where they sampled themselves)."""
    lines: list[str] = []
    stages, spots = report.get("stages") or {}, report.get("hotspots") or {}
    loading = report.get("loading")
    for stage in EXPLAINED_STAGES:
        share = stages[stage]["fraction"] if stage in stages else 0.0
        places = spots.get(stage) or []
        if share < EXPLAIN_SHARE or not places:
            continue
        first = places[0]
        samples = round(first["samples"] / first["share"]) if first["share"] else first["samples"]
        listed = ", ".join(f"{p['where']} {fmt_fraction(p['share'])}" for p in places[:3])
        if first.get("sampled") == "workers":
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
    ev = report.get("evaluation") or {}
    if not ev.get("passes"):
        return None
    every = f", every {ev['every_steps']:g} steps" if ev.get("every_steps") else ""
    passes = f"{ev['passes']} pass{'es' if ev['passes'] != 1 else ''}"
    return (
        f"evaluation: {fmt_fraction(ev.get('fraction_of_wall'))} of wall time{every} "
        f"({passes}, {fmt_seconds(ev.get('total_s'))}; not in the steps)"
    )


def minor_line(report: ReportData) -> str | None:
    """The rules that fired with too little to gain for a card, on one line."""
    minor = report.get("advice_minor") or []
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
    pss = host.get("pss_peak_bytes")
    kind = memory_kind(pss)
    return kind, pss if kind == "PSS" else host.get("rss_peak_bytes")


def memory_words(host: Host) -> str:
    """The process tree's memory peak as every report says it: "process memory peak 331.4 MiB (PSS)"."""
    kind, peak = memory_peak(host)
    return f"{MEMORY_NAME} peak {fmt_bytes(peak)} ({kind})"


def throughput_words(steps: Steps) -> str:
    """ ", 2,050 samples/s, 65,600 tokens/s" where the batches told them."""
    words = [
        f", {fmt_rate(rate)} {unit}/s"
        for rate, unit in ((steps["samples_per_s"], "samples"), (steps["tokens_per_s"], "tokens"))
        if rate
    ]
    return "".join(words)


def tuning_lines(report: ReportData) -> list[str]:
    """One line per knob tuning tried: its settings' measured times, and the best against the baseline."""
    lines = []
    for knob in report.get("tuning") or []:
        base, best = knob.get("baseline"), knob.get("best")
        if knob["knob"] == "step" and best and base:
            settings = ", ".join(f"{k}={v}" for k, v in best["value"].items())
            lines.append(
                f"predicted step with {settings}: {fmt_seconds(best['seconds'])} against "
                f"{fmt_seconds(base['seconds'])} observed (~{knob['speedup']:.2g}× faster)"
            )
        elif best and base:
            tried = ", ".join(f"{t['value']}: {fmt_seconds(t['seconds'])}" for t in knob["tried"])
            lines.append(
                f"{knob['knob']} (measured, {knob['unit']}): {tried}; best {best['value']} "
                f"(~{knob['speedup']:.2g}× against {base['value']})"
            )
        else:
            lines.append(f"{knob['knob']}: not compared ({'; '.join(knob.get('notes') or [])})")
    return lines


def origin_words(report: ReportData) -> str:
    """Where the report comes from: its source, framework and trainer (``live, pytorch, hf_trainer``)."""
    return ", ".join(str(report[k]) for k in ("source", "framework", "trainer") if report.get(k))


def render_text(report: ReportData) -> str:
    lines: list[str] = []
    steps = report["steps"]
    head = f"perfmagic report ({origin_words(report)}) — {fmt_seconds(report['wall_s'])} profiled"
    lines += [head, "=" * len(head)]
    if steps.get("count"):
        lines.append(
            f"steps: {steps['count']}, median {fmt_seconds(steps['median_s'])}, "
            f"p90 {fmt_seconds(steps['p90_s'])}, {fmt_rate(steps['per_s'])} steps/s{throughput_words(steps)}, "
            f"first step done after {fmt_seconds(steps['first_s'])}"
        )
        if steps.get("warmup"):
            lines.append(
                f"figures below: the {steps['count'] - steps['warmup']} steps after the first (warm-up)"
            )
    else:
        lines.append("steps: none seen" + (f" ({steps['hint']})" if steps.get("hint") else ""))
    evaluation = evaluation_line(report)
    if evaluation:
        lines.append(evaluation)
    straggler = report.get("straggler")
    if straggler:
        lines.append(
            f"bottleneck: {straggler['stage']} on rank {straggler['rank']}, a straggler: "
            f"+{fmt_seconds(straggler['excess_s'])} per step that the other ranks wait for in comm"
        )
    elif report.get("bottleneck"):
        stage = report["stages"].get(report["bottleneck"] or "")
        share = stage["fraction"] if stage else None
        tail = f" ({fmt_fraction(share)} of step time)" if share is not None else ""
        lines.append(caused(f"bottleneck: {report['bottleneck']}{tail}", report, report["bottleneck"]))
        gain = most_to_gain(report)
        if gain:
            lines.append(gain)

    if report["stages"]:
        lines += ["", "stage breakdown (share of step time, mean per step):"]
        width = max(len(n) for n in report["stages"])
        for name, s in sorted(report["stages"].items(), key=lambda kv: -kv[1]["total_s"]):
            bar = "█" * round(s["fraction"] * _BAR_WIDTH)
            lines.append(
                f"  {name:<{width}}  {fmt_fraction(s['fraction']):>4}  {bar:<{_BAR_WIDTH}}  "
                f"{fmt_seconds(s.get('mean_s', s['median_s']))}"
            )

    spots = hotspot_lines(report)
    if spots:
        lines += ["", *spots]

    g = report["gpu"]
    if g:
        lines += [
            "",
            f"GPU (trace): busy {fmt_fraction(g.get('busy_fraction'))}, idle {fmt_fraction(g.get('idle_fraction'))}",
        ]

    if report["devices"]:
        lines += ["", "GPUs:"]
        for d in report["devices"]:
            lines.append(
                f"  [{d.get('index')}] {d.get('name', '?')}: util {fmt_fraction(d.get('util_mean'))} "
                f"(p95 {fmt_fraction(d.get('util_p95'))}), memory peak {fmt_bytes(d.get('mem_used_peak_bytes'))}"
                f" / {fmt_bytes(d.get('mem_total_bytes'))}, power {_watts(d.get('power_mean_w'))}"
            )
    host = report.get("host") or {}
    if host.get("cpu_count") is not None:
        lines += [
            "",
            f"host: {host.get('cpu_count', '?')} CPUs, CPU {fmt_fraction(host.get('cpu_util_mean'))}, "
            f"{memory_words(host)}",
        ]

    if len(report.get("ranks", [])) > 1:
        lines += ["", *rank_table(report)]
        skew = report.get("collective_skew")
        if skew:
            lines.append(
                f"  collectives: {skew['instances']} matched across ranks, start skew mean "
                f"{fmt_seconds(skew['skew_mean_s'])} (p90 {fmt_seconds(skew['skew_p90_s'])}); "
                f"rank {skew['last_rank']} arrives last most often"
            )
            latest = sorted(skew["ranks"], key=lambda x: -x["late_mean_s"])[:5]
            for x in latest:
                lines.append(
                    f"    rank {x['rank']}: late by {fmt_seconds(x['late_mean_s'])} on average "
                    f"(p90 {fmt_seconds(x['late_p90_s'])}), last in {fmt_fraction(x['last_fraction'])}"
                )

    if report["advice"]:
        lines += ["", "advice:"]
        for card in report["advice"]:
            words = saving_words(card)
            saving = f" — {words}" if words else ""
            lines.append(f"  [{card['severity']}] {card['title']}{saving}")
            lines.append(f"      {card['evidence']}")
            for fix_line in card["fix"].splitlines():
                lines.append(f"      | {fix_line}")

    planned = plan_line(report)
    if planned:
        lines += ["", planned]
    minor = minor_line(report)
    if minor:
        lines += ["", minor]

    tuned = tuning_lines(report)
    if tuned:
        lines += ["", "tuning (tried after the window, on copies):", *(f"  {line}" for line in tuned)]

    if report["warnings"]:
        lines += ["", "not measured:"]
        lines += [f"  - {w}" for w in report["warnings"]]
    return "\n".join(lines)


def _watts(w: float | None) -> str:
    return "n/a" if w is None else f"{w:.0f} W"


def rank_stages(ranks: list[Rank]) -> list[str]:
    """The stages any of the report's ``ranks`` has: built-in ones in pipeline order, then the user's."""
    stages = [n for n in STAGES if any(n in r["stages"] for r in ranks)]
    return stages + sorted({n for r in ranks for n in r["stages"]} - set(stages))


def rank_table(report: ReportData) -> list[str]:
    """The ranks' stage tables side by side: one row per rank, mean seconds per steady step."""
    ranks = report["ranks"]
    stages = rank_stages(ranks)
    busy = any(_busy(r) is not None for r in ranks)
    straggler = report["straggler"]["rank"] if report["straggler"] else None
    head = ["rank", "node", "steps", "step", *stages, *(["GPU busy"] if busy else [])]
    rows = []
    for r in ranks:
        step = sum(s["mean_s"] for s in r["stages"].values()) if r["stages"] else None
        rows.append(
            [
                f"{r['rank']}{'*' if r['rank'] == straggler else ''}",
                str(r.get("node") or "-"),
                str(r["steps"]["count"]),
                fmt_seconds(step) if step is not None else "-",
                *(fmt_seconds(r["stages"][n]["mean_s"]) if n in r["stages"] else "-" for n in stages),
                *([fmt_fraction(_busy(r))] if busy else []),
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    title = (
        "ranks (mean per step after warm-up" + ("; * the straggler" if straggler is not None else "") + "):"
    )
    return [
        title,
        *("  " + "  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True)) for row in [head, *rows]),
    ]


def _busy(rank: Rank) -> float | None:
    gpu = rank.get("gpu")
    return gpu["busy_fraction"] if gpu else None
