"""Plain-text rendering of a report, for terminals and ``print(report)``."""

from __future__ import annotations

from perfmagic.advise.headline import caused
from perfmagic.contract import Rank, ReportData, Steps
from perfmagic.render.wording import (
    evaluation_line,
    hotspot_lines,
    memory_words,
    minor_line,
    most_to_gain,
    origin_words,
    plan_line,
    rank_stages,
    saving_words,
)
from perfmagic.units import fmt_bytes, fmt_fraction, fmt_rate, fmt_seconds

_BAR_WIDTH = 30


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
