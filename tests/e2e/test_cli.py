"""`perfmagic run` and `perfmagic demo`, as a user runs them: real subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from paths import SCRIPTS

import perfmagic

PERFMAGIC = [sys.executable, "-m", "perfmagic.cli"]


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PERFMAGIC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_run_profiles_an_unchanged_script(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = run_cli(
        "run",
        "--json",
        str(out),
        "--outdir",
        str(tmp_path / "rec"),
        "--",
        sys.executable,
        str(SCRIPTS / "train_plain.py"),
        "30",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "trained 30 steps" in result.stdout  # the script's own output is untouched
    assert "sitecustomize" not in result.stderr
    assert "stage breakdown" in result.stdout
    report = json.loads(out.read_text())
    assert report["schema"] == "perfmagic.report/1"
    assert report["source"] == "run"
    assert report["framework"] == "torch"
    assert report["steps"]["count"] == 30
    assert set(report["stages"]) >= {"data", "forward", "backward", "optimizer", "other"}
    assert sum(s["fraction"] for s in report["stages"].values()) == pytest.approx(1.0)
    # 40 ms of sleep per step is invisible to the hooks: "other" must be the largest per-step stage.
    medians = {name: stage["median_s"] for name, stage in report["stages"].items()}
    assert max(medians, key=lambda name: medians[name]) == "other"
    assert medians["other"] >= 0.039
    # The run process sampled the host for the whole tree.
    assert report["host"]["cpu_count"] == os.cpu_count()


STARTUP_SCRIPT = """\
import time
import perfmagic

time.sleep({setup_s})  # the set-up
for i in range(40):
    time.sleep(0.05)
    perfmagic.step()
"""


@pytest.mark.parametrize("setup_s", [0, 3])
def test_slow_startup_is_the_scripts_own_and_names_its_line(tmp_path: Path, setup_s: int) -> None:
    """3 s of set-up before a 2 s loop is the script's start-up, named by its line; a script that goes
    straight to its loop has none worth a card, whatever Python's and perfmagic's own start cost."""
    (tmp_path / "train.py").write_text(STARTUP_SCRIPT.format(setup_s=setup_s))
    out = tmp_path / "out.json"
    result = run_cli("run", "--quiet", "--json", str(out), "--", sys.executable, "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    cards = [c for c in report["advice"] + report["advice_minor"] if c["id"] == "slow_startup"]
    if not setup_s:
        assert not cards, cards
        return
    (card,) = [c for c in report["advice"] if c["id"] == "slow_startup"]
    assert card["metrics"]["hot_line"] == "<module> (train.py:4)", card
    assert "importing torch" not in card["evidence"], card["evidence"]  # this script imports none


def test_run_returns_the_commands_exit_code_and_still_reports(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = run_cli(
        "run",
        "--json",
        str(out),
        "--",
        sys.executable,
        str(SCRIPTS / "train_plain.py"),
        "5",
        "3",
        cwd=tmp_path,
    )
    assert result.returncode == 3
    assert json.loads(out.read_text())["steps"]["count"] == 5


def test_run_without_a_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("run", cwd=tmp_path)
    assert result.returncode == 2
    assert "give the command to profile" in result.stderr


def test_run_of_a_missing_program_says_so(tmp_path: Path) -> None:
    result = run_cli("run", "--", "no-such-program-xyz", cwd=tmp_path)
    assert result.returncode == 127
    assert "cannot start 'no-such-program-xyz'" in result.stderr


def test_run_keeps_the_users_own_sitecustomize(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    script = tmp_path / "check.py"
    script.write_text(
        "import os, sys\nsys.exit(0 if os.environ.get('USER_SITECUSTOMIZE_RAN') == '1' else 9)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(own))
    result = run_cli("run", "--quiet", "--", sys.executable, str(script), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "sitecustomize" not in result.stderr


def test_demo_names_the_input_bottleneck(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    result = run_cli("demo", "--steps", "30", "--json", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["steps"]["count"] == 30
    medians = {name: stage["median_s"] for name, stage in report["stages"].items()}
    assert max(medians, key=lambda name: medians[name]) == "data"
    # other processes crowding the machine are a real finding and may come first; then the data wait
    lead = next(
        c
        for c in report["advice"]
        if not (c["id"] == "cpu_contention" and c["metrics"]["other_cores"] >= 0.5)
    )
    assert lead["id"] in {"input_bound", "dataloader_workers"}, report["advice"]
    # where the data time went: the demo's own dataset, as a user's report names theirs
    top = report["hotspots"]["data"][0]
    assert (top["function"], Path(top["file"]).name) == ("__getitem__", "demo.py"), report["hotspots"]
    assert f"was mostly in: {top['where']}" in result.stdout


@pytest.mark.slow
def test_run_merges_torchrun_ranks(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, TRAIN_STEPS="20")
    result = run_cli(
        "run", "--json", str(out), "--", str(torchrun), "--nproc-per-node", "2", str(SCRIPTS / "train_ddp.py"),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert set(ranks) == {0, 1}  # the torchrun launcher is not a rank
    assert all(r["steps"]["count"] == 20 for r in ranks.values())
    # Rank 1 sleeps 10 ms a step; rank 0 waits for it in the collectives.
    assert ranks[0]["stages"]["comm"]["median_s"] > 0.005
    assert ranks[0]["stages"]["comm"]["fraction"] > ranks[1]["stages"]["comm"]["fraction"]


def test_run_with_trace_and_html_writes_both(tmp_path: Path) -> None:
    out, html = tmp_path / "out.json", tmp_path / "report.html"
    result = run_cli(
        "run", "--trace", "3", "--json", str(out), "--html", str(html), "--outdir", str(tmp_path / "rec"),
        "--", sys.executable, str(SCRIPTS / "train_plain.py"), "12",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "USDT" not in result.stderr  # libkineto's fd-2 chatter goes to a log file
    report = json.loads(out.read_text())
    traces = report["torch_traces"]
    assert len(traces) == 1 and traces[0]["steps"] == 3
    trace = json.loads(Path(traces[0]["path"]).read_text())
    assert sum(1 for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")) == 3
    assert html.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize(
    ("orig_argv", "helper"),
    [
        (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
          "--multiprocessing-fork"], False),  # torch.multiprocessing.spawn ranks start so
        (["python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(5)"], True),
        (["python", "-c", "from multiprocessing.forkserver import main; main(3, 4, ['__main__'])"], True),
        (["python", "train_multiprocessing.py"], False),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], False),
    ],
)  # fmt: skip
def test_helper_processes_are_told_from_ranks(
    monkeypatch: pytest.MonkeyPatch, orig_argv: list[str], helper: bool
) -> None:
    from perfmagic.bootstrap import is_helper_process

    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert is_helper_process() is helper


@pytest.mark.slow
def test_run_profiles_ranks_started_by_torch_multiprocessing_spawn(tmp_path: Path) -> None:
    out = tmp_path / "spawn.json"
    result = run_cli(
        "run", "--json", str(out), "--", sys.executable, str(SCRIPTS / "train_spawn.py"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert len(report["ranks"]) == 2  # the spawned ranks; the launching parent trains nothing
    assert all(r["steps"]["count"] == 10 for r in report["ranks"])


LONG_TRAINING = """
import os, sys, time, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
for _ in range(100_000):  # long enough to be stopped from outside
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    time.sleep(0.005)
"""


def _default_signals() -> None:
    """In the started ``perfmagic run``: the signals' default actions, whatever this test inherited (a
    job started in the background, or under nohup, ignores SIGINT or SIGHUP, and so would its children)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


