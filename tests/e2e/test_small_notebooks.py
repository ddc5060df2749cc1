"""A notebook of reports stays small and keeps its charts: saved, reopened trusted, reopened untrusted.

BokehJS (1.3 MB) is in no saved output: the live panel's copy goes when the cell ends, and a reopened
report fetches it from the server extension; every report carries a PNG of its charts as well.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from browser import lab_page, screenshot

pytestmark = pytest.mark.slow

REPORTS = 10
SETUP = """\
%load_ext perfmagic
import time, perfmagic
def train(steps):
    for _ in range(steps):
        with perfmagic.stage("data"):
            time.sleep(0.004)
        with perfmagic.stage("forward"):
            time.sleep(0.002)
        perfmagic.step()
"""
CELL = "%%gpuprofile --interval 0.05   # run {i}\ntrain({steps})\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"
STILLS_SHOWN = f"""n => [...document.querySelectorAll("{CURRENT} .pm-report img[alt='perfmagic charts']")]
  .filter(img => img.naturalWidth > 0 && img.getBoundingClientRect().height > 0).length === n"""


@pytest.fixture(scope="module")
def ten_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nbclient import NotebookClient

    root = tmp_path_factory.mktemp("notebooks")
    nb = nbformat.v4.new_notebook()
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [CELL.format(i=i, steps=20 + 5 * i) for i in range(REPORTS)]
    nb.cells = [nbformat.v4.new_code_cell(src) for src in [SETUP, *cells]]
    NotebookClient(nb, kernel_name="python3", timeout=180, store_widget_state=True).execute()
    path = root / "reports.ipynb"
    nbformat.write(nb, path)
    return path


def test_ten_reports_stay_under_2_mb_with_a_png_each(ten_reports: Path) -> None:
    size = ten_reports.stat().st_size
    print(f"notebook with {REPORTS} reports: {size / 1e6:.2f} MB")
    assert size < 2_000_000
    nb = nbformat.read(ten_reports, as_version=4)
    reports = [
        o for c in nb.cells for o in c.outputs if "pm-report" in o.get("data", {}).get("text/html", "")
    ]
    assert len(reports) == REPORTS
    for out in reports:
        png = base64.b64decode(out.data["image/png"])
        assert png.startswith(PNG_MAGIC) and len(png) < 50_000
        assert 'src="data:image/png;base64,' in out.data["text/html"]  # what an untrusted view shows
    assert "Bokeh.set_log_level" not in json.dumps(nb)  # no copy of BokehJS itself was saved


@pytest.mark.browser
def test_reopened_reports_show_charts_untrusted_and_trusted(ten_reports: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "trusted.ipynb").write_bytes(ten_reports.read_bytes())
    nb = nbformat.read(ten_reports, as_version=4)
    nb.metadata["copy"] = "untrusted"  # signatures hash the content: a copy of the trusted one would pass
    nbformat.write(nb, root / "untrusted.ipynb")
    data_dir = tmp_path / "data"  # where lab_server keeps the notary's signatures
    data_dir.mkdir()
    env = {**os.environ, "JUPYTER_DATA_DIR": str(data_dir)}
    subprocess.run(
        [sys.executable, "-m", "jupyter", "trust", str(root / "trusted.ipynb")],
        env=env,
        check=True,
        timeout=60,
    )
    with lab_page(tmp_path, root_dir=root) as (_, _, page):
        page.evaluate(
            "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'untrusted.ipynb'})"
        )
        page.wait_for_function(STILLS_SHOWN, arg=REPORTS, timeout=30_000)
        assert page.locator(f"{CURRENT} .pm-report .bk-Canvas").count() == 0  # no script ran
        screenshot(page, "reports-untrusted")

        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'trusted.ipynb'})")
        page.locator(f"{CURRENT} .pm-report .bk-Canvas").first.wait_for(timeout=30_000)
        page.wait_for_function(STILLS_SHOWN, arg=0, timeout=30_000)  # the charts took their place
        screenshot(page, "reports-trusted")
