"""Models compiled before the profiled cell: profiling adds no graph, no recompile, no graph break."""

from __future__ import annotations

from typing import Any

import pytest

import perfmagic

torch = pytest.importorskip("torch")
from torch._dynamo.utils import counters  # noqa: E402


def mlp() -> Any:
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1)
    )


@pytest.mark.parametrize("how", ["Module.compile", "compiled step function"])
def test_a_model_compiled_before_profiling_is_not_recompiled_by_it(how: str) -> None:
    torch._dynamo.reset()
    counters.clear()
    model, x = mlp(), torch.randn(4, 8)
    if how == "Module.compile":
        model.compile(backend="eager")
        loss_of = lambda: model(x).sum()  # noqa: E731
    else:
        loss_of = torch.compile(lambda: model(x).sum(), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad()
        loss_of().backward()
        opt.step()

    step()
    graphs = dict(counters["stats"])
    for _ in range(3):  # three profiled cells
        with perfmagic.profile(sample=False) as session:
            for _ in range(3):
                step()
        report = session.report.to_dict()
        assert report["steps"]["count"] == 3, (report["steps"], report["stages"], report["warnings"])
    assert dict(counters["stats"]) == graphs  # no graph the user did not have
    assert not counters["recompiles"] and not counters["graph_break"]
