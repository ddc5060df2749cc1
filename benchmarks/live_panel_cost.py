"""What the live panel costs the training: %%gpuprofile with the panel vs --no-live, on a real kernel.

Runs the same CPU training cell alternately with and without the panel in one
ipykernel (so widget updates really travel over the kernel's sockets), and
compares the median step time perfmagic measured in each run. Also reports the
panel's own time per update on the sampler thread (never the training thread).

    .venv/bin/python benchmarks/live_panel_cost.py [--runs 5] [--steps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
from typing import Any

SETUP = """
%load_ext perfmagic
import time, torch
from perfmagic.render import live
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
X, Y = torch.randn(4096, 256), torch.randint(0, 10, (4096,))
panels = []
_init = live.LivePanel.__init__
def _record(panel, *args, **kwargs):
    _init(panel, *args, **kwargs)
    panels.append(panel)
live.LivePanel.__init__ = _record
"""

CELL = """%%gpuprofile -v rep {options}
for step in range({steps}):
    idx = torch.randint(0, 4096, (256,))
    loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

RESULT = (
    "dict(median_s=rep.steps['median_s'], mean_s=1 / rep.steps['per_s'], "
    "updates=panels[-1].updates if panels else 0, busy_s=panels[-1].busy_s if panels else 0.0, "
    "cpu_s=panels[-1].cpu_s if panels else 0.0, wall_s=rep['wall_s'])"
)


def run(runs: int, steps: int) -> dict[str, Any]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        _check(kc.execute_interactive(SETUP, timeout=120, output_hook=lambda msg: None))
        results: dict[str, list[dict[str, float]]] = {"live": [], "no-live": []}
        for i in range(runs + 1):  # the first pair warms up and is dropped
            order = ("live", "no-live") if i % 2 else ("no-live", "live")
            for mode in order:
                options = "" if mode == "live" else "--no-live"
                _check(kc.execute_interactive("panels.clear()", timeout=60))
                reply = kc.execute_interactive(
                    CELL.format(options=options, steps=steps),
                    timeout=600,
                    user_expressions={"r": RESULT},
                    output_hook=lambda msg: None,
                )
                _check(reply)
                value = reply["content"]["user_expressions"]["r"]
                if value["status"] != "ok":
                    raise RuntimeError(value)
                if i:
                    results[mode].append(ast.literal_eval(value["data"]["text/plain"]))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return summarize(results)


def summarize(results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    live, off = results["live"], results["no-live"]
    med_live = statistics.median(r["median_s"] for r in live)
    med_off = statistics.median(r["median_s"] for r in off)
    updates = sum(r["updates"] for r in live)
    busy = sum(r["busy_s"] for r in live)
    cpu = sum(r["cpu_s"] for r in live)
    return {
        "runs_each": len(live),
        "median_step_s": {"live": med_live, "no_live": med_off},
        "mean_step_s": {
            "live": statistics.median(r["mean_s"] for r in live),
            "no_live": statistics.median(r["mean_s"] for r in off),
        },
        "overhead": med_live / med_off - 1,
        "panel_updates": updates,
        "panel_ms_per_update": 1000 * busy / updates if updates else None,
        "panel_cpu_ms_per_update": 1000 * cpu / updates if updates else None,
        "panel_cpu_share_of_wall": cpu / sum(r["wall_s"] for r in live),
        "median_step_s_per_run": {
            "live": [r["median_s"] for r in live],
            "no_live": [r["median_s"] for r in off],
        },
    }


def _check(reply: dict[str, Any]) -> None:
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs per mode (default 5)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per run (default 400)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    summary = run(args.runs, args.steps)
    ms = {k: f"{v * 1000:.2f} ms" for k, v in summary["median_step_s"].items()}
    print(f"median step time: live panel {ms['live']}, --no-live {ms['no_live']}")
    print(
        f"overhead of the live panel: {summary['overhead']:+.1%} ({summary['runs_each']} runs each, interleaved)"
    )
    if summary["panel_ms_per_update"] is not None:
        print(
            f"panel: {summary['panel_updates']} updates on the sampler thread, {summary['panel_ms_per_update']:.2f} ms "
            f"wall and {summary['panel_cpu_ms_per_update']:.2f} ms CPU each; its CPU is "
            f"{summary['panel_cpu_share_of_wall']:.2%} of the profiled time"
        )
    spread = {
        k: ", ".join(f"{v * 1000:.2f}" for v in vs) for k, vs in summary["median_step_s_per_run"].items()
    }
    print(f"per-run median step (ms): live [{spread['live']}], --no-live [{spread['no_live']}]")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
