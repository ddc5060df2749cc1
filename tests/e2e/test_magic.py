"""%%gpuprofile and %gpumonitor in an in-process IPython shell: the cell behaves as without the magic."""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import CapturedIO, capture_output
from ipywidgets.widgets.widget import _instances
from paths import SCRIPTS
from torch.optim import optimizer as optim_mod
from torch.utils.data import dataloader as dl

import perfmagic
from perfmagic.magic import PerfMagics
from perfmagic.session import active_session

MODEL = torch.nn.Linear(8, 1)


def DataLoader_(n: int) -> Any:
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1)), batch_size=4
    )


TRAIN = """\
import time, torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(ds, batch_size=8)):
    time.sleep(0.01)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def ip() -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.run_line_magic("colors", "nocolor")
    shell.run_line_magic("load_ext", "perfmagic")
    yield shell
    shell.run_line_magic("gpumonitor", "stop")


def run(ip: InteractiveShell, cell: str) -> tuple[Any, CapturedIO]:
    with capture_output() as cap:
        result = ip.run_cell(cell)
    return result, cap


def snapshot() -> dict[str, Any]:
    """Everything profiling touches, to check that it is all put back."""
    return {
        "print": builtins.print,
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "module_call": torch.nn.Module.__call__,
        "backward": torch.Tensor.backward,
        "to": torch.Tensor.to,
        "save": torch.save,
        "next": dl._BaseDataLoaderIter.__next__,
        "logger": logging.Logger.handle,
        "optimizer_hooks": (
            len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks),
        ),
        "fd2": os.fstat(2).st_ino,
        # what profile_children sets for the block (torch sets variables of its own: not compared)
        "environ": {k: v for k, v in os.environ.items() if k.startswith("PERFMAGIC") or k == "PYTHONPATH"},
        "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("perfmagic")),
        "active": active_session(),
    }


def html_outputs(cap: CapturedIO) -> list[str]:
    return [o.data["text/html"] for o in cap.outputs if "text/html" in o.data]


def test_help_documents_every_option(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("gpuprofile").__doc__ or ""
    for option in (
        "--interval",
        "--trace",
        "--steps",
        "--outdir",
        "--json",
        "--html",
        "--no-live",
        "--quiet",
    ):
        assert option in doc
    assert "-o " in doc and "-v NAME" in doc and "--compare" in doc
    assert "Examples::" in doc and "%gpuprofile --compare before after" in doc and "perfmagic.step()" in doc
    _, cap = run(ip, "%gpuprofile?")
    assert "--no-live" in cap.stdout and "store the Report in the variable NAME" in cap.stdout
    assert "start (default) or stop" in (ip.find_line_magic("gpumonitor").__doc__ or "")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--interval fast", "invalid float value"),
        ("--interval 0", "--interval must be a positive"),
        ("--steps 3", "add --trace"),
        ("--trace --steps 0", "--steps must be at least 1"),
        ("-v 1abc", "-v takes a variable name"),
    ],
)
def test_bad_option_is_usage_error_with_usage(ip: InteractiveShell, line: str, message: str) -> None:
    before = snapshot()
    result, _ = run(ip, f"%%gpuprofile {line}\nran = True\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert message in str(result.error_in_exec)
    if "unrecognized" in message or "invalid" in message:
        assert "usage: %gpuprofile [--interval S]" in str(result.error_in_exec)
    assert "ran" not in ip.user_ns
    assert snapshot() == before


def test_line_form_without_compare_says_how_to_use_it(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="is a cell magic"):
        ip.run_line_magic("gpuprofile", "")


def test_cell_runs_as_without_the_magic(ip: InteractiveShell) -> None:
    before = snapshot()
    result, cap = run(ip, "%%gpuprofile --no-live\n" + TRAIN + "trained = step + 1\ntrained * 2\n")
    assert result.success and result.result == 32
    assert ip.user_ns["trained"] == 16 and ip.user_ns["model"] is not None
    assert ip.user_ns["_"] == 32
    htmls = html_outputs(cap)
    assert len(htmls) == 1 and "pm-report" in htmls[0] and "Stage waterfall" in htmls[0]
    assert "Out[" in cap.stdout  # the last value went through the display hook
    assert snapshot() == before


def test_semicolon_silences_the_last_value(ip: InteractiveShell) -> None:
    result, cap = run(ip, "%%gpuprofile --quiet\nsilenced = 5\nsilenced + 1;\n")
    assert result.success and result.result is None
    assert "Out[" not in cap.stdout and cap.outputs == []


def test_o_returns_report_and_v_stores_it(ip: InteractiveShell, tmp_path: Path) -> None:
    result, cap = run(
        ip, f"%%gpuprofile -o -v rep --no-live --outdir {tmp_path}\n" + TRAIN + "'last value'\n"
    )
    report = result.result
    assert isinstance(report, perfmagic.Report) and ip.user_ns["rep"] is report
    assert report.steps["count"] == 16 and report["source"] == "live"
    assert "'last value'" in cap.stdout  # still shown, before the report
    assert html_outputs(cap) == []  # -o: the report is the result, not shown twice
    assert (tmp_path / "report.json").is_file()


def test_exports_and_quiet(ip: InteractiveShell, tmp_path: Path) -> None:
    j, h = tmp_path / "r.json", tmp_path / "r.html"
    result, cap = run(ip, f"%%gpuprofile --quiet --json {j} --html {h} -v quiet_rep\n" + TRAIN)
    assert result.success and cap.outputs == []
    assert json.loads(j.read_text())["schema"] == "perfmagic.report/1"
    assert "<html" in h.read_text()[:200]


def test_exception_shows_report_then_usual_traceback(ip: InteractiveShell) -> None:
    before = snapshot()
    cell = (
        "%%gpuprofile -v failed --no-live\n" + TRAIN + "def fail():\n    raise ValueError('boom')\nfail()\n"
    )
    result, cap = run(ip, cell)
    assert isinstance(result.error_in_exec, ValueError) and not result.success
    report = ip.user_ns["failed"]
    assert report.steps["count"] == 16
    assert any("ended with ValueError" in w for w in report.warnings)
    assert len(html_outputs(cap)) == 1  # the report, shown before the traceback printed below
    tb = cap.stdout
    assert tb.count("ValueError: boom") == 1
    assert "Cell In[" in tb and "fail()" in tb and "raise ValueError('boom')" in tb
    assert "magic.py" not in tb and "session.py" not in tb  # perfmagic's frames are hidden
    assert snapshot() == before


def test_interrupt_shows_report_and_fails_the_cell(ip: InteractiveShell) -> None:
    """Ctrl-C (a real SIGINT): report of what ran, then KeyboardInterrupt so "run all" stops."""
    before = snapshot()
    cell = TRAIN.replace(
        "    time.sleep(0.01)\n",
        "    time.sleep(0.01)\n    if step == 5:\n        os.kill(os.getpid(), signal.SIGINT)\n",
    )
    ip.user_ns.update(os=os, signal=signal)
    result, cap = run(ip, "%%gpuprofile -v interrupted\n" + cell)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    report = ip.user_ns["interrupted"]
    assert 5 <= report.steps["count"] <= 6
    assert any("KeyboardInterrupt" in w for w in report.warnings)
    updates = [o for o in cap.outputs if o.update]
    assert updates and "pm-report" in updates[-1].data["text/html"]  # the live panel became the report
    assert "KeyboardInterrupt" in cap.stdout
    assert snapshot() == before


def test_live_panel_updates_and_turns_into_the_report(ip: InteractiveShell) -> None:
    magics = ip.magics_manager.registry["PerfMagics"]
    panels: list[Any] = []
    original = PerfMagics._profile_cell

    def spy(self: PerfMagics, *args: Any) -> Any:
        from perfmagic.render import live

        init = live.LivePanel.__init__

        def record(panel: Any, *a: Any, **k: Any) -> None:
            init(panel, *a, **k)
            panels.append(panel)

        live.LivePanel.__init__ = record  # type: ignore[method-assign]
        try:
            return original(self, *args)
        finally:
            live.LivePanel.__init__ = init  # type: ignore[method-assign]

    magics._profile_cell = spy.__get__(magics)
    open_before = set(_instances)
    try:
        result, cap = run(ip, "%%gpuprofile --interval 0.02\n" + TRAIN.replace("0.01", "0.03"))
    finally:
        del magics._profile_cell
    assert result.success
    (panel,) = panels
    assert panel.updates >= 2  # at most 4 a second over a ~0.5 s cell
    assert panel.busy_s / panel.updates < 0.05
    kinds = [(o.update, sorted(o.data)) for o in cap.outputs]
    assert kinds[0] == (False, ["text/html", "text/plain"])  # the caption
    assert "<script" not in cap.outputs[0].data["text/html"]  # the panel needs no BokehJS
    assert kinds[1] == (False, ["application/vnd.jupyter.widget-view+json", "text/plain"])
    assert [k[0] for k in kinds[2:]] == [True, True]
    assert "16 steps" in cap.outputs[2].data["text/plain"]
    assert "pm-report" in cap.outputs[3].data["text/html"]
    assert "No GPU" in panel._gpus.children[0].value  # this machine has none, and the panel says so
    chart = panel._chart_view.value
    assert 'data-series="cpu"' in chart and "<polyline" in chart
    assert 'data-series="gpu"' not in chart, "no GPU line, nor a legend entry promising one"
    assert "steps" in panel._status.value
    # every widget the panel opened is closed (a comm each, layouts and styles too), after its output went
    assert set(_instances) <= open_before


def test_live_panel_shows_gpus(fake_nvml: Any) -> None:
    from fake_nvml import two_gpus

    from perfmagic.render.live import LivePanel

    fake_nvml(two_gpus())
    with perfmagic.profile(interval=0.02) as session:
        panel = LivePanel(session)
        panel.update(force=True)
    rows = panel._gpus.children
    assert len(rows) == 2
    util_bar = rows[0].children[1]
    assert util_bar.value > 0
    assert "GiB" in rows[0].children[5].value
    panel.close()


def test_refuses_a_second_profile(ip: InteractiveShell) -> None:
    with perfmagic.profile(sample=False):
        result, _ = run(ip, "%%gpuprofile\nnested = 1\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "another perfmagic profile is running" in str(result.error_in_exec)
    assert "nested" not in ip.user_ns


def test_async_cell_is_refused_clearly(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%gpuprofile\nimport asyncio\nawait asyncio.sleep(0)\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert "top-level `await`" in str(result.error_in_exec)
    assert "with perfmagic.profile()" in str(result.error_in_exec)


def test_syntax_error_stops_before_profiling(ip: InteractiveShell) -> None:
    """As in a cell without the magic, a syntax error is found before the cell runs and shown alone,
    at the cell's own line (the magic's is line 1)."""
    before = snapshot()
    result, cap = run(ip, "%%gpuprofile\nx = 1\ny = (\n")
    assert isinstance(result.error_before_exec, SyntaxError)
    assert "line 3" in cap.stdout and "y = (" in cap.stdout and "SyntaxError" in cap.stdout
    assert "magic.py" not in cap.stdout and "interactiveshell.py" not in cap.stdout
    assert cap.outputs == []
    assert snapshot() == before


def test_the_syntax_check_comes_and_goes_with_the_extension(ip: InteractiveShell) -> None:
    def ours() -> list[Any]:
        return [t for t in ip.input_transformers_cleanup if getattr(t, "perfmagic", False)]

    assert len(ours()) == 1
    ip.run_line_magic("reload_ext", "perfmagic")
    assert len(ours()) == 1
    ip.run_line_magic("unload_ext", "perfmagic")
    assert ours() == []
    ip.run_line_magic("load_ext", "perfmagic")
    assert len(ours()) == 1


def test_a_cell_failing_before_training_keeps_v_and_shows_no_report(
    ip: InteractiveShell, tmp_path: Path
) -> None:
    ip.user_ns["kept"] = "an earlier report"
    out = tmp_path / "r.json"
    result, cap = run(ip, f"%%gpuprofile --no-live -v kept --json {out}\n\nundefined_name\n" + TRAIN)
    assert isinstance(result.error_in_exec, NameError)
    assert ip.user_ns["kept"] == "an earlier report" and not out.exists()
    (note,) = cap.outputs  # one line, no report
    assert "before its first training step" in note.data["text/plain"] and "\n" not in note.data["text/plain"]
    assert "Cell In[" in cap.stdout and "----> 3 undefined_name" in cap.stdout  # the cell's own line


def test_trace_runs_torch_profiler_for_a_few_steps(ip: InteractiveShell, tmp_path: Path) -> None:
    before = snapshot()
    result, _ = run(ip, f"%%gpuprofile --trace --steps 3 --no-live -v traced --outdir {tmp_path}\n" + TRAIN)
    assert result.success, result.error_in_exec
    report = ip.user_ns["traced"]
    (trace,) = report["torch_traces"]
    assert trace["steps"] == 3 and Path(trace["path"]).is_file()
    events = json.loads(Path(trace["path"]).read_text())["traceEvents"]
    assert sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) == 3
    # libkineto's fd-2 chatter went to the log, and fd 2 is back
    assert "profiler_start" in (tmp_path / "torch_profiler.log").read_text()
    merged = report.to_chrome_trace(tmp_path / "merged.json")
    names = {e.get("name") for e in json.loads(merged.read_text())["traceEvents"]}
    assert any(str(n).startswith("ProfilerStep#") for n in names) and "step 1" in names
    assert snapshot() == before


SPAWN = """\
import os, socket, sys
import torch.multiprocessing as mp
sys.path.insert(0, {scripts!r})
import train_spawn  # the workers' function: importable, as spawn needs (sys.path goes to the workers)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
os.environ["PYTHONPATH"] = os.environ.get("PYTHONPATH", "") + os.pathsep + "/cell/own"  # the cell's own change
mp.spawn(train_spawn.train, args=(2,), nprocs=2)
sys.path.remove({scripts!r})
"""


@pytest.mark.slow
def test_a_cell_that_spawns_ranks_reports_each_worker_and_puts_the_environment_back(
    ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.multiprocessing.spawn starts fresh interpreters: they are profiled as perfmagic run's are."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    # put back after the test: the cell changes it. Never empty: perfmagic puts its directory before the
    # user's entries, and an empty PYTHONPATH has none to keep (CI runs with it unset)
    pythonpath = os.environ.get("PYTHONPATH") or str(tmp_path / "users-own")
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    before = snapshot()
    scripts = str(SCRIPTS)
    result, _ = run(
        ip, f"%%gpuprofile --no-live -v spawned --outdir {tmp_path}\n" + SPAWN.format(scripts=scripts)
    )
    assert result.success, result.error_in_exec
    report = ip.user_ns["spawned"]
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]  # the ranks the workers were given
    assert all(r["steps"]["count"] == 10 for r in report["ranks"])
    assert report.steps["count"] == 10 and report["source"] == "live"
    assert len(list((tmp_path / "children").glob("proc-*"))) >= 2
    # the variables set for the cell are gone; the cell's own change to PYTHONPATH stays, less perfmagic's
    after = snapshot()
    assert after.pop("environ") == {
        **before.pop("environ"),
        "PYTHONPATH": pythonpath + os.pathsep + "/cell/own",
    }
    assert after == before
    assert perfmagic.load(tmp_path).steps["count"] == 10  # the record rebuilds with its children


def test_gpumonitor_starts_and_stops(ip: InteractiveShell, fake_nvml: Any) -> None:
    import fake_nvml as scenarios

    fake_nvml(scenarios.two_gpus())
    open_before = set(_instances)
    _, cap = run(ip, "%gpumonitor --interval 0.05")
    assert any(t.name == "perfmagic-sampler" for t in threading.enumerate())
    assert any("application/vnd.jupyter.widget-view+json" in o.data for o in cap.outputs)
    time.sleep(0.3)
    _, cap = run(ip, "%gpumonitor stop")
    assert not any(t.name == "perfmagic-sampler" for t in threading.enumerate())
    # the summary takes the panel's place, static: a saved notebook needs no kernel (nor widget) to show it
    stopped = cap.outputs[-1]
    summary = stopped.data["text/plain"].splitlines()
    assert stopped.update and summary[0].startswith("perfmagic monitor stopped after ")
    assert "application/vnd.jupyter.widget-view+json" not in stopped.data
    assert summary[1].startswith(
        "  GPU 0 (NVIDIA H100 80GB HBM3): utilization mean 87%, peak 87%; memory peak 20.0"
    )
    assert summary[3].startswith("  host CPU mean ") and "<table" in stopped.data["text/html"]
    assert set(_instances) <= open_before, "the monitor's widgets are closed"
    fake_nvml(scenarios.no_library())
    run(ip, "%gpumonitor --interval 0.05")
    _, cap = run(ip, "%gpumonitor stop")
    assert cap.outputs[-1].data["text/plain"].startswith("perfmagic monitor stopped after ")
    assert (
        "no GPU (" in cap.outputs[-1].data["text/plain"]
        and "; host CPU mean " in cap.outputs[-1].data["text/plain"]
    )
    result, _ = run(ip, "%gpumonitor sideways")
    assert isinstance(result.error_in_exec, UsageError) and "usage: %gpumonitor" in str(result.error_in_exec)


def test_compare_renders_side_by_side(ip: InteractiveShell, tmp_path: Path) -> None:
    run(ip, "%%gpuprofile --quiet -v slow\n" + TRAIN)
    path = tmp_path / "fast.json"
    run(ip, f"%%gpuprofile --quiet --json {path}\n" + TRAIN.replace("time.sleep(0.01)", "pass"))
    result, cap = run(ip, f"%gpuprofile --compare slow {path}")
    assert result.success
    (out,) = cap.outputs
    assert "perfmagic comparison" in out.data["text/plain"]
    # the same verdict, in the same words, in the text and the HTML
    verdict = re.search(r"\(([\d.]+x (faster|slower))\)", out.data["text/plain"])
    assert verdict and verdict.group(1) in out.data["text/html"], out.data["text/plain"]
    assert "image/png" in out.data  # the stage chart where no script runs, as a report has
    result, _ = run(ip, "%gpuprofile --compare slow nowhere")
    assert isinstance(result.error_in_exec, UsageError)


def test_a_trailing_comment_on_the_magic_line_is_ignored(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%gpuprofile -v commented --no-live   # keep the report as 'commented'\nx = 1\n")
    assert result.success, result.error_in_exec or result.error_before_exec
    assert isinstance(ip.user_ns["commented"], perfmagic.Report)


def test_live_panel_builds_up_the_stage_shares_of_the_report() -> None:
    from perfmagic.render.live import LivePanel

    session = perfmagic.profile(interval=0.05)
    panel = LivePanel(session)
    session.add_tick_listener(panel.update)
    shown: list[str] = []
    with session:
        for step, (x, y) in enumerate(DataLoader_(256)):
            with perfmagic.stage("data"):  # waiting for data, as a slow loader would
                time.sleep(0.03)
            time.sleep(0.01)  # work no hook sees: "other"
            loss = torch.nn.functional.mse_loss(MODEL(x), y)
            loss.backward()
            if panel._stages.value and (not shown or shown[-1] != panel._stages.value):
                shown.append(panel._stages.value)
            if step == 60:
                break
    panel.update(force=True)
    assert len(shown) >= 2, "the shares appear, and change, while the loop runs"
    live = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'data-stage="(\w+)" data-share="([\d.]+)"', panel._stages.value)
    }
    report = session.report.to_dict()["stages"]
    for name, share in live.items():  # the same split as the report, over (nearly) the same steps
        assert share == pytest.approx(report[name]["fraction"], abs=0.1), (name, live, report)
    assert live["data"] > 0.6 and 0.1 < live["other"] < 0.4
    assert panel._stages.value.count("<rect") >= 30  # a bar per recent step
    panel.close()
