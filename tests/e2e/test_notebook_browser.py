"""%%gpuprofile in a real JupyterLab, driven in headless Chromium: the live panel moves, the report renders."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import assert_ranks_shown, lab_page, screenshot
from paths import EXAMPLES

pytestmark = [pytest.mark.slow, pytest.mark.browser]

SETUP = """\
%load_ext perfmagic
import time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(32), torch.randn(1)

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
TRAIN = """\
%%gpuprofile --interval 0.1
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=16)):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 250:
        break
step
"""
# Two DDP ranks started from the notebook (the example notebook's workers), rank 1 slow to load data:
# its report has a ranks section; the next cell hands that report to the test.

RANKS = f"""\
%%gpuprofile -v job
import os, socket, sys
import torch.multiprocessing as mp
sys.path.insert(0, {str(EXAMPLES)!r})
import ddp_workers
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
mp.spawn(ddp_workers.train, args=(2, 1), nprocs=2)
"""
SAVE = 'job.to_json("job.tmp"); os.replace("job.tmp", "job.json")  # whole, once there'
# Open the notebook on a python3 kernel (no kernel dialog) and wait until the kernel is ready.
OPEN = """async () => {
  const panel = await window.jupyterapp.commands.execute(
    'docmanager:open', {path: 'train.ipynb', factory: 'Notebook', kernel: {name: 'python3'}});
  await panel.context.sessionContext.ready;
  await panel.context.sessionContext.session.kernel.info;
}"""


# From the notebook's cell ``index``: run the cells above it, or (``notebook:run-all-below``) it and
# those below. Not awaited: the live panel is watched while the cells run.
RUN_FROM = """([index, command = 'notebook:run-all-above']) => {
  window.jupyterapp.shell.currentWidget.content.activeCellIndex = index;
  void window.jupyterapp.commands.execute(command);
}"""


def steps_shown(page: Any) -> int | None:
    text = page.locator(".perfmagic-live .pm-live-steps").first.inner_text(timeout=1000)
    return int(text) if re.fullmatch(r"\d+", text) else None


def test_gpuprofile_in_jupyterlab(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in (SETUP, TRAIN, RANKS, SAVE)])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "train.ipynb")
    errors: list[str] = []
    with lab_page(tmp_path, root_dir=root) as (_, _, page):
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.evaluate(OPEN)
        # the training cell and the one before it; the multi-rank job's cells after these checks
        page.evaluate(RUN_FROM, [2])

        # While the cell runs: the panel appears and its numbers move.
        page.locator(".perfmagic-live").wait_for(timeout=90_000)
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(set(seen)) < 3:
            n = steps_shown(page)
            if n:
                seen.append(n)
            time.sleep(0.4)
        assert len(set(seen)) >= 3 and seen == sorted(seen), f"live step counts: {seen}"
        # ...and the share of step time per stage builds up, input-bound as the report will say
        share = page.locator(".perfmagic-live .pm-live-share[data-stage='data']")
        share.wait_for(timeout=30_000)
        assert float(share.get_attribute("data-share") or 0) > 0.3
        assert page.locator(".perfmagic-live svg.pm-live-recent rect").count() >= 5
        assert re.search(r"\d+%", page.locator(".perfmagic-live .pm-live-cpu").inner_text())
        assert "No GPU" in page.locator(".perfmagic-live .pm-live-gpus").inner_text()
        chart = page.locator(".perfmagic-live svg.pm-live-chart polyline")  # utilization, drawn in the kernel
        assert chart.count() >= 1
        page.locator(".perfmagic-live").scroll_into_view_if_needed()
        screenshot(page, "notebook-live-panel")

        # After it: the panel has become the report, with the waterfall and the advice cards.
        report = page.locator(".pm-report").first
        report.wait_for(timeout=120_000)
        page.locator(".pm-report .bk-Canvas").nth(2).wait_for(timeout=30_000)
        assert page.locator(".pm-report .bk-Canvas").count() >= 3  # waterfall, breakdown, utilization, ...
        assert page.locator(".perfmagic-live").count() == 0
        cards = page.locator(".pm-report .pm-card")
        assert cards.count() >= 1
        assert any(
            cards.nth(i).get_attribute("data-advice-id") in {"input_bound", "dataloader_workers"}
            for i in range(cards.count())
        )
        assert "Bottleneck" in report.inner_text()
        assert page.locator(".jp-OutputArea-executeResult").last.inner_text().strip().endswith("250")
        report.scroll_into_view_if_needed()
        screenshot(page, "notebook-report")
        page.locator(".pm-report .pm-card").first.scroll_into_view_if_needed()
        screenshot(page, "notebook-advice-cards")

        # Fix code wraps inside its card (nothing hidden past the edge), and Copy copies it as written.
        fixes = page.locator(".pm-report .pm-fix pre")
        for i in range(fixes.count()):
            assert fixes.nth(i).evaluate("el => el.scrollWidth <= el.clientWidth + 1"), "fix code cut off"
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        fix = page.locator(".pm-report .pm-fix").first
        fix.locator(".pm-copy").click()
        page.wait_for_function(
            "() => document.querySelector('.pm-report .pm-copy').textContent === 'Copied'", timeout=5000
        )
        copied = page.evaluate("() => navigator.clipboard.readText()")
        assert copied == fix.locator("pre").evaluate("el => el.textContent") and "\n" in copied
        assert page.locator(".pm-ranks").count() == 0  # one process: no ranks section

        # A multi-rank job: its report shows each rank over time and the rank × stage table.
        page.evaluate(RUN_FROM, [2, "notebook:run-all-below"])
        page.locator(".pm-report .pm-ranks").wait_for(timeout=180_000)
        saved = root / "job.json"
        deadline = time.monotonic() + 30
        while not saved.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert_ranks_shown(page, json.loads(saved.read_text()))
        page.locator(".pm-ranks").scroll_into_view_if_needed()
        screenshot(page, "notebook-ranks")
    assert not [e for e in errors if "Bokeh" in e or "perfmagic" in e], errors
