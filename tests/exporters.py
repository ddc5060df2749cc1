"""``perfmagic exporter`` processes for tests, each given a fake NVML scenario (``fake_nvml``).

The fake reaches an exporter's process through a ``sitecustomize`` on its ``PYTHONPATH`` alone:
the product has no switch for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SITECUSTOMIZE = """
import os, sys
sys.path.insert(0, {tests!r})
import fake_nvml
from perfmagic.collect import nvml_query
nvml_query._load_pynvml = getattr(fake_nvml, os.environ["FAKE_NVML_SCENARIO"])
"""


class Exporters:
    """Starts exporters on free loopback ports (``start``) and ends every one (``close``)."""

    def __init__(self, workdir: Path) -> None:
        self.site = workdir / "exporter-site"
        self.site.mkdir(parents=True, exist_ok=True)
        (self.site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(tests=str(Path(__file__).parent)))
        self.started: list[subprocess.Popen[str]] = []

    def start(self, scenario: str, hostname: str, registry: Path | None = None, **env_vars: str) -> str:
        """An exporter whose NVML is ``fake_nvml.<scenario>()``, labelled ``Hostname=hostname``, reading
        the sessions in ``registry`` (default: an empty one of its own), with ``env_vars`` set for the
        scenario; its /metrics URL."""
        if registry is None:
            registry = self.site.parent / f"registry-{len(self.started)}"
        env = dict(
            os.environ,
            PYTHONPATH=str(self.site),
            FAKE_NVML_SCENARIO=scenario,
            PERFMAGIC_REGISTRY_DIR=str(registry),
            **env_vars,
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "perfmagic.cli", "exporter", "--port", "0", "--hostname", hostname],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.started.append(proc)
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert "serving http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        return line.split("serving ")[1].split()[0]

    def close(self) -> None:
        for proc in self.started:
            proc.terminate()
            proc.wait(timeout=10)


TRAINING = """
import time, perfmagic
while True:
    with perfmagic.stage("forward"):
        time.sleep(0.01)
    perfmagic.step()
"""


BATCHES = """
import time, perfmagic, torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.zeros(64, 4)), batch_size=8)
while True:
    for (x,) in loader:
        with perfmagic.stage("forward"):
            time.sleep(0.01)
        perfmagic.step()
"""
"""The same steps, each on a batch of 8 samples from a DataLoader."""


def training(registry: Path, rank: int, script: str = TRAINING) -> subprocess.Popen[str]:
    """``perfmagic run`` of ``script`` (default: stepping every 10 ms) as ``rank``, in the session
    registry ``registry``, until it is ended (``terminate``: perfmagic run passes the signal on)."""
    env = dict(os.environ, PERFMAGIC_REGISTRY_DIR=str(registry), RANK=str(rank), LOCAL_RANK="0")
    cmd = [
        sys.executable,
        "-m",
        "perfmagic.cli",
        "run",
        "--quiet",
        "--outdir",
        str(registry.parent / f"run-{rank}"),
    ]
    return subprocess.Popen(
        [*cmd, "--", sys.executable, "-c", script],
        env=env,
        text=True,
        cwd=registry.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def profiled(job: subprocess.Popen[str]) -> set[int]:
    """The pids of the processes a ``training`` job's ``perfmagic run`` started."""
    import psutil

    return {p.pid for p in psutil.Process(job.pid).children(recursive=True)}