Starter = Callable[[str], tuple[subprocess.Popen[str], Path, Path]]


@pytest.fixture
def run_until_it_writes_its_pid(tmp_path: Path) -> Iterator[Starter]:
    """Starts ``perfmagic run`` on a script that writes its pid to its first argument, and waits until it
    has; gives the process, the pid file and the --json report's path. Nothing started outlives the test."""
    started: list[tuple[subprocess.Popen[str], Path]] = []

    def start(training: str) -> tuple[subprocess.Popen[str], Path, Path]:
        script, pid_file, out = tmp_path / "train.py", tmp_path / "pid", tmp_path / "out.json"
        script.write_text(training)
        cmd = [sys.executable, "-m", "perfmagic.cli", "run", "--quiet", "--outdir", str(tmp_path / "run")]
        proc = subprocess.Popen(
            [*cmd, "--json", str(out), "--", sys.executable, str(script), str(pid_file)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_signals,
        )
        started.append((proc, pid_file))
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc, pid_file, out

    yield start
    for proc, pid_file in started:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_to_run_reaches_the_command_and_the_report_is_written(
    tmp_path: Path, sig: signal.Signals, code: int, run_until_it_writes_its_pid: Starter
) -> None:
    """kill, docker stop, a scheduler's preemption or timeout signal perfmagic, not the training."""
    proc, pid_file, out = run_until_it_writes_its_pid(LONG_TRAINING)
    time.sleep(0.5)  # some steps
    os.kill(proc.pid, sig)  # to perfmagic alone, as kill and docker stop do
    _, stderr = proc.communicate(timeout=60)
    child = int(pid_file.read_text())
    assert proc.returncode == code, stderr
    assert not Path(f"/proc/{child}").exists(), "the training was left running"
    report = json.loads(out.read_text())
    assert report["steps"]["count"] > 10 and (tmp_path / "run" / "report.json").exists()


STUCK_IN_NATIVE_CODE = """
import ctypes, os, sys, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(20):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
mutex = ctypes.create_string_buffer(64)  # a default pthread mutex, locked twice: no signal ends the wait
libc = ctypes.CDLL(None)
libc.pthread_mutex_lock(mutex)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
libc.pthread_mutex_lock(mutex)  # as a library's destructor joining a thread that never ends
"""


def test_sigterm_ends_a_process_stuck_in_native_code(run_until_it_writes_its_pid: Starter) -> None:
    """Python runs signal handlers only in the interpreter: before the watchdog, perfmagic's SIGTERM
    handler made a training stuck in native code impossible to end with SIGTERM."""
    proc, pid_file, out = run_until_it_writes_its_pid(STUCK_IN_NATIVE_CODE)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert proc.returncode == 143, stderr
    assert "stuck in native code" in stderr
    assert json.loads(out.read_text())["steps"]["count"] >= 19  # the last boundary is held for the next step


def test_run_exit_codes_follow_the_shell(tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("echo hi\n")
    assert run_cli("run", "--", str(script), cwd=tmp_path).returncode == 126
    assert run_cli("run", "--", "no-such-program-xyz", cwd=tmp_path).returncode == 127
    assert run_cli("run", "--", cwd=tmp_path).returncode == 2


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--interval", "inf"], "at most 60, got inf"),
        (["--interval", "0"], "must be a positive number of seconds and at most 60"),
        (["--tune", "--tune-budget", "inf"], "must be a positive number of seconds, got inf"),
        (["--trace", "-1"], "at least 1"),
    ],
)
def test_run_refuses_bad_options_in_one_line(tmp_path: Path, option: list[str], says: str) -> None:
    result = run_cli("run", *option, "--", sys.executable, "-c", "pass", cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr
    assert "Traceback" not in result.stderr


def test_run_with_an_unwritable_outdir_still_runs_the_command(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_cli(
        "run",
        "--quiet",
        "--outdir",
        str(blocker / "run"),
        "--",
        sys.executable,
        "-c",
        "print('ran')",
        cwd=tmp_path,
    )
    assert result.returncode == 0 and "ran" in result.stdout
    assert f"cannot write to {blocker / 'run'}" in result.stderr


def test_run_says_when_it_could_not_profile_an_isolated_python(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = ("run", "--quiet", "--json", str(out), "--", sys.executable, "-I", "-c", "print('ran')")
    result = run_cli(*cmd, cwd=tmp_path)
    assert result.returncode == 3 and "ran" in result.stdout
    assert "python -I, -S or -E" in result.stderr
    assert any(
        "no Python process of the command was profiled" in w for w in json.loads(out.read_text())["warnings"]
    )


def test_run_fails_loudly_when_the_commands_python_lacks_perfmagic(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a new user's mistake: the system Python, not the venv perfmagic is in
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    result = run_cli("run", "--quiet", "--", str(bare / "bin" / "python"), "-c", "print('ran')", cwd=tmp_path)
    assert result.returncode == 3 and "ran" in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert "NOTHING PROFILED" in last and "lacks perfmagic" in last and sys.executable in last


def test_version() -> None:
    result = subprocess.run([*PERFMAGIC, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"perfmagic {perfmagic.__version__}"


def test_report_of_an_nsight_capture_with_a_users_step_range(tmp_path: Path) -> None:
    """``perfmagic report CAPTURE.sqlite`` on a real export: its iterations, as its own NVTX ranges say."""
    import gzip
    import sqlite3

    from paths import DATA

    capture = tmp_path / "saxpy.sqlite"
    capture.write_bytes(gzip.decompress((DATA / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite.gz").read_bytes()))
    with contextlib.closing(sqlite3.connect(capture)) as db:
        (iterations,) = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'saxpy'").fetchone()
        # the GPU window (HTA's): what was launched before the last step began
        (kernels,) = db.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId IN (SELECT correlationId "
            "FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start < (SELECT max(start) FROM NVTX_EVENTS WHERE text = 'saxpy'))"
        ).fetchone()
    result = run_cli("report", "--json", "r.json", "--html", "r.html", "--step-range", "^saxpy$", str(capture),
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"]["count"] == iterations and report["gpu"]["kernel_count"] == kernels
    assert "pm-kernels" in (tmp_path / "r.html").read_text()
    missing = run_cli("report", "--step-range", "^train$", str(capture), cwd=tmp_path)
    assert missing.returncode == 2 and "no NVTX range matches --step-range '^train$'" in missing.stderr
