"""DistributedDataParallel's communication as ``comm``, stragglers, and jobs merged from several nodes.

Real torch DDP over gloo on the CPU, real torchrun; the multi-rank jobs are 2 ranks (2 × 2 for two
nodes) with a rank whose data loading waits 40 ms per batch against a ~3 ms step: a wide margin on a
busy machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from browser import assert_ranks_shown, chromium, screenshot
from paths import SCRIPTS

import perfmagic
from perfmagic.timeline import Timeline
from perfmagic.timeline.file import SPOOL_NAME, read_timeline, write_timeline

SCRIPT = SCRIPTS / "train_ddp_loader.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
PERFMAGIC = [sys.executable, "-m", "perfmagic.cli"]
STEPS = 30


def stage_spans(timeline: Timeline, name: str) -> list[tuple[float, float]]:
    spans = timeline.spans
    if name not in spans.names:
        return []
    sid = spans.names.index(name)
    return [
        (float(a), float(b))
        for a, b, n in zip(spans.start, spans.end, spans.name_id, strict=True)
        if n == sid
    ]


def test_ddp_reduction_is_comm_inside_backward_and_everything_is_put_back(
    tmp_path: Path, gloo_group: None
) -> None:
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    originals = (torch.Tensor.backward, torch.autograd.backward, ddp_cls.forward, ddp_cls.register_comm_hook)
    model = ddp_cls(torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    with perfmagic.profile(sources=[], outdir=tmp_path / "rec") as session:
        for _ in range(5):
            model(x).sum().backward()
        with model.no_sync():  # no reduction: no comm
            model(x).sum().backward()
        torch.autograd.backward(model(x).sum())
        plain = torch.nn.Linear(8, 1)
        plain(x).sum().backward()  # not DDP: no comm
    comm, backward = stage_spans(session.timeline, "comm"), stage_spans(session.timeline, "backward")
    assert len(backward) == 8
    assert (
        len(comm) == 6
    )  # the five DDP backwards and autograd.backward's; not no_sync's, not the plain model's
    assert all(any(a <= s and e <= b for a, b in backward) for s, e in comm)
    assert (
        torch.Tensor.backward,
        torch.autograd.backward,
        ddp_cls.forward,
        ddp_cls.register_comm_hook,
    ) == originals
    # after profiling DDP trains as before, and a comm hook can still be registered
    calls: list[int] = []

    def hook(state: object, bucket: Any) -> Any:
        calls.append(1)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    hook.__annotations__ = {"bucket": torch.distributed.GradBucket}  # DDP checks it (not as a string)
    model = ddp_cls(torch.nn.Linear(8, 1))
    model.register_comm_hook(None, hook)
    model(x).sum().backward()
    assert calls


def run_job(
    tmp_path: Path, name: str, env: dict[str, str], *torchrun_args: str
) -> subprocess.CompletedProcess[str]:
    """``perfmagic run --outdir tmp/name -- torchrun ... train_ddp_loader.py``; each rank's result in tmp/name-ranks."""
    results = tmp_path / f"{name}-ranks"
    results.mkdir()
    # a rank that crashes in native code (an exit of -11) leaves its Python stack on stderr
    full_env = dict(
        os.environ, TRAIN_STEPS=str(STEPS), RESULT_DIR=str(results), PYTHONFAULTHANDLER="1", **env
    )
    cmd = [
        *PERFMAGIC,
        "run",
        "--quiet",
        "--json",
        str(tmp_path / f"{name}.json"),
        "--html",
        str(tmp_path / f"{name}.html"),
        "--outdir",
        str(tmp_path / name),
    ]
    cmd += ["--", TORCHRUN, *torchrun_args, str(SCRIPT)]
    return subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=240)


def one_node(tmp_path: Path, name: str, **env: str) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    result = run_job(tmp_path, name, env, "--nproc-per-node", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / f"{name}.json").read_text())
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert set(ranks) == {0, 1} and all(r["steps"]["count"] == STEPS for r in ranks.values())
    return report, ranks


def mean(rank: dict[str, Any], stage: str) -> float:
    return float(rank["stages"].get(stage, {}).get("mean_s", 0.0))


