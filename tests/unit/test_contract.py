"""The typed contract holds what the code emits: every key of a report and of a timeline's meta is
declared in :mod:`perfmagic.contract`, every required key is there, every value has its declared type."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from analysis_builder import CUDA_TORCH, GiB, gpu_static, timeline
from contract_checks import mismatches
from trace_data import real

import perfmagic
from perfmagic.analyze import StageStats, StepStats, training_config
from perfmagic.analyze.evaluation import EvaluationStats
from perfmagic.analyze.ranks import Straggler as StragglerStats
from perfmagic.contract import (
    CheckpointMark,
    ComparisonData,
    Evaluation,
    ModelMark,
    OptimizerMark,
    ReportData,
    Stage,
    Steps,
    Straggler,
    TimelineMeta,
    TorchCounters,
)
from perfmagic.report import Report, report_from_timelines
from perfmagic.trace_report import report_from_traces


def conforms(value: Any, tp: Any) -> None:
    found = mismatches(value, tp)
    assert not found, "\n".join(found[:40])


def _profiled() -> Report:
    """A hand-laid run on one GPU with NVML's facts and samples, as a live profile records them."""
    samples = {
        "gpu0.util": 0.8,
        "gpu0.mem_used_bytes": 20 * GiB,
        "host.cpu_util": 0.3,
        "host.rss_bytes": 2 * GiB,
    }
    tl = timeline(devices=[gpu_static(numa_cpus=list(range(8)))], samples=samples, torch=CUDA_TORCH)
    return report_from_timelines([tl])


def test_a_report_from_a_laid_out_run_has_the_declared_keys_and_types() -> None:
    report = _profiled()
    data = report.to_dict()
    assert data["devices"] and data["advice"] is not None
    conforms(data, ReportData)
    conforms(json.loads(report.to_json()), ReportData)
    conforms(report.timelines[0].meta, TimelineMeta)


@pytest.mark.parametrize(
    "names", [["h200_train.json.gz"], ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"]]
)
def test_a_report_from_traces_has_the_declared_keys_and_types(names: list[str]) -> None:
    report = report_from_traces([real(n) for n in names])
    data = report.to_dict()
    assert data["gpu"] is not None
    if len(names) > 1:
        assert len(data["ranks"]) == 2 and all("step_table" in r for r in data["ranks"])
    conforms(data, ReportData)
    conforms(json.loads(report.to_json()), ReportData)


def test_a_comparison_of_two_traced_reports_has_the_declared_keys_and_types() -> None:
    before, after = (report_from_traces([real(n)]) for n in ("h200_train.json.gz", "sampled_rank-0.json.gz"))
    data = before.compare(after).to_dict()
    assert data["gpu"] and data["kernels"]  # both traced: the GPU figures and kernels are compared too
    conforms(data, ComparisonData)
    conforms(json.loads(json.dumps(data)), ComparisonData)


def test_the_hooks_marks_of_a_real_loop_have_the_declared_keys_and_types(tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=4)
    with perfmagic.profile(outdir=tmp_path, sample=False, children=False) as session:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.save(model.state_dict(), tmp_path / "weights.pt")
        torch.save({"model": model.state_dict(), "step": 4}, tmp_path / "checkpoint.pt")
    config = training_config(session.timeline)
    assert len(config.models) == len(config.optimizers) == 1 and len(config.checkpoints) == 2
    assert config.counters["optimizer_steps"] == 4 and "num_threads" in config.counters
    for model_mark in config.models:
        conforms(model_mark, ModelMark)
    for optimizer_mark in config.optimizers:
        conforms(optimizer_mark, OptimizerMark)
    for checkpoint in config.checkpoints:
        conforms(checkpoint, CheckpointMark)
    conforms(config.counters, TorchCounters)


def test_a_report_of_no_steps_has_the_declared_keys_and_types() -> None:
    conforms(report_from_timelines([timeline(steps=0)]).to_dict(), ReportData)


def test_the_check_finds_an_undeclared_key_a_missing_key_and_a_wrong_type() -> None:
    data: dict[str, Any] = json.loads(_profiled().to_json())
    data["steps"]["extra"] = 1
    del data["host"]["cpu_count"]
    data["stages"]["forward"]["total_s"] = "1"
    data["advice"].append({**data["advice"][0], "severity": "urgent"} if data["advice"] else {"id": 1})
    found = "\n".join(mismatches(data, ReportData))
    assert "$.steps.extra: not a key of Steps" in found
    assert "$.host.cpu_count: missing" in found
    assert "$.stages.forward.total_s: str" in found
    assert f"$.advice[{len(data['advice']) - 1}]" in found


@pytest.mark.parametrize(
    ("stats", "section"),
    [(StepStats, Steps), (StageStats, Stage), (EvaluationStats, Evaluation), (StragglerStats, Straggler)],
)
def test_each_dataclass_the_report_copies_has_exactly_its_sections_keys(stats: Any, section: Any) -> None:
    # report.py copies these field by field: a field added to one must be added to the other
    assert {f.name for f in dataclasses.fields(stats)} == set(section.__annotations__)


def test_each_name_of_the_contract_is_read_from_the_module_the_type_checker_is_told() -> None:
    """The contract's names are imported when first read (a profiled process imports the marks alone):
    each resolves to its module's own object, and the imports the type checker reads name the same."""
    import ast
    import importlib

    import perfmagic.contract as contract

    told = {
        (node.module.rsplit(".", 1)[1], alias.name)
        for node in ast.walk(ast.parse(Path(contract.__file__).read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perfmagic.contract.")
        for alias in node.names
    }
    homes = {(module, name) for module, names in contract.HOMES.items() for name in names}
    assert told == homes
    for module, name in homes:
        assert getattr(contract, name) is getattr(
            importlib.import_module(f"perfmagic.contract.{module}"), name
        )
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        contract.Nothing  # noqa: B018
