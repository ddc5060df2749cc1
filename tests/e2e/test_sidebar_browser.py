"""The GPU monitor sidebar: its TypeScript unit tests, and the real thing in JupyterLab and Chromium.

Screenshots: ``test-artifacts/sidebar-no-gpu.png`` (this machine: real NVML, no GPU) and
``test-artifacts/sidebar-gpu-monitor.png`` (fake NVML with two GPUs, one used by a notebook).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, lab_page, lab_server, open_lab, screenshot
from paths import REPO, TESTS

LABEXTENSION = REPO / "labextension"
PANEL = "#perfmagic-gpu-monitor"
TAB = 'li[data-id="perfmagic-gpu-monitor"]'

# Runs inside the lab server (its jupyter_server_config.py): two fake GPUs whose load moves
# over time, and GPU 0 used by every kernel of this server, so the sidebar can name the notebook.
FAKE_TWO_GPUS = f"""
import math, sys, time
sys.path.insert(0, {str(TESTS)!r})
import fake_nvml as fakes
from perfmagic.collect import nvml_query

GiB = 1024**3

class KernelPids(list):
    def _now(self):
        from jupyter_server.serverapp import ServerApp
        km = ServerApp.instance().kernel_manager
        pids = [getattr(km.get_kernel(k).provisioner, "pid", None) for k in list(km.list_kernel_ids())]
        return [(pid, 18 * GiB) for pid in pids if pid]
    def __iter__(self):
        return iter(self._now())
    def __len__(self):
        return len(self._now())

class LiveGpu(fakes.FakeGpu):
    phase = 0.0
    def _wave(self, lo, hi):
        return lo + (hi - lo) * (0.5 + 0.5 * math.sin(time.time() / 2.0 + self.phase))
    util_gpu = property(lambda self: int(self._wave(35, 98)), lambda self, v: None)
    power_mw = property(lambda self: int(self._wave(150_000, 650_000)), lambda self, v: None)
    temperature = property(lambda self: int(self._wave(48, 79)), lambda self, v: None)

gpu1 = LiveGpu(name="NVIDIA A100-SXM4-40GB", uuid="GPU-1", mem_total=40 * GiB, mem_used=6 * GiB,
               power_limit_mw=400_000, gpm=False, nvlink_links=0)
gpu1.phase = 2.0
fake = fakes.FakeNvml([LiveGpu(processes=KernelPids()), gpu1])
nvml_query._load_pynvml = lambda: fake
"""


# A rank of a distributed job, profiled by perfmagic: its session's status file says its rank and node.
RANK_PROCESS = """
import time, perfmagic
with perfmagic.profile(sources=[]):
    while True:
        perfmagic.step()
        time.sleep(0.05)