@pytest.fixture(scope="module")
def straggler_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The 2-rank job whose rank 1 waits 40 ms per batch: its directory (``straggler.html`` in it) and report."""
    tmp = tmp_path_factory.mktemp("job")
    report, _ = one_node(tmp, "straggler", SLOW_RANK="1")
    return tmp, report


@pytest.mark.slow
def test_a_slow_data_rank_is_the_straggler_and_the_fast_rank_waits_in_comm(
    straggler_job: tuple[Path, dict[str, Any]],
) -> None:
    report = straggler_job[1]
    ranks = {r["rank"]: r for r in report["ranks"]}
    wait = mean(ranks[1], "data")
    assert wait > 0.035  # the 40 ms per batch
    # rank 0 waits for it in DDP's all-reduce, inside backward: comm, not backward
    assert mean(ranks[0], "comm") > 0.7 * wait
    assert mean(ranks[0], "backward") < 0.2 * mean(ranks[0], "comm")
    assert mean(ranks[1], "comm") < 0.2 * mean(ranks[0], "comm")
    cards = {c["id"]: c for c in report["advice"]}
    card = cards["rank_straggler"]
    assert card["metrics"]["rank"] == 1 and card["metrics"]["stage"] == "data"
    assert card["metrics"]["others_comm_s"] == pytest.approx(mean(ranks[0], "comm"))
    assert "comm_bound" not in cards  # the wait is the straggler's, not communication's
    assert report["bottleneck"] == "data"
    assert report["straggler"]["rank"] == 1 and report["straggler"]["stage"] == "data"


@pytest.mark.slow
def test_a_balanced_job_has_no_straggler_and_the_users_comm_hook_works_and_is_timed(tmp_path: Path) -> None:
    report, ranks = one_node(tmp_path, "balanced", SLOW_RANK="all", SLOW_S="0.02", USER_HOOK="1")
    seen = [json.loads(p.read_text()) for p in sorted((tmp_path / "balanced-ranks").glob("rank*.json"))]
    assert len(seen) == 2 and all(s["hook_calls"] >= STEPS for s in seen)  # the user's hook ran every step
    assert all(mean(r, "comm") > 0 for r in ranks.values())  # and its reduction is timed
    # Both ranks wait as long per batch; beside busy processes one of them may still fetch slower (its
    # wake-ups wait for a CPU). Each rank's own timer says whether the run was balanced as it ran.
    own = {s["rank"]: s["data_s"] for s in seen}
    slowest = max(own, key=lambda rank: own[rank])
    straggler = report["straggler"]
    cards = {c["id"] for c in report["advice"]}
    if own[slowest] < 1.1 * min(own.values()):  # balanced: STRAGGLER_RATIO (1.2) is not reached
        assert straggler is None and "rank_straggler" not in cards, (own, straggler)
    else:  # the machine made one rank slower: if the report names a straggler, that one
        assert straggler is None or straggler["rank"] == slowest, (own, straggler)


@pytest.mark.slow
@pytest.mark.browser
def test_the_html_export_shows_each_rank_over_time_and_marks_the_straggler(
    straggler_job: tuple[Path, dict[str, Any]],
) -> None:
    directory, report = straggler_job
    assert all(len(r["step_table"]["start"]) == STEPS for r in report["ranks"])  # every step, each rank's
    errors: list[str] = []
    with chromium(viewport=(1280, 1400)) as page:
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((directory / "straggler.html").as_uri())  # offline: BokehJS is in the file
        assert_ranks_shown(page, report)
        page.locator(".pm-ranks").scroll_into_view_if_needed()
        screenshot(page, "html-ranks")
    assert not errors, errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shifted_copy(node: Path, to: Path, seconds: float) -> None:
    """A node's records as if its host's clock ran ``seconds`` ahead."""
    for spool in node.glob(f"*/{SPOOL_NAME}"):
        timeline = read_timeline(spool)
        timeline.meta["epoch"] = float(timeline.meta["epoch"]) + seconds
        (to / spool.parent.name).mkdir(parents=True)
        write_timeline(timeline, to / spool.parent.name / SPOOL_NAME)


@pytest.mark.slow
def test_two_nodes_merge_into_one_job_with_their_clocks_aligned(tmp_path: Path) -> None:
    port = free_port()
    jobs = []
    for k in (0, 1):
        torchrun = ["--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "merge-test"]  # fmt: skip
        jobs.append(
            subprocess.Popen(
                [
                    *PERFMAGIC,
                    "run",
                    "--quiet",
                    "--outdir",
                    str(tmp_path / f"node{k}"),
                    "--",
                    TORCHRUN,
                    *torchrun,
                    str(SCRIPT),
                ],
                cwd=tmp_path,
                env=dict(os.environ, TRAIN_STEPS="20", SLOW_RANK="3"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        errors = [job.communicate(timeout=240)[1] for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    assert all(job.returncode == 0 for job in jobs), errors

    out = tmp_path / "job.json"
    result = subprocess.run(
        [*PERFMAGIC, "merge", "--json", str(out), str(tmp_path / "node0"), str(tmp_path / "node1")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "bottleneck: data on rank 3" in result.stdout, result.stdout
    report = json.loads(out.read_text())
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert set(ranks) == {0, 1, 2, 3}
    assert len({ranks[0]["node"], ranks[2]["node"]}) == 2 and ranks[0]["node"] == ranks[1]["node"]
    assert report["straggler"]["rank"] == 3 and report["straggler"]["stage"] == "data"
    nodes = report["nodes"]
    assert [n["ranks"] for n in nodes] == [[0, 1], [2, 3]]
    assert nodes[1]["matched"] >= 20  # a DDP reduction per step, and the barrier
    assert abs(nodes[1]["offset_s"]) <= nodes[1]["uncertainty_s"] < 0.05, nodes  # one host: one clock

    # node 1's host clock 2.5 s ahead: merged back onto node 0's within the stated uncertainty
    shifted_copy(tmp_path / "node1", tmp_path / "node1-ahead", 2.5)
    from perfmagic.merge import merge_records

    merged = merge_records([tmp_path / "node1-ahead", tmp_path / "node0"]).to_dict()
    # the node with rank 0 is the reference; c10d's rendezvous, not --node-rank, decides which node that is
    by_dir = {Path(n["directory"]).name: n for n in merged["nodes"]}
    ahead, other = by_dir["node1-ahead"], by_dir["node0"]
    uncertainty = max(ahead["uncertainty_s"], other["uncertainty_s"])
    assert abs(ahead["offset_s"] - other["offset_s"] + 2.5) <= uncertainty < 0.05, merged["nodes"]
    assert merged["straggler"]["rank"] == 3


def test_merge_says_when_a_directory_holds_no_record(tmp_path: Path) -> None:
    result = subprocess.run([*PERFMAGIC, "merge", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no profiled process" in result.stderr


@pytest.mark.slow
def test_fsdp_all_gather_and_reduce_scatter_are_comm(tmp_path: Path) -> None:
    """FSDP runs on the CPU over gloo (torch 2.13): its collectives go through torch.distributed's functions."""
    _, ranks = one_node(tmp_path, "fsdp", FSDP="1")
    assert all(mean(r, "comm") > 0 for r in ranks.values())
    assert all(r["stages"]["comm"]["fraction"] > 0.01 for r in ranks.values())
