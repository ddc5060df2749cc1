"""The cluster view: a real Prometheus scraping two exporters, read through the server extension."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from contract_checks import mismatches
from exporters import Exporters, profiled, training

from perfmagic.server.cluster import ClusterView

pytestmark = pytest.mark.slow

SCRAPE = "500ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus(NamedTuple):
    url: str
    work: Path  # where the nodes' session registries are (``registry``)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Debian's Prometheus on 127.0.0.1, scraping two exporters every half second: ``node-a`` with an
    H100 and an A100 (``two_gpus``), ``node-b`` with a GeForce (``fields_not_supported``)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("no prometheus on PATH: `make prometheus` installs Debian's (part of `make test`)")
    work = tmp_path_factory.mktemp("prometheus")
    exporters = Exporters(work)
    targets = [
        exporters.start(scenario, host, registry(work, host)).removeprefix("http://").removesuffix("/metrics")
        for scenario, host in NODES
    ]
    config = work / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE},
                "scrape_configs": [{"job_name": "perfmagic", "static_configs": [{"targets": targets}]}],
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_both_nodes(url, proc)
        yield Prometheus(url, work)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        exporters.close()


NODES = [("two_gpus", "node-a"), ("fields_not_supported", "node-b")]


def registry(work: Path, host: str) -> Path:
    """Where the sessions of ``host`` (a "node" of the test) publish their status."""
    return work / f"registry-{host}"


def wait_for_both_nodes(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until Prometheus holds a utilization sample of every GPU (a minute at most)."""
    query = url + "/api/v1/query?query=DCGM_FI_DEV_GPU_UTIL"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            with urllib.request.urlopen(query, timeout=2) as r:
                if len(json.load(r)["data"]["result"]) == 3:
                    return
        except OSError:
            pass  # not listening yet
        time.sleep(0.2)
    raise AssertionError("Prometheus never had both nodes' GPUs")


@pytest.fixture
def jp_server_config(prometheus: Prometheus) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"perfmagic.server": True}},
        "PerfmagicExtension": {"prometheus_url": prometheus.url},
    }


async def cluster(jp_fetch: Any) -> dict[str, Any]:
    """The cluster view as the sidebar gets it, checked against its declared type (which the sidebar's
    TypeScript types are generated from)."""
    response = await jp_fetch("perfmagic", "api", "cluster")
    view: dict[str, Any] = json.loads(response.body)
    assert not mismatches(view, ClusterView), mismatches(view, ClusterView)
    return view


async def test_the_cluster_view_has_every_node_and_gpu_busiest_first(
    jp_fetch: Any, prometheus: Prometheus
) -> None:
    view = await cluster(jp_fetch)
    assert view["prometheus"] == {"configured": True, "reachable": True, "error": None}
    assert [n["hostname"] for n in view["nodes"]] == ["node-a", "node-b"]  # node-a's H100 is the busiest
    h100, a100 = view["nodes"][0]["gpus"]
    assert (h100["model"], h100["util_pct"], h100["fb_used_mib"]) == ("NVIDIA H100 80GB HBM3", 87, 20 * 1024)
    assert h100["power_w"] == pytest.approx(250.12)
    assert (a100["model"], a100["util_pct"], a100["fb_used_mib"]) == ("NVIDIA A100-SXM4-40GB", 0, 4)
    assert h100["util_history"] and all(v == 87 for _, v in h100["util_history"])
    geforce = view["nodes"][1]["gpus"][0]
    assert geforce["model"] == "NVIDIA GeForce GTX 1080" and geforce["power_w"] is None  # not supported there
    assert prometheus.url not in json.dumps(view)  # the URL stays on the server


async def test_a_prometheus_that_is_down_gives_a_clear_state(jp_fetch: Any, jp_serverapp: Any) -> None:
    jp_serverapp.web_app.settings["perfmagic_prometheus_url"] = f"http://127.0.0.1:{free_port()}"
    view = await cluster(jp_fetch)
    assert view["prometheus"]["configured"] and not view["prometheus"]["reachable"]
    assert view["prometheus"]["error"] and view["nodes"] == []


async def test_without_a_prometheus_url_the_view_says_it_is_not_configured(
    jp_fetch: Any, jp_serverapp: Any
) -> None:
    jp_serverapp.web_app.settings["perfmagic_prometheus_url"] = ""
    view = await cluster(jp_fetch)
    assert view == {"prometheus": {"configured": False, "reachable": False, "error": None}, "nodes": []}


async def test_two_jobs_show_their_ranks_under_their_nodes(jp_fetch: Any, prometheus: Prometheus) -> None:
    work = prometheus.work
    jobs = [training(registry(work, "node-a"), rank=0), training(registry(work, "node-b"), rank=1)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = await cluster(jp_fetch)
            ranks = {n["hostname"]: n["ranks"] for n in view["nodes"]}
            if all(r and r[0]["steps_per_s"] for r in ranks.values()):
                break
            await asyncio.sleep(0.3)
        for (node, rank), job in zip((("node-a", 0), ("node-b", 1)), jobs, strict=True):
            (process,) = ranks[node]
            assert process["rank"] == rank and process["pid"] in profiled(job), ranks
        assert all(5 < r[0]["steps_per_s"] < 200 for r in ranks.values()), ranks  # a step every 10 ms
    finally:
        for job in jobs:
            job.terminate()
            job.wait(timeout=30)


@pytest.mark.browser
def test_the_sidebar_shows_every_node_of_the_cluster_and_says_when_prometheus_is_down(
    tmp_path: Path, prometheus: Prometheus
) -> None:
    from browser import lab_page, screenshot
    from test_sidebar_browser import PANEL, TAB

    config = f"c.PerfmagicExtension.prometheus_url = {prometheus.url!r}\n"
    with lab_page(tmp_path / "up", server_config=config) as (_, _, page):
        page.locator(TAB).click()
        page.wait_for_selector(f"{PANEL} .pm-cluster .pm-node", timeout=30_000)
        hosts = page.locator(f"{PANEL} .pm-node-head").all_inner_texts()
        assert hosts == ["node-a · 2 GPUs", "node-b · 1 GPU"]
        rows = page.locator(f"{PANEL} .pm-node-gpu").all_inner_texts()
        assert "NVIDIA H100 80GB HBM3" in rows[0] and "87%" in rows[0] and "250 W" in rows[0], rows
        assert "NVIDIA GeForce GTX 1080" in rows[2]
        screenshot(page, "sidebar-cluster")
    down = f"c.PerfmagicExtension.prometheus_url = 'http://127.0.0.1:{free_port()}'\n"
    with lab_page(tmp_path / "down", server_config=down) as (_, _, page):
        page.locator(TAB).click()
        notice = page.locator(f"{PANEL} .pm-cluster-notice")
        notice.wait_for(state="visible", timeout=30_000)
        assert notice.inner_text().startswith("Prometheus unreachable: ")
        assert page.locator(f"{PANEL} .pm-node").count() == 0
        page.wait_for_selector(f"{PANEL} .pm-metric", timeout=30_000)  # this machine's own view goes on
