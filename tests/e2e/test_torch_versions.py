"""The hooks on older torch: what older versions lack is looked up the way they had it.

The oldest supported torch itself runs in ``make test-torch-min`` (its wheels are large); here,
torch 2.13 seen through a namespace that has only the older functions, so the old paths run in
``make test`` too.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

import perfmagic
from perfmagic.collect.torch_forward import autocast_queries, compiling_query

torch = pytest.importorskip("torch")


def test_autocast_is_read_the_pre_2_4_way() -> None:
    """torch < 2.4: no ``get_autocast_dtype``; ``is_autocast_enabled()`` takes no device and means CUDA."""
    old_torch: object = torch  # an older torch itself (make test-torch-min), else one seen as older
    if hasattr(torch, "get_autocast_dtype"):
        old_torch = SimpleNamespace(
            is_autocast_enabled=lambda: torch.is_autocast_enabled("cuda"),
            is_autocast_cpu_enabled=lambda: torch.is_autocast_enabled("cpu"),
            get_autocast_gpu_dtype=lambda: torch.get_autocast_dtype("cuda"),
            get_autocast_cpu_dtype=lambda: torch.get_autocast_dtype("cpu"),
        )
    enabled, dtype = autocast_queries(old_torch)
    assert not enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert enabled("cpu") and not enabled("cuda") and dtype("cpu") == torch.bfloat16


def test_dynamo_tracing_is_seen_before_torch_2_3() -> None:
    """Without ``torch.compiler.is_compiling`` the hooks still step aside while dynamo traces."""
    is_compiling = compiling_query(SimpleNamespace(compiler=SimpleNamespace(), _dynamo=torch._dynamo))
    seen: list[bool] = []

    def step(x: object) -> object:
        seen.append(is_compiling())
        return x

    assert not is_compiling()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch._dynamo.is_compiling is deprecated on current torch
        torch.compile(step, backend="eager", fullgraph=True)(torch.ones(2))
    assert seen == [True]


def test_cpu_autocast_reaches_the_counters() -> None:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with perfmagic.profile(sample=False) as session:
        for _ in range(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().sum()
            loss.backward()
            opt.step()
    assert session.timeline.marks("torch_stats")[-1].data["autocast_dtypes"] == {"cpu:bfloat16": 4}
