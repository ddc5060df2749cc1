"""Samples as a DataFrame and as nvidia-smi's CSV, readable by the scripts that read nvidia-smi logs."""

from __future__ import annotations

import csv
import re
import time
from pathlib import Path
from typing import Any

import fake_nvml as scenarios
import pandas as pd

from perfmagic.collect.nvml_source import NvmlSource
from perfmagic.collect.sampler import Sampler
from perfmagic.render.telemetry import NVIDIA_SMI_HEADER, samples_dataframe, write_nvidia_smi_csv
from perfmagic.timeline import Timeline

ROW = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$")


def sampled(fake_nvml: Any, fake: scenarios.FakeNvml) -> Timeline:
    fake_nvml(fake)
    timeline = Timeline({"epoch": time.time()})
    origin = time.perf_counter()
    sampler = Sampler(timeline, [NvmlSource()], interval=0.02, clock=lambda: time.perf_counter() - origin)
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    return timeline


def test_dataframe_has_one_column_per_metric_on_a_time_index() -> None:
    tl = Timeline()
    tl.add_sample("gpu0.util", 0.0, 0.5)
    tl.add_sample("gpu0.util", 0.1, 0.75)
    tl.add_sample("host.cpu_util", 0.1, 0.25)
    df = samples_dataframe(tl)
    assert list(df.columns) == ["gpu0.util", "host.cpu_util"]
    assert df.index.name == "t" and list(df.index) == [0.0, 0.1]
    assert df.loc[0.1, "gpu0.util"] == 0.75 and pd.isna(df.loc[0.0, "host.cpu_util"])
    assert list(samples_dataframe(tl, ["host.cpu_util"]).columns) == ["host.cpu_util"]
    assert samples_dataframe(Timeline()).empty


def test_nvidia_smi_csv_matches_nvidia_smi(fake_nvml: Any, tmp_path: Path) -> None:
    timeline = sampled(fake_nvml, scenarios.two_gpus())
    path = tmp_path / "gpu.csv"
    rows = write_nvidia_smi_csv(timeline, path)

    lines = path.read_text().splitlines()
    assert lines[0] == NVIDIA_SMI_HEADER
    assert rows == len(lines) - 1 >= 4
    first, second = lines[1].split(", "), lines[2].split(", ")
    assert ROW.match(first[0]) and first[0] == second[0]  # both GPUs of one tick share its timestamp
    assert first[1:] == [
        "NVIDIA H100 80GB HBM3",
        "P0",
        "61",
        "87 %",
        "41 %",
        "81920 MiB",
        "20480 MiB",
        "250.12 W",
    ]
    assert second[1:] == ["NVIDIA A100-SXM4-40GB", "P0", "61", "0 %", "0 %", "40960 MiB", "4 MiB", "62.40 W"]
    # the way scripts read it
    table = pd.read_csv(path, skipinitialspace=True)
    assert list(table.columns)[4] == "utilization.gpu [%]" and len(table) == rows


def test_unavailable_values_are_na_as_nvidia_smi_writes_them(fake_nvml: Any, tmp_path: Path) -> None:
    timeline = sampled(fake_nvml, scenarios.fields_not_supported())
    path = tmp_path / "gpu.csv"
    write_nvidia_smi_csv(timeline, path)
    with open(path, newline="") as f:
        header, row, *_ = list(csv.reader(f, skipinitialspace=True))
    record = dict(zip(header, row, strict=True))
    assert record["power.draw [W]"] == "[N/A]" and record["temperature.gpu"] == "[N/A]"
    assert record["utilization.gpu [%]"] == "87 %"


def test_no_gpu_gives_a_header_only_csv(tmp_path: Path) -> None:
    path = tmp_path / "gpu.csv"
    assert write_nvidia_smi_csv(Timeline(), path) == 0
    assert path.read_text() == NVIDIA_SMI_HEADER + "\n"
