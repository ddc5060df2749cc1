"""Server extension: authentication, snapshot shape, the stream, kernel mapping, no-GPU state."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import fake_nvml as fakes
import pytest
import tornado.httpclient
import tornado.websocket
from jupyter_server.utils import url_path_join

from perfmagic.server.kernels import KernelIndex
from perfmagic.server.service import MAX_HZ, MIN_HZ, clamp_rate

GiB = 1024**3


SNAPSHOT = "perfmagic/api/snapshot"
STREAM = "perfmagic/api/stream"


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"perfmagic.server": True}}}


def _monitor(jp_serverapp: Any) -> Any:
    return jp_serverapp.web_app.settings["perfmagic_monitor"]


async def _snapshot(jp_fetch: Any) -> dict[str, Any]:
    r = await jp_fetch(*SNAPSHOT.split("/"))
    assert r.code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    snap: dict[str, Any] = json.loads(r.body)
    return snap


def _check_shape(snap: dict[str, Any]) -> None:
    assert snap["schema"] == "perfmagic.snapshot/1"
    assert set(snap) >= {"gpus", "processes", "host", "nvml", "time", "seq", "interval_s", "age_s"}
    host = snap["host"]
    assert host["cpu_count"] >= 1
    assert 0.0 <= host["cpu_util"] <= 1.0
    assert 0 < host["mem_used_bytes"] <= host["mem_total_bytes"]
    assert 0.0 <= host["mem_util"] <= 1.0
    assert isinstance(snap["nvml"]["available"], bool)


async def test_snapshot_requires_token(http_server_client: Any, jp_base_url: str) -> None:
    url = url_path_join(jp_base_url, SNAPSHOT)
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await http_server_client.fetch(url)
    assert e.value.code == 403


async def test_bokehjs_for_reopened_reports_is_served_to_the_logged_in_only(
    jp_fetch: Any, http_server_client: Any, jp_base_url: str
) -> None:
    import bokeh

    r = await jp_fetch("perfmagic", "static", "bokeh.min.js", params={"v": bokeh.__version__})
    assert r.code == 200 and bokeh.__version__.encode() in r.body and len(r.body) > 500_000
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        url = url_path_join(jp_base_url, "perfmagic/static/bokeh.min.js")
        await http_server_client.fetch(url, follow_redirects=False)
    assert e.value.code in {302, 403}  # to the login page, as every file Jupyter serves
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:  # nothing else from bokeh's folder
        await jp_fetch("perfmagic", "static", "bokeh-api.min.js")
    assert e.value.code == 404


async def test_stream_requires_token(http_server_client: Any, jp_http_port: int, jp_base_url: str) -> None:
    url = f"ws://127.0.0.1:{jp_http_port}{url_path_join(jp_base_url, STREAM)}"
    with pytest.raises(tornado.httpclient.HTTPClientError) as e:
        await tornado.websocket.websocket_connect(url)
    assert e.value.code == 403


async def test_no_gpu_snapshot_says_why(jp_fetch: Any, jp_serverapp: Any) -> None:
    _monitor(jp_serverapp).nvml_opener = lambda: (None, "NVML library not found")
    snap = await _snapshot(jp_fetch)
    _check_shape(snap)
    assert snap["gpus"] == [] and snap["processes"] == []
    assert snap["nvml"]["available"] is False
    assert snap["nvml"]["reason"] == "NVML library not found"


async def test_real_nvml_without_gpu(jp_fetch: Any) -> None:
    """This machine has no GPU: the real NVML path must report that, not fail."""
    snap = await _snapshot(jp_fetch)
    _check_shape(snap)
    if not snap["nvml"]["available"]:
        assert snap["nvml"]["reason"]
        assert snap["gpus"] == []


async def test_stream_rate_and_pause(jp_ws_fetch: Any, jp_serverapp: Any) -> None:
    ws = await jp_ws_fetch(*STREAM.split("/"), params={"rate": "10"})
    try:
        first = json.loads(await asyncio.wait_for(ws.read_message(), 5))
        _check_shape(first)
        seqs = [first["seq"]]
        for _ in range(3):
            seqs.append(json.loads(await asyncio.wait_for(ws.read_message(), 2))["seq"])
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert _monitor(jp_serverapp).interval_s == pytest.approx(1 / MAX_HZ)

        ws.write_message(json.dumps({"pause": True}))
        ack = await _next_of_type(ws, "config")
        assert ack == {"type": "config", "rate_hz": MAX_HZ, "paused": True}
        await asyncio.sleep(0.2)  # drain what was in flight before the pause
        while True:
            try:
                await asyncio.wait_for(ws.read_message(), 0.05)
            except asyncio.TimeoutError:
                break
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ws.read_message(), 0.5)

        ws.write_message(json.dumps({"pause": "no"}))  # not a boolean: refused, nothing changes
        error = await _next_of_type(ws, "error")
        assert "true or false" in error["message"]

        ws.write_message(json.dumps({"pause": False, "rate": 100}))
        ack = await _next_of_type(ws, "config")
        assert ack["rate_hz"] == MAX_HZ and ack["paused"] is False
        snap = json.loads(await asyncio.wait_for(ws.read_message(), 2))
        assert snap["schema"] == "perfmagic.snapshot/1"
    finally:
        ws.close()


async def test_one_sampler_shared_by_clients(jp_ws_fetch: Any, jp_fetch: Any, jp_serverapp: Any) -> None:
    a = await jp_ws_fetch(*STREAM.split("/"), params={"rate": "4"})
    b = await jp_ws_fetch(*STREAM.split("/"), params={"rate": "1"})
    try:
        await asyncio.wait_for(a.read_message(), 5)
        await _snapshot(jp_fetch)
        monitor = _monitor(jp_serverapp)
        assert monitor.running
        threads = [t for t in threading.enumerate() if t.name == "perfmagic-monitor"]
        assert len(threads) == 1
        assert monitor.interval_s == pytest.approx(0.25)
    finally:
        a.close()
        b.close()


async def test_bad_message_gets_an_error(jp_ws_fetch: Any) -> None:
    ws = await jp_ws_fetch(*STREAM.split("/"))
    try:
        ws.write_message("not json")
        err = await _next_of_type(ws, "error")
        assert "JSON" in err["message"]
    finally:
        ws.close()


async def test_sampler_stops_when_idle(jp_fetch: Any, jp_serverapp: Any) -> None:
    monitor = _monitor(jp_serverapp)
    monitor.idle_timeout_s = 0.2
    await _snapshot(jp_fetch)
    for _ in range(50):
        if not monitor.running:
            break
        await asyncio.sleep(0.1)
    assert not monitor.running
    snap = await _snapshot(jp_fetch)  # restarts on demand
    _check_shape(snap)


async def test_sampler_stops_with_the_server(jp_fetch: Any, jp_serverapp: Any) -> None:
    monitor = _monitor(jp_serverapp)
    await _snapshot(jp_fetch)
    assert monitor.running
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert not monitor.running


def test_clamp_rate() -> None:
    assert clamp_rate(100) == MAX_HZ
    assert clamp_rate(0) == MIN_HZ
    assert clamp_rate(2) == 2.0
    assert clamp_rate(None) == 1.0
    assert clamp_rate(float("nan")) == 1.0
    assert clamp_rate(True) == 1.0


async def _next_of_type(ws: Any, kind: str) -> dict[str, Any]:
    for _ in range(50):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 2))
        if msg.get("type") == kind:
            return msg  # type: ignore[no-any-return]
    raise AssertionError(f"no {kind!r} message")


# ---- fake NVML scenarios ------------------------------------------------------------------------


async def _until(jp_fetch: Any, ok: Callable[[dict[str, Any]], bool], timeout: float = 8.0) -> dict[str, Any]:
    """Poll the snapshot until ``ok`` holds (kernel mapping and process lists refresh every 1-2 s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        snap = await _snapshot(jp_fetch)
        if ok(snap) or loop.time() > deadline:
            return snap
        await asyncio.sleep(0.2)


async def test_two_gpus_processes_mapped_to_notebooks(
    jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Any, fake_nvml: Any
) -> None:
    fake = fake_nvml(fakes.two_gpus())
    (jp_root_dir / "work").mkdir()
    (jp_root_dir / "work" / "train.ipynb").write_text("")
    body = {
        "path": "work/train.ipynb",
        "name": "train.ipynb",
        "type": "notebook",
        "kernel": {"name": "python3"},
    }
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    kernel_id = json.loads(r.body)["kernel"]["id"]
    kernel_pid = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.pid
    fake.gpus[0].processes = [(kernel_pid, 18 * GiB), (4_000_001, 2 * GiB)]
    fake.gpus[1].processes = [(os.getpid(), 512 * 1024**2)]  # this server: a process, not a kernel

    snap = await _until(jp_fetch, lambda s: any(p["kernel"] for p in s["processes"]))
    _check_shape(snap)
    assert snap["nvml"]["available"] is True and snap["nvml"]["device_count"] == 2
    h100, a100 = snap["gpus"]
    assert (h100["index"], h100["name"]) == (0, "NVIDIA H100 80GB HBM3")
    assert h100["util_gpu"] == pytest.approx(0.87)
    assert h100["mem_used_bytes"] == 20 * GiB and h100["mem_total_bytes"] == 80 * GiB
    assert h100["power_w"] == pytest.approx(250.12) and h100["power_limit_w"] == pytest.approx(700)
    assert h100["temperature_c"] == 61 and h100["throttle_reasons"] == ["sw_power_cap"]
    assert a100["util_gpu"] == 0 and a100["lost"] is False

    procs = {p["pid"]: p for p in snap["processes"]}
    kernel = procs[kernel_pid]["kernel"]
    assert kernel["id"] == kernel_id
    assert (kernel["path"], kernel["notebook"], kernel["name"]) == (
        "work/train.ipynb",
        "train.ipynb",
        "python3",
    )
    assert procs[kernel_pid]["used_memory_bytes"] == 18 * GiB and procs[kernel_pid]["gpu_index"] == 0
    assert procs[4_000_001]["visible"] is False and procs[4_000_001]["kernel"] is None
    assert procs[os.getpid()]["visible"] is True and procs[os.getpid()]["kernel"] is None
    assert procs[os.getpid()]["gpu_index"] == 1
    await jp_fetch("api", "sessions", json.loads(r.body)["id"], method="DELETE")


async def test_gpu_lost_mid_run(jp_fetch: Any, fake_nvml: Any) -> None:
    fake = fake_nvml(fakes.gpu_lost())
    first = await _snapshot(jp_fetch)
    assert [g["lost"] for g in first["gpus"]] == [False, False]
    fake.gpus[1].lost = True
    snap = await _until(jp_fetch, lambda s: s["gpus"][1]["lost"])
    assert snap["gpus"][1]["lost"] is True and snap["gpus"][1]["lost_reason"]
    assert snap["gpus"][1]["util_gpu"] is None
    assert snap["gpus"][0]["lost"] is False and snap["gpus"][0]["util_gpu"] == pytest.approx(0.87)
    assert any("lost" in w.lower() for w in snap["nvml"]["warnings"])


async def test_unsupported_fields_are_null_with_warnings(jp_fetch: Any, fake_nvml: Any) -> None:
    fake_nvml(fakes.fields_not_supported())
    snap = await _snapshot(jp_fetch)
    (gpu,) = snap["gpus"]
    assert gpu["power_w"] is None and gpu["temperature_c"] is None and gpu["pcie_tx_bytes_per_s"] is None
    assert gpu["util_gpu"] == pytest.approx(0.87) and gpu["mem_used_bytes"] == 20 * GiB
    assert snap["nvml"]["warnings"]


@pytest.mark.parametrize(
    ("scenario", "words"), [(fakes.driver_not_loaded, "driver"), (fakes.no_library, "not found")]
)
async def test_no_gpu_scenarios(jp_fetch: Any, fake_nvml: Any, scenario: Any, words: str) -> None:
    fake_nvml(scenario())
    snap = await _snapshot(jp_fetch)
    assert snap["nvml"]["available"] is False and snap["gpus"] == []
    assert words in snap["nvml"]["reason"].lower()


# ---- kernel index --------------------------------------------------------------------------------


def test_kernel_index_follows_parents_and_connection_files() -> None:
    info = {"id": "k1", "notebook": "train.ipynb"}
    index = KernelIndex()
    index._by_pid = {os.getpid(): info}
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    child = subprocess.Popen(sleeper)  # e.g. a DataLoader worker of the kernel
    stranger = subprocess.Popen([*sleeper, "-f", "/run/jupyter/kernel-k2.json"], start_new_session=True)
    try:
        assert index.kernel_for(child.pid) is info
        assert index.kernel_for(stranger.pid) is info  # its parent is still us
        index._by_pid = {}
        index._by_connection_file = {"kernel-k2.json": {"id": "k2"}}
        assert index.kernel_for(stranger.pid) == {"id": "k2"}
        assert index.kernel_for(child.pid) is None
        assert index.kernel_for(4_000_001) is None
    finally:
        child.kill()
        stranger.kill()
        child.wait()
        stranger.wait()


def test_a_session_opened_under_a_unique_id_path_is_named_after_its_notebook() -> None:
    from perfmagic.server.kernels import kernel_info

    session = {"id": "s1", "type": "notebook", "name": "train.ipynb",
               "path": "work/14f875b2-3d38-4bba-8af1-2774b087a217"}  # fmt: skip
    info = kernel_info("k1", object(), session)
    assert (info["notebook"], info["path"]) == ("train.ipynb", "work/train.ipynb")
    plain = kernel_info("k1", object(), {**session, "path": "work/eval.ipynb"})
    assert plain["notebook"] == "eval.ipynb"
