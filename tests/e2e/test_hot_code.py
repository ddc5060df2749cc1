"""The hot code, named as the user knows it: a notebook's cells by number (``In [2], line 9``), a
script's lines by file (``train.py:9``), and for ``data`` with DataLoader workers the workers' own code
(the dataset's FFT), not the loop's ``for`` line; the data card says what a sample costs.

Each test measures its own truth in the same run: the dataset's costly function is timed directly
against a whole ``__getitem__``, so that naming it first is what the user would have found by hand.
Assertions are on names, ranks and generous ratios, never on tight timings.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from notebook_runs import printed_json, run_cells

import perfmagic
from perfmagic.advise.sample_cost import cheaper_samples_lines
from perfmagic.render.wording import hotspot_lines
from perfmagic.report import Report

torch = pytest.importorskip("torch")

DATASET = """\
import numpy as np
import torch
from torch.utils.data import Dataset


def spectrum(x):
    for _ in range(12):
        x = np.abs(np.fft.ifft2(np.fft.fft2(x))) + 1.0  # the cost
    return x


class Spectra(Dataset):
    def __len__(self):
        return 8 * 25

    def __getitem__(self, i):
        x = spectrum(np.random.default_rng(i).standard_normal((96, 96)))
        return torch.from_numpy(x[:8].reshape(-1).astype(np.float32)), i % 10
"""
FFT_LINE = next(n for n, text in enumerate(DATASET.splitlines(), 1) if text.endswith("# the cost"))

TRUTH = """\
def spectrum_share(n=20):
    import time
    dataset, x = Spectra(), np.random.default_rng(0).standard_normal((96, 96))
    dataset[0]
    item = spent = float("inf")
    for _ in range(3):  # CPU time, best of three: the machine's other load counts in neither
        began = time.thread_time()
        for i in range(n):
            dataset[i]
        item = min(item, time.thread_time() - began)
        began = time.thread_time()
        for _ in range(n):
            spectrum(x)
        spent = min(spent, time.thread_time() - began)
    return spent / item
"""
"""The share of a sample's time its FFTs take, timed directly (the FFTs alone against whole samples)."""

MOSTLY = 0.6
"""The share of a sample the FFTs must take, as timed directly, for the test to mean anything (0.85-1.1
on a busy 2-core machine)."""

