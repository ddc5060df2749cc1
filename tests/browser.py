"""Real JupyterLab in headless Chromium, for browser tests.

``lab_server`` starts ``jupyter lab`` with every Jupyter directory isolated under a temp dir, a
known token and ``window.jupyterapp`` exposed; ``lab_page`` adds a Chromium page (Debian's
``/usr/bin/chromium`` through Playwright) with JupyterLab loaded; ``screenshot`` saves into
``test-artifacts/``. Typical use::

    with lab_page(tmp_path) as (base_url, token, page):
        page.locator('li[data-id="perfmagic-gpu-monitor"]').click()
        screenshot(page, "sidebar")

``server_config`` is Python written to the isolated ``jupyter_server_config.py``: it runs in the
server process, which is how a test installs a fake NVML there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
BUILT_SIDEBAR = REPO / "perfmagic" / "labextension"
CHROMIUM = os.environ.get("PERFMAGIC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Settings every test lab gets: no "official Jupyter news?" toast over the screenshots.
USER_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
TOKEN = "perfmagic-test-token"


class LabServer(NamedTuple):
    base_url: str  # ends with "/"
    token: str
    root_dir: Path
    log: Path


class LabPage(NamedTuple):
    base_url: str
    token: str
    page: Any  # playwright.sync_api.Page


def require_browser() -> None:
    """Skip (with the fix) when Chromium or Playwright is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `make browser` (apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def lab_server(
    tmp: Path,
    *,
    root_dir: Path | None = None,
    server_config: str = "",
    user_settings: dict[str, Any] | None = None,
    args: Sequence[str] = (),
    url_prefix: str = "/",
    timeout: float = 90.0,
    app: str = "jupyterlab",
) -> Iterator[LabServer]:
    """Run ``jupyter lab`` (``app="notebook"``: Notebook 7) until the block ends; its log goes to ``tmp/lab.log``.

    ``url_prefix`` is the server's ``base_url`` (``/jh/user/``: as behind JupyterHub's proxy). The
    sidebar served is this checkout's build, whichever perfmagic the venv has installed.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    root = root_dir or tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    dirs = {
        "JUPYTER_CONFIG_DIR": tmp / "config",
        "JUPYTER_DATA_DIR": tmp / "data",
        "JUPYTER_RUNTIME_DIR": tmp / "runtime",
        "IPYTHONDIR": tmp / "ipython",
        "JUPYTERLAB_SETTINGS_DIR": tmp / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": tmp / "lab-workspaces",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    if BUILT_SIDEBAR.is_dir():  # JUPYTER_PATH comes first on the labextensions path, before the venv's
        dirs["JUPYTER_PATH"] = tmp / "path"
        (tmp / "path" / "labextensions").mkdir(parents=True, exist_ok=True)
        (tmp / "path" / "labextensions" / "perfmagic").symlink_to(BUILT_SIDEBAR)
    (dirs["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.py").write_text(server_config)
    for name, value in {**USER_SETTINGS, **(user_settings or {})}.items():
        path = dirs["JUPYTERLAB_SETTINGS_DIR"] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = {**os.environ, **{k: str(v) for k, v in dirs.items()}, "PYTHONUNBUFFERED": "1"}
    port = _free_port()
    cmd = [
        sys.executable, "-m", app, "--no-browser",
        f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
        f"--{'JupyterNotebookApp' if app == 'notebook' else 'LabApp'}.expose_app_in_browser=True",
        f"--ServerApp.base_url={url_prefix}", *args,
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    prefix = url_prefix.strip("/")
    base_url = f"http://127.0.0.1:{port}/{prefix}/" if prefix else f"http://127.0.0.1:{port}/"
    log = tmp / "lab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, f"{base_url}api/status?token={TOKEN}", timeout, log)
            yield LabServer(base_url, TOKEN, root, log)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"jupyter lab not ready after {timeout} s:\n{log.read_text()[-3000:]}")


@contextmanager
def chromium(viewport: tuple[int, int] = (1280, 800)) -> Iterator[Any]:
    """A page in a fresh headless Chromium; ``page.context.new_page()`` adds more. Closed with the block."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # An explicit context, so a test can open more pages that share its login cookie.
            context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
            yield context.new_page()
        finally:
            browser.close()


@contextmanager
def lab_page(tmp: Path, **server_options: Any) -> Iterator[LabPage]:
    """JupyterLab started, opened in Chromium, and restored: yields (base_url, token, page)."""
    require_browser()
    with lab_server(tmp, **server_options) as server, chromium() as page:
        open_lab(page, server.base_url, server.token)
        yield LabPage(server.base_url, server.token, page)


def open_lab(page: Any, base_url: str, token: str, workspace: str | None = None) -> None:
    """Load JupyterLab in ``page`` and wait until its layout is restored.

    A second page on the same workspace makes JupyterLab navigate to a new one mid-load:
    give each extra page its own ``workspace``.
    """
    path = f"lab/workspaces/{workspace}" if workspace else "lab"
    page.goto(f"{base_url}{path}?token={token}")
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")


def screenshot(page: Any, name: str) -> Path:
    """Save a PNG of the page as ``test-artifacts/<name>.png``."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def copy_artifact(src: Path, name: str) -> Path:
    """Keep a file (a server log, say) next to the screenshots."""
    ARTIFACTS.mkdir(exist_ok=True)
    dest = ARTIFACTS / name
    shutil.copyfile(src, dest)
    return dest


# Bokeh draws in shadow DOM and on canvas: the rank waterfall is read from its BokehJS model.
_RANK_WATERFALL_JS = """(name) => {
  const doc = (window.Bokeh?.documents || []).find(d => d.get_model_by_name(name));
  if (!doc) return null;
  const fig = doc.get_model_by_name(name);
  return {factors: fig.y_range.factors,
          rows: fig.renderers.map(r => [r.name, [...new Set(r.data_source.data.y)]])};
}"""


def rank_waterfall(page: Any, timeout_ms: int = 30_000) -> dict[str, Any]:
    """The per-rank waterfall once drawn: its rows (``factors``, top last) and, per stage, the rows it
    has bars in (``rows``: ``[[stage, [row, ...]], ...]``)."""
    from perfmagic.render.ranks import WATERFALL_NAME

    page.locator(".pm-ranks .bk-Canvas").first.wait_for(timeout=timeout_ms)
    handle = page.wait_for_function(_RANK_WATERFALL_JS, arg=WATERFALL_NAME, timeout=timeout_ms)
    found: dict[str, Any] = handle.json_value()
    return found


def heat_cells(page: Any) -> dict[int, dict[str, float]]:
    """The rank × stage heat table as shown: per rank, per stage, the seconds its cell holds."""
    cells = page.eval_on_selector_all(
        ".pm-rank-heat td.pm-heat",
        "els => els.map(e => [e.closest('tr').dataset.rank, e.dataset.stage, e.dataset.seconds])",
    )
    out: dict[int, dict[str, float]] = {}
    for rank, stage, seconds in cells:
        out.setdefault(int(rank), {})[stage] = float(seconds)
    return out


def assert_ranks_shown(page: Any, report: dict[str, Any]) -> None:
    """The report's ranks section as the page shows it: a waterfall row with bars for every rank, the
    straggler marked in both, heat cells equal to the report's per-rank stage means."""
    straggler = report["straggler"]["rank"]
    ranks = {r["rank"]: r for r in report["ranks"]}
    labels = {r: f"rank {r}" + (" (straggler)" if r == straggler else "") for r in ranks}
    chart = rank_waterfall(page)
    assert chart["factors"] == [labels[r] for r in sorted(ranks, reverse=True)]
    assert {row for _, rows in chart["rows"] for row in rows} == set(labels.values())
    assert {stage for stage, _ in chart["rows"]} >= {"data", "comm"}
    shown = heat_cells(page)
    assert shown == {r: {n: s["mean_s"] for n, s in ranks[r]["stages"].items()} for r in ranks}
    marked = page.locator(".pm-rank-heat tr.pm-straggler")
    assert marked.count() == 1 and marked.get_attribute("data-rank") == str(straggler)
    outlined = marked.locator("td.pm-straggler-stage")
    assert outlined.get_attribute("data-stage") == report["straggler"]["stage"]
