"""The GPU timeline of a trace report in HTML: where the GPU's time went and its top kernels.

Plain HTML and CSS, no script: it reads the same in a notebook, a standalone file and an
``nbconvert`` export, where Bokeh's charts are only a picture. Drawn from the report's
``gpu`` section (the primary rank's); empty without one.
"""

from __future__ import annotations

import html
import re

from perfmagic.contract import GpuSection, ReportData
from perfmagic.units import fmt_fraction, fmt_seconds

CSS = """
.pm-gpu{margin:10px 0}
.pm-gpu-bar{display:flex;height:18px;border-radius:3px;overflow:hidden;margin:4px 0}
.pm-gpu-bar div{min-width:1px}
.pm-gpu-keys{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px}
.pm-gpu-keys i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
.pm-kernels td,.pm-kernels th{padding:2px 10px;text-align:right;font-size:12px}
.pm-kernels td:first-child,.pm-kernels th:first-child{text-align:left;font-family:var(--jp-code-font-family,monospace)}
"""

GPU_TIME = (
    ("compute", "#4e79a7"),
    ("non-compute", "#9c755f"),
    ("idle: host wait", "#f28e2b"),
    ("idle: kernel wait", "#edc948"),
    ("idle: other", "#bab0ac"),
)
"""The parts of the GPU's window in the chart, in order, with their colors."""
NAME_CHARS = 100
"""Kernel names longer than this, shortened, are cut in the table (the whole name shows on hover)."""
_QUALIFIER = re.compile(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::")


def gpu_time_shares(gpu: GpuSection) -> dict[str, float]:
    """The GPU window's parts (``GPU_TIME``) as fractions of it: busy split into compute and the rest,
    idle split by why (``idle_breakdown``, fractions of idle time)."""
    idle = gpu["idle_fraction"] or 0.0
    why = gpu["idle_breakdown"]
    return {
        "compute": gpu["compute_fraction"] or 0.0,
        "non-compute": gpu["non_compute_fraction"] or 0.0,
        "idle: host wait": idle * (why["host_wait"] or 0.0),
        "idle: kernel wait": idle * (why["kernel_wait"] or 0.0),
        "idle: other": idle * (why["other"] or 0.0),
    }


def gpu_html(report: ReportData) -> str:
    """The GPU idle breakdown chart and the top-kernels table; empty without a ``gpu`` section."""
    gpu = report["gpu"]
    if not gpu or gpu["busy_fraction"] is None:
        return ""
    return f'<style>{CSS}</style><div class="pm-gpu">{idle_chart(gpu)}{top_kernels_table(gpu)}</div>'


def idle_chart(gpu: GpuSection) -> str:
    """One bar for the GPU's window, split into busy (compute, non-compute) and idle by why."""
    window = gpu["window_s"] or 0.0
    shares = gpu_time_shares(gpu)
    colors = dict(GPU_TIME)
    bar = "".join(
        f'<div style="width:{100 * share:.2f}%;background:{colors[part]}" title="{part}"></div>'
        for part, share in shares.items()
        if share > 0
    )
    keys = "".join(
        f'<span data-part="{part}"><i style="background:{colors[part]}"></i>{part} '
        f"<b>{fmt_fraction(share)}</b> ({fmt_seconds(share * window)})</span>"
        for part, share in shares.items()
    )
    return (
        f"<div><b>GPU time</b> over {fmt_seconds(window)} of the trace: busy "
        f"{fmt_fraction(gpu['busy_fraction'])}, idle {fmt_fraction(gpu['idle_fraction'])}</div>"
        f'<div class="pm-gpu-bar">{bar}</div><div class="pm-gpu-keys">{keys}</div>'
    )


def top_kernels_table(gpu: GpuSection) -> str:
    """The kernels with most GPU time: share of the window, count, mean time, tensor cores."""
    rows = []
    for k in gpu["top_kernels"]:
        name = str(k["name"])
        short = short_name(name)
        tensor = {True: "yes", False: "no", None: "–"}[k["tensor_cores"]]
        rows.append(
            f'<tr><td title="{html.escape(name)}">{html.escape(short)}</td>'
            f"<td>{_share(k['fraction'])}</td><td>{k['count']}</td>"
            f"<td>{fmt_seconds(k['mean_s'])}</td><td>{tensor}</td></tr>"
        )
    if not rows:
        return ""
    return (
        '<table class="pm-kernels"><tr><th>top kernels</th><th>share</th><th>count</th>'
        f"<th>mean</th><th>tensor cores</th></tr>{''.join(rows)}</table>"
    )


def short_name(name: str) -> str:
    """A kernel's name as the table shows it: without ``void``, namespaces and the argument list (C++
    kernels of one template differ only in their template arguments), cut at ``NAME_CHARS``."""
    short = _QUALIFIER.sub("", name.removeprefix("void "))
    if short.endswith(")"):  # cut before the "(" that matches the last ")"
        depth = 0
        for i in range(len(short) - 1, 0, -1):
            depth += {")": 1, "(": -1}.get(short[i], 0)
            if depth == 0:
                short = short[:i]
                break
    return short if len(short) <= NAME_CHARS else short[: NAME_CHARS - 1] + "…"


def _share(x: float | None) -> str:
    """A kernel's share of the window to a tenth of a percent: most kernels take less than 1%."""
    return "n/a" if x is None else f"{x * 100:.1f}%"