"""


def _seq(page: Any) -> int:
    return int(page.get_attribute(PANEL, "data-seq") or 0)


def _wait_seq(page: Any, above: int, timeout_ms: int = 15_000) -> int:
    page.wait_for_function(
        "([sel, n]) => Number(document.querySelector(sel)?.dataset.seq || 0) > n",
        arg=[PANEL, above],
        timeout=timeout_ms,
    )
    return _seq(page)


def _points(page: Any, key: str) -> int:
    return int(page.get_attribute(f'{PANEL} .pm-metric[data-key="{key}"] canvas', "data-points") or 0)


def test_typescript_logic() -> None:
    """Rate math, formatting, backoff and the no-GPU state: node's test runner on labextension/test/."""
    npm = shutil.which("npm")
    if npm is None or not (LABEXTENSION / "node_modules").is_dir():
        pytest.skip("needs npm and labextension/node_modules (`make install` builds the extension)")
    result = subprocess.run([npm, "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_without_gpu_says_why_and_pauses_when_hidden(tmp_path: Path) -> None:
    settings = {"perfmagic/plugin.jupyterlab-settings": {"refreshRate": 4}}
    with lab_page(tmp_path, user_settings=settings) as (base_url, token, page):
        page.locator(TAB).click()
        page.wait_for_selector(f"{PANEL}:visible")
        first = _wait_seq(page, 0)
        notice = page.locator(f"{PANEL} .pm-notice")
        notice.wait_for(state="visible")
        assert notice.inner_text().startswith("No GPU data: ")
        assert page.locator(f"{PANEL} .pm-gpu").count() == 0

        # host charts keep moving, at the rate from the settings (4 Hz)
        t0 = time.monotonic()
        later = _wait_seq(page, first + 6)
        assert time.monotonic() - t0 < 6
        assert _points(page, "host.cpu") >= later - first
        assert "%" in page.inner_text(f'{PANEL} .pm-metric[data-key="host.cpu"] .pm-metric-value')
        assert page.inner_text(f"{PANEL} .pm-status") == "live"
        screenshot(page, "sidebar-no-gpu")

        # collapsing the sidebar pauses the stream; opening it again resumes
        page.locator(TAB).click()
        page.wait_for_selector(f"{PANEL}", state="hidden")
        time.sleep(0.5)
        paused_at = _seq(page)
        time.sleep(1.5)
        assert _seq(page) == paused_at
        assert page.get_attribute(f"{PANEL} .pm-status", "data-state") == "paused"
        page.locator(TAB).click()
        _wait_seq(page, paused_at)

        # a proxy that drops WebSockets: the sidebar falls back to polling the REST snapshot
        blocked = page.context.new_page()
        blocked.route_web_socket(re.compile(r".*/perfmagic/api/stream.*"), lambda ws: ws.close())
        open_lab(blocked, base_url, token, workspace="no-websocket")
        if not blocked.locator(f"{PANEL}:visible").count():  # the layout may restore it open
            blocked.locator(TAB).click()
        blocked.wait_for_function(
            f"() => document.querySelector('{PANEL} .pm-status')?.dataset.state === 'polling'",
            timeout=20_000,
        )
        _wait_seq(blocked, _wait_seq(blocked, 0))


@pytest.fixture
def two_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Two running processes profiled as ranks 1 and 0 of one node, in a registry the lab server reads."""
    monkeypatch.setenv("PERFMAGIC_REGISTRY_DIR", str(tmp_path / "registry"))
    env = {**os.environ, "WORLD_SIZE": "2", "GROUP_RANK": "0"}
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK_PROCESS], env={**env, "RANK": r, "LOCAL_RANK": r})
        for r in ("1", "0")
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_charts_gpus_and_names_the_notebook(tmp_path: Path, two_ranks: list[int]) -> None:
    """Also: a distributed job's ranks on GPU 1 (real profiled processes) are listed by rank."""
    root = tmp_path / "root"
    root.mkdir()
    notebook = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": None}
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "train.ipynb").write_text(json.dumps(notebook))
    # behind a prefix, as JupyterHub serves it: REST and WebSocket URLs must both carry it
    on_gpu1 = f"gpu1.processes = {[(pid, 2 * 1024**3) for pid in two_ranks]!r}\n"
    config = FAKE_TWO_GPUS + on_gpu1
    with lab_page(tmp_path, root_dir=root, server_config=config, url_prefix="/jh/user/") as (
        base_url,
        _,
        page,
    ):
        assert base_url.endswith("/jh/user/")
        page.evaluate(
            "() => { void window.jupyterapp.commands.execute('docmanager:open', {path: 'train.ipynb'}); }"
        )
        page.locator(TAB).click()
        cards = page.locator(f"{PANEL} .pm-gpu")
        page.wait_for_function(f"() => document.querySelectorAll('{PANEL} .pm-gpu').length === 2")
        title = cards.nth(0).locator(".pm-card-title")
        assert title.inner_text() == "GPU 0 · NVIDIA H100 80GB HBM3"  # the whole name: it wraps
        assert "NVIDIA H100 80GB HBM3" in (title.get_attribute("title") or "")
        assert page.locator(f"{PANEL} .pm-notice").is_hidden()

        # the notebook's kernel shows up by name once it runs (kernel index refreshes every 2 s)
        row = page.locator(f"{PANEL} .pm-proc.pm-kernel .pm-proc-name")
        row.first.wait_for(timeout=45_000)
        page.wait_for_function(
            f"() => document.querySelector('{PANEL} .pm-proc.pm-kernel .pm-proc-name')?.innerText === 'train.ipynb'",
            timeout=20_000,
        )
        assert "18.0 GiB" in page.inner_text(f"{PANEL} .pm-proc-table")
        # ...and in its GPU's card, a bar of who holds the memory
        page.locator(f'{PANEL} .pm-gpu[data-gpu="0"] .pm-gpu-proc').first.wait_for(timeout=10_000)
        held = page.inner_text(f'{PANEL} .pm-gpu[data-gpu="0"] .pm-gpu-procs .pm-metric-value')
        assert "train.ipynb 18.0 GiB" in held

        # the job's ranks first in the list, in rank order, named by rank and node
        ranked = page.locator(f"{PANEL} .pm-proc[data-rank]")
        page.wait_for_function(
            f"() => document.querySelectorAll('{PANEL} .pm-proc[data-rank]').length === 2", timeout=20_000
        )
        node = f"{socket.gethostname()}#0"
        assert [ranked.nth(i).inner_text().split("\t")[0] for i in range(2)] == [
            f"rank 0 · {node}",
            f"rank 1 · {node}",
        ]
        assert page.locator(f"{PANEL} .pm-proc").first.get_attribute("data-rank") == "0"
        assert f"(pid {two_ranks[0]}), local rank 1" in (ranked.nth(1).get_attribute("title") or "")

        # charts update over time: more points, and the utilization text moves with the fake load
        util = f'{PANEL} .pm-metric[data-key="gpu0.util"] .pm-metric-value'
        start, texts = _seq(page), {page.inner_text(util)}
        points = _points(page, "gpu0.util")
        for _ in range(4):
            _wait_seq(page, _seq(page))
            texts.add(page.inner_text(util))
        assert _seq(page) >= start + 4 and _points(page, "gpu0.util") >= points + 4
        assert len(texts) > 1, texts
        for key in ("gpu0.mem", "gpu0.power", "gpu0.temp", "gpu1.util", "host.cpu", "host.mem"):
            assert _points(page, key) > 0, key
        # the power chart with the energy drawn since the panel opened (the fake GPU's counter rises)
        power = page.inner_text(f'{PANEL} .pm-metric[data-key="gpu0.power"] .pm-metric-value')
        assert re.fullmatch(r"\d+ / 700 W · [\d.]+ k?J so far", power) and not power.endswith(
            " 0 J so far"
        ), power
        assert "°C" in page.inner_text(f'{PANEL} .pm-metric[data-key="gpu0.temp"] .pm-metric-value')
        # PCIe (both GPUs) and NVLink (only GPU 0 has links) throughput, and the charts' time scale
        pcie = page.inner_text(f'{PANEL} .pm-metric[data-key="gpu0.pcie"] .pm-metric-value')
        assert re.fullmatch(r"↑ [\d.]+ GiB/s ↓ [\d.]+ GiB/s", pcie), pcie
        assert _points(page, "gpu1.pcie") > 0 and _points(page, "gpu0.nvlink") > 0
        assert page.locator(f'{PANEL} .pm-metric[data-key="gpu1.nvlink"]').count() == 0
        assert page.inner_text(f"{PANEL} .pm-timescale").startswith("charts: last 2 min")
        assert page.get_attribute(f"{PANEL} .pm-status", "data-state") == "live"  # the WebSocket
        path = screenshot(page, "sidebar-gpu-monitor")
        assert path.stat().st_size > 10_000


@pytest.mark.browser
@pytest.mark.slow
def test_sidebar_in_notebook_7(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "train.ipynb").write_text(
        json.dumps({"cells": [], "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5})
    )
    with (
        lab_server(tmp_path, root_dir=root, server_config=FAKE_TWO_GPUS, app="notebook") as server,
        chromium() as page,
    ):
        page.goto(f"{server.base_url}notebooks/train.ipynb?token={server.token}")
        page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
        page.evaluate("async () => { await window.jupyterapp.restored; }")
        assert "notebook" in page.evaluate("() => window.jupyterapp.name").lower()
        # as a user finds it: View > Left Sidebar > Show GPU monitor
        page.get_by_text("View", exact=True).first.click()
        page.get_by_text("Left Sidebar", exact=True).first.hover()
        page.get_by_text("Show GPU monitor", exact=True).click()
        page.wait_for_selector(f"{PANEL}:visible")
        page.wait_for_function(f"() => document.querySelectorAll('{PANEL} .pm-gpu').length === 2")
        first = _wait_seq(page, 0)
        _wait_seq(page, first + 2)
        assert _points(page, "gpu0.util") > 0 and _points(page, "host.cpu") > 0
        screenshot(page, "sidebar-notebook7")
