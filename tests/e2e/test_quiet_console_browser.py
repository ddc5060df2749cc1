"""A session of profiled cells and a GPU monitor in JupyterLab leaves the browser's console quiet.

Ten short ``%%gpuprofile`` cells (a live panel each, then its report) and ``%gpumonitor`` started and
stopped, in a real JupyterLab in headless Chromium: no warning or error in the browser's console,
and nothing in JupyterLab's log console (where the kernel's "No such comm" warnings land: a message
the browser sent on a comm the kernel had closed). Then saved, closed with its kernel shut down and
reopened after a reload: no output refers to a widget, so none is "model not found", and the
console stays quiet while the reports draw again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from browser import lab_page, open_lab, screenshot

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NOTEBOOK = "quiet.ipynb"
PROFILED = 10
SETUP = """\
%load_ext perfmagic
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
CELL = """\
%%gpuprofile --interval 0.05   # run {i}
for _ in range({steps}):
    loss = model(torch.randn(64, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
CELLS = [
    SETUP,
    *(CELL.format(i=i, steps=150 + 20 * i) for i in range(PROFILED)),
    "%gpumonitor --interval 0.1",
    "%gpumonitor stop",
]
STOP = len(CELLS) - 1  # the cells above it run first, the monitor's start last
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The notebook's JupyterLab logger at the level its status-bar count shows (warning): kernel output
# that belongs to no cell, a comm message's warning say, lands there. The registry is looked up among
# the app's services by its token's name: the token itself is not reachable from the page.
LOGGER = f"""async () => {{
  const registry = window.jupyterapp.pluginRegistry;
  const token = [...registry._services.keys()].find(t => t.name === '@jupyterlab/logconsole:ILoggerRegistry');
  if (!token) return false;
  const logger = (await registry.resolveRequiredService(token)).getLogger('{NOTEBOOK}');
  logger.level = 'warning';
  logger.clear();  // the line saying which level
  window.pmLogger = logger;
  return true;
}}"""
LOGGED = """() => window.pmLogger.outputAreaModel.toJSON()
  .map(o => o.text || JSON.stringify(o.data || o.evalue || o))"""
# Not perfmagic's: on connecting to a kernel that has not imported ipywidgets yet, JupyterLab's widget
# manager opens its control comm anyway, and the kernel says so; ipywidgets falls back, and calls the
# message harmless (jupyter-widgets/ipywidgets#3525). The comm is the page's (a dashed uuid); perfmagic's
# comms are the kernel's (uuid4().hex).
WIDGETS_CONTROL = re.compile(
    r"No such comm target registered: jupyter\.widget\.control\n"
    r"(No such comm: [0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\n)?"
)
OPEN = f"""async () => {{
  const panel = await window.jupyterapp.commands.execute(
    'docmanager:open', {{path: '{NOTEBOOK}', factory: 'Notebook', kernel: {{name: 'python3'}}}});
  await panel.context.sessionContext.ready;
  await panel.context.sessionContext.session.kernel.info;
}}"""
# Counts the live panels the page ever showed, however briefly: the test must have watched some.
COUNT_PANELS = """() => {
  window.pmPanels = 0;
  const seen = new WeakSet();
  new MutationObserver(() => {  // a view gets its classes once in the page: look at both changes
    for (const el of document.querySelectorAll('.perfmagic-live'))
      if (!seen.has(el)) { seen.add(el); window.pmPanels++; }
  }).observe(document.body, {childList: true, subtree: true, attributes: true, attributeFilter: ['class']});
}"""
# Run the cells above ``index`` (``notebook:run-cell``: that cell alone); not awaited.
RUN = """([index, command]) => {
  window.jupyterapp.shell.currentWidget.content.activeCellIndex = index;
  void window.jupyterapp.commands.execute(command);
}"""
# 'done' once cells 0..index have run, 'error' as soon as one of them failed.
RAN = """(index) => {
  const cells = window.jupyterapp.shell.currentWidget.content.widgets.slice(0, index + 1);
  const failed = cells.some(c => c.model.outputs && [...Array(c.model.outputs.length).keys()]
    .some(i => c.model.outputs.get(i).type === 'error'));
  if (failed) return 'error';
  return cells.every(c => c.model.executionCount !== null) ? 'done' : false;
}"""
# An empty execution behind every message the page sent before it: the kernel reads its shell
# messages in order, so once this one is done, any warning about an earlier one has been written.
DRAIN = """async () => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  await kernel.requestExecute({code: '', silent: true, store_history: false}).done;
}"""
SAVE = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.context.save();
  return panel.context.model.dirty;
}"""
SHUT_AND_CLOSE = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.sessionContext.shutdown();
  panel.close();
}"""
# The reports' charts drawn again: the embed script hides each report's still PNG once BokehJS drew.
REDRAWN = f"""n => {{
  const stills = document.querySelectorAll("{CURRENT} .pm-report img[alt='perfmagic charts']");
  return document.querySelectorAll("{CURRENT} .pm-report:not(.pm-monitor)").length === n && stills.length >= n
    && [...stills].every(img => img.style.display === 'none');
}}"""


def run_until(page: Any, index: int, command: str, timeout_ms: int) -> None:
    page.evaluate(RUN, [index, command])
    last = index if command == "notebook:run-cell" else index - 1
    state = page.wait_for_function(RAN, arg=last, timeout=timeout_ms, polling=500).json_value()
    assert state == "done", page.locator(f"{CURRENT} .jp-OutputArea-output").all_inner_texts()[-3:]


def noisy(console: list[tuple[str, str]]) -> list[str]:
    return [f"{kind}: {text}" for kind, text in console if kind in ("error", "warning")]


def logged(page: Any) -> list[str]:
    """What the notebook's log console holds, less ipywidgets' own note on a kernel without it."""
    texts = [WIDGETS_CONTROL.sub("", text) for text in page.evaluate(LOGGED)]
    return [t for t in texts if t.strip()]


def test_a_session_of_profiled_cells_and_a_monitor_leaves_the_console_quiet(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / NOTEBOOK)
    console: list[tuple[str, str]] = []
    with lab_page(tmp_path, root_dir=root) as (base_url, token, page):
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: console.append(("error", str(e))))
        assert page.evaluate(LOGGER), "JupyterLab's logger registry not found"
        page.evaluate(OPEN)
        page.evaluate(COUNT_PANELS)

        # The profiled cells and the monitor's start; the monitor draws before it is stopped.
        run_until(page, STOP, "notebook:run-all-above", timeout_ms=600_000)
        line = page.locator(f"{CURRENT} .perfmagic-live svg.pm-live-chart polyline").first
        line.wait_for(state="attached", timeout=60_000)  # attached: a flat line has no height to be "visible"
        run_until(page, STOP, "notebook:run-cell", timeout_ms=120_000)
        page.locator(f"{CURRENT} .pm-live-snapshot").wait_for(timeout=30_000)
        page.evaluate(DRAIN)
        assert page.evaluate("() => window.pmPanels") >= PROFILED + 1, "the live panels were shown"
        assert page.locator(f"{CURRENT} .pm-report:not(.pm-monitor)").count() == PROFILED
        assert page.locator(f"{CURRENT} .perfmagic-live").count() == 0  # each became its report or snapshot
        screenshot(page, "quiet-console-session")
        assert logged(page) == [], "JupyterLab's log console"
        assert noisy(console) == [], "the browser's console while the cells ran"

        # Saved, closed with its kernel shut down, reopened after a reload: nothing needs a widget.
        assert page.evaluate(SAVE) is False, "saved"
        saved = nbformat.read(root / NOTEBOOK, as_version=4)
        assert not [o for c in saved.cells for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
        page.evaluate(SHUT_AND_CLOSE)
        console.clear()
        open_lab(page, base_url, token)
        assert page.evaluate(LOGGER), "JupyterLab's logger registry not found"
        page.evaluate(OPEN)
        page.wait_for_function(REDRAWN, arg=PROFILED, timeout=120_000, polling=500)
        # the monitor's snapshot is the last cells' output: on a busy machine it is drawn after the reports
        snapshot = page.locator(f"{CURRENT} .pm-live-snapshot svg.pm-live-chart polyline").first
        snapshot.wait_for(state="attached", timeout=60_000)
        page.evaluate(DRAIN)
        screenshot(page, "quiet-console-reopened")
        assert logged(page) == [], "JupyterLab's log console, reopened"
        assert noisy(console) == [], "the browser's console, reopened"