TRAIN = """\
model = torch.nn.Linear(768, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Spectra(), batch_size=8, num_workers={workers}):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def data_spots(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["where"], h["sampled"]) for h in report["hotspots"].get("data", [])]


# -- a notebook -------------------------------------------------------------------


@pytest.mark.slow
def test_a_notebook_names_the_set_up_cells_line(tmp_path: Path) -> None:
    """The dataset is defined in cell 2 (after a blank line, which IPython drops when it compiles the cell
    but the notebook shows); the profiled cell trains. Loading in the loop and in forked workers, the
    report names ``In [2]``'s FFT line, not ipykernel's temporary file."""
    # pure Python in no stage: "other", ~40 ms a step, several times what the loss and the autograd
    # engine take between the stage hooks on the line before, even where load stretches those
    busy = "    sum(i * i for i in range(600_000))"
    profiled = "%%gpuprofile --quiet -v {var} --interval 0.02\n\n" + TRAIN + busy + "\n"
    cells = [
        "%load_ext perfmagic\nimport json\nfrom torch.utils.data import DataLoader",
        "\n" + DATASET,
        TRUTH + "share = spectrum_share()",
        profiled.format(var="in_loop", workers=0),
        profiled.format(var="in_workers", workers=1),
        "print(json.dumps({'share': share, 'in_loop': in_loop.to_dict(), 'in_workers': in_workers.to_dict()}))",
    ]
    out = printed_json(run_cells(cells, tmp_path))
    assert out["share"] >= MOSTLY, out["share"]  # measured in the kernel: the FFTs are the cost
    fft = f"spectrum (In [2], line {FFT_LINE + 1})"  # the blank line the cell starts with counts

    in_loop = out["in_loop"]
    assert data_spots(in_loop)[0] == (fft, "training thread"), in_loop["hotspots"]
    # the profiled cell's own line, counted from the magic's line as the notebook shows the cell
    busy_line = profiled.splitlines().index(busy) + 1
    assert in_loop["hotspots"]["other"][0]["where"].endswith(f"(In [4], line {busy_line})"), json.dumps(
        in_loop["hotspots"]["other"]
    )

    in_workers = out["in_workers"]
    spots = data_spots(in_workers)
    assert spots[0] == (fft, "workers"), spots  # the workers' own stacks, named in the kernel's terms
    assert all(sampled == "workers" and "In [5]" not in where for where, sampled in spots), spots


# -- a script under perfmagic run -----------------------------------------------------------


def test_a_script_under_perfmagic_run_names_its_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        DATASET
        + "\n\n"
        + TRUTH
        + "\n\nimport sys\nfrom torch.utils.data import DataLoader\n\n"
        + "print('spectrum share', spectrum_share())\n"
        + TRAIN.format(workers="int(sys.argv[1])")
    )
    for workers, sampled in ((0, "training thread"), (1, "workers")):
        out = tmp_path / f"report{workers}.json"
        options = [
            "--quiet",
            "--interval",
            "0.02",
            "--json",
            str(out),
            "--outdir",
            str(tmp_path / f"r{workers}"),
        ]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "perfmagic.cli",
                "run",
                *options,
                "--",
                sys.executable,
                "train.py",
                str(workers),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, result.stderr
        share = float(re.search(r"spectrum share ([0-9.]+)", result.stdout)[1])  # type: ignore[index]
        assert share >= MOSTLY, share
        report = json.loads(out.read_text())
        assert data_spots(report)[0] == (f"spectrum (train.py:{FFT_LINE})", sampled), report["hotspots"]


# -- in process, with workers -------------------------------------------------------------


@pytest.fixture
def spectra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The dataset as a module of the user's directory, and torch on one thread (two cores at most)."""
    (tmp_path / "spectra.py").write_text(DATASET + "\n\n" + TRUTH)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("spectra", tmp_path / "spectra.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield module
    finally:
        torch.set_num_threads(threads)


def train(loader: Any, tmp_path: Path) -> Report:
    model = torch.nn.Linear(768, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfmagic.profile(outdir=tmp_path / "out", interval=0.02) as session:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return session.report


def test_workers_loading_name_the_datasets_code_and_the_card_what_a_sample_costs(
    spectra: ModuleType, tmp_path: Path
) -> None:
    """A user saw ``data`` put all on the loop's ``for`` line, and a card asking them to time their dataset."""
    began = time.perf_counter()
    for i in range(10):
        spectra.Spectra()[i]
    direct = (time.perf_counter() - began) / 10  # a sample, timed here in this process
    assert spectra.spectrum_share() >= MOSTLY
    loader = torch.utils.data.DataLoader(spectra.Spectra(), batch_size=8, num_workers=1)
    report = train(loader, tmp_path)
    spots = data_spots(report.to_dict())
    assert spots[0] == (f"spectrum (spectra.py:{FFT_LINE})", "workers"), spots
    assert all(sampled == "workers" and "test_hot_code" not in where for where, sampled in spots), spots
    assert "waits for the DataLoader workers, mostly in: spectrum (spectra.py:" in str(report)

    loading = report["loading"]
    assert loading is not None and loading["batch_s"] is not None
    per_sample = loading["batch_s"] / 8
    assert direct / 3 < per_sample < 20 * direct, (per_sample, direct)  # the workers' own clock, loosely
    analysis = report.analysis
    assert analysis is not None
    card = next((c for c in report.advice if c["id"] == "input_bound"), None)
    if card is None:  # a crowded machine: the card gives way to the contention that starves the workers
        assert "cpu_contention" in {c["id"] for c in report.advice}, str(report)
        fix = "\n".join(cheaper_samples_lines(analysis))
    else:
        fix = card["fix"]
        compile(fix, "fix", "exec")
    assert re.search(
        r"a DataLoader worker takes [0-9.]+ [mµ]?s per batch of 8, [0-9.]+ [mµ]?s per sample", fix
    ), fix
    assert f"spectrum (spectra.py:{FFT_LINE})" in fix and "perf_counter" not in fix, fix


class Probe(torch.utils.data.Dataset[Any]):
    """Each sample says whether its worker still runs perfmagic's code: torch's fetcher patched, or the
    stack sampler's thread alive."""

    def __len__(self) -> int:
        return 4 * 15

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        import threading

        from torch.utils.data._utils import fetch

        time.sleep(0.003)
        patched = fetch._MapDatasetFetcher.fetch.__module__.startswith("perfmagic")
        sampling = any(t.name == "perfmagic-worker-stacks" for t in threading.enumerate())
        return torch.zeros(768), torch.tensor(int(patched) + 2 * int(sampling))


def test_workers_forked_before_the_profile_are_not_named_and_the_report_says_so(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(Probe(), batch_size=4, num_workers=1, persistent_workers=True)
    for _ in loader:  # the first epoch forks the workers, before the profile
        pass
    model = torch.nn.Linear(768, 1)
    with perfmagic.profile(outdir=tmp_path / "out", interval=0.02) as session:
        for x, _ in loader:
            model(x).sum().backward()
    report = session.report
    assert all(sampled == "training thread" for _, sampled in data_spots(report.to_dict()))
    assert report["loading"] is not None and report["loading"]["batch_s"] is None  # nor timed
    said = " ".join(hotspot_lines(report.to_dict())) + "\n".join(cheaper_samples_lines(report.analysis))  # type: ignore[arg-type]
    assert "stacks were not sampled" in said, said


def test_workers_forked_in_the_profile_put_everything_back_when_it_ends(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(Probe(), batch_size=4, num_workers=1, persistent_workers=True)
    model = torch.nn.Linear(768, 1)
    with perfmagic.profile(outdir=tmp_path / "out", interval=0.02) as session:
        during = []
        for x, flags in loader:
            model(x).sum().backward()
            during.append(int(flags.max()))
    assert session.report["hotspots"]["data"][0]["sampled"] == "workers"
    assert during[-1] == 3  # in the window, the worker was timed and sampled
    after = [int(flags.max()) for _, flags in loader]  # the same worker, after the window
    assert after[-1] == 0, after  # its first fetch put torch's fetcher back; its sampler has ended
