"""What a profiled process imports at start: nothing that only the report needs, never dynamo.

Every Python process ``perfmagic run`` profiles (ranks, spawned workers) starts perfmagic before
its first line. The analysis, advice and render layers, numpy and ``torch._dynamo`` (1.5 to 5 s)
would each cost it a large part of a second; these tests check that they are not loaded, by the
modules a fresh interpreter holds rather than by a time that moves with the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfmagic.children import INTERVAL_ENV, RUN_DIR_ENV, write_sitecustomize
from tests.paths import REPO

REPORT_ONLY = [
    "perfmagic.analyze",
    "perfmagic.advise",
    "perfmagic.render",
    "perfmagic.report",
    "perfmagic.merge",
    "perfmagic.traces",
    "perfmagic.compare",
    "perfmagic.contract.report",
    "perfmagic.contract.comparison",
]
"""perfmagic's layers that only building a report needs (the report's typed sections among them)."""
HEAVY = ["numpy", "pandas", "bokeh", "matplotlib", "jinja2", "psutil", "pynvml", "msgspec"]
"""Libraries that a process which imports none of them must not pay for at start."""

LOADED = "import json, sys; print(json.dumps(sorted(m for m in {names} if m in sys.modules)))"


def profiled_python(code: str, run_dir: Path) -> list[str]:
    """Run ``code`` in a fresh interpreter profiled as ``perfmagic run`` profiles its command's; its
    last line of output, as JSON."""
    boot = write_sitecustomize(run_dir / "boot").parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(boot), str(REPO)]),
        RUN_DIR_ENV: str(run_dir),
        INTERVAL_ENV: "0.1",
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def test_a_profiled_process_starts_without_the_report_layers_or_heavy_libraries(tmp_path: Path) -> None:
    names = [*REPORT_ONLY, *HEAVY, "torch", "perfmagic.session"]
    loaded = profiled_python(LOADED.format(names=names), tmp_path)
    assert loaded == ["perfmagic.session"]  # profiled, and with nothing else
    (record,) = tmp_path.glob("proc-*")
    # the record is finished at exit; the report is perfmagic run's to build, from the records
    assert (record / "timeline.jsonl").stat().st_size > 0 and not (record / "report.json").exists()


def test_importing_torch_under_profiling_hooks_it_without_importing_dynamo(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    names = [*REPORT_ONLY, "torch._dynamo", "perfmagic.collect.torch_hooks"]
    code = "import torch\n" + LOADED.format(names=names)
    assert profiled_python(code, tmp_path) == ["perfmagic.collect.torch_hooks"]


COMPILED_LATER = """
import contextlib, json, sys
import perfmagic
profiled = perfmagic.profile(sample=False) if sys.argv[1] == "profiled" else contextlib.nullcontext()
with profiled:
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    model(x)
    before = "torch._dynamo" in sys.modules
    model.compile(backend="eager")  # dynamo is imported here, inside the profiled block
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
from torch._dynamo.utils import counters
print(json.dumps([before, dict(counters["stats"]), sum(counters["graph_break"].values())]))
"""


def test_a_model_compiled_after_the_hooks_gets_only_its_own_graphs() -> None:
    """Dynamo imported after the hooks were installed still skips their frames: the same graphs as
    without perfmagic, no graph break."""
    pytest.importorskip("torch")

    def run(mode: str) -> list[object]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run(
            [sys.executable, "-c", COMPILED_LATER, mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        out: list[object] = json.loads(result.stdout.strip().splitlines()[-1])
        return out

    plain, profiled = run("plain"), run("profiled")
    assert profiled[0] is False  # the hooks themselves did not import dynamo
    assert profiled[1:] == plain[1:] and plain[2] == 0


def test_a_record_ended_without_a_report_still_reports_when_asked(tmp_path: Path) -> None:
    """``end_record`` (what a process under ``perfmagic run`` does at exit) writes the spool and no
    report; ``stop`` afterwards builds the report from what was recorded."""
    import perfmagic

    session = perfmagic.profile(sample=False, outdir=tmp_path).start()
    for _ in range(4):
        perfmagic.step()
    session.end_record()
    assert (tmp_path / "timeline.jsonl").stat().st_size > 0 and not (tmp_path / "report.json").exists()
    assert session.stop().steps["count"] == 4  # each step() ends one, the first from the start
    assert (tmp_path / "report.json").exists()
