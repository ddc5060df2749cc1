"""Where the memory goes, on real torch loops on the CPU: the breakdown against counts made by hand.

Parameters, gradients and optimizer state are counted from the layers' shapes; the activations saved
for backward from what each layer's backward needs (a linear layer its input, ReLU its output, max
pooling its input and its int64 indices, a convolution its input): each a storage counted once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import perfmagic
from perfmagic.contract.memory import MemoryDevice, MemorySection
from tests.sim_cuda import SimCuda, install

F32, I64 = 4, 8
MiB = 2**20


def mlp(d0: int, d1: int, d2: int, d3: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(d0, d1),
        torch.nn.ReLU(),
        torch.nn.Linear(d1, d2),
        torch.nn.ReLU(),
        torch.nn.Linear(d2, d3),
    )


def mlp_counts(b: int, d0: int, d1: int, d2: int, d3: int) -> tuple[int, int, int]:
    """(parameter bytes, parameter tensors, activation bytes) of :func:`mlp` on a batch of ``b``."""
    params = (d0 * d1 + d1 + d1 * d2 + d2 + d2 * d3 + d3) * F32
    # x saved by the first linear; each ReLU's output, saved by it and by the next linear (one storage)
    return params, 6, b * (d0 + d1 + d2) * F32


class Cnn(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(2)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(16 * (h // 2) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        return self.head(torch.relu(self.conv2(x)).flatten(1))


def cnn_counts(b: int, h: int) -> tuple[int, int, int]:
    q = (h // 2) ** 2
    params = (8 * 3 * 9 + 8 + 16 * 8 * 9 + 16 + 16 * q * 10 + 10) * F32
    acts = (
        b * 3 * h * h * F32  # conv1's input
        + b * 8 * h * h * F32  # relu's output (the pool's input)
        + b * 8 * q * I64  # the pool's indices
        + b * 8 * q * F32  # conv2's input (the pool's output)
        + b * 16 * q * F32  # relu's output, flattened for the head (a view: the same storage)
    )
    return params, 6, acts


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-3),
}


def state_bytes(name: str, params: int, tensors: int) -> int:
    """SGD with momentum: one buffer per parameter; Adam(W): two moments and a float32 step per tensor."""
    return params if name == "SGD" else 2 * params + tensors * F32


def train_report(
    tmp_path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int = 5
) -> perfmagic.Report:
    y = torch.randint(0, 10, (x.shape[0],))
    with perfmagic.profile(sources=[], outdir=tmp_path / "pm") as session:
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return session.report


def train(
    tmp_path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int = 5
) -> MemorySection:
    memory = train_report(tmp_path, model, opt, x, steps).to_dict()["memory"]
    assert memory is not None
    return memory


def cpu(memory: MemorySection) -> MemoryDevice:
    (device,) = memory["devices"]
    assert device["device"] == "cpu" and device["peak_source"] == "process_uss"
    return device


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_the_breakdown_is_what_the_layers_hold(tmp_path: Path, kind: str, opt_name: str) -> None:
    torch.manual_seed(0)
    if kind == "mlp":
        b, dims = 64, (32, 128, 96, 10)
        model, x = mlp(*dims), torch.randn(b, dims[0])
        params, tensors, acts = mlp_counts(b, *dims)
    else:
        b, h = 16, 16
        model, x = Cnn(h), torch.randn(b, 3, h, h)
        params, tensors, acts = cnn_counts(b, h)
    memory = train(tmp_path, model, OPTIMIZERS[opt_name](model.parameters()), x)
    d = cpu(memory)
    assert memory["optimizer"] == opt_name and memory["batch_size"] == b and memory["model_name"] == "model"
    assert d["parameters_bytes"] == params
    assert d["gradients_bytes"] == params
    assert d["optimizer_state_bytes"] == state_bytes(opt_name, params, tensors)
    assert abs(d["activations_bytes"] - acts) <= 0.1 * acts, (d["activations_bytes"], acts)
    assert d["activation_bytes_per_sample"] == pytest.approx(d["activations_bytes"] / b)
    assert d["peak_bytes"] is not None and d["peak_bytes"] >= params


# Tensors of more than 32 MiB: glibc maps each apart and unmaps it when freed, so the process's memory
# falls when a tensor is freed and the peak reading falls where the most tensors lived at once.
BIG = 36 * 2**20


def test_an_activation_heavy_step_peaks_in_backward(tmp_path: Path) -> None:
    # A narrow MLP on a long batch: its activations dwarf its weights; backward holds them all while it
    # makes the first activation gradients, more than the forward's end held.
    torch.manual_seed(0)
    dims = (32, 64, 64, 10)
    b = BIG // (64 * F32)
    model = mlp(*dims)
    memory = train(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(b, 32))
    d = cpu(memory)
    assert d["largest"] in ("activations", "other")
    assert d["activations_bytes"] > 10 * d["parameters_bytes"]
    assert d["peak_stage"] == "backward", d


def test_a_parameter_heavy_adam_step_peaks_in_the_optimizer(tmp_path: Path) -> None:
    # One wide layer on a tiny batch: Adam's update makes weight-sized temporaries (the second moment's
    # square root, divided) on top of the weights, their gradients and both moments.
    torch.manual_seed(0)
    model = torch.nn.Linear(4096, BIG // (4096 * F32) * 2)
    memory = train(tmp_path, model, torch.optim.Adam(model.parameters()), torch.randn(4, 4096))
    d = cpu(memory)
    assert d["optimizer_state_bytes"] == 2 * d["parameters_bytes"] + 2 * F32
    assert d["peak_stage"] == "optimizer", d


def test_the_cuda_breakdown_reads_the_caching_allocator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the simulated device: the forward holds its activations on the device until backward, the
    optimizer a temporary it had to retry for; the peak is the optimizer's, its reserved-but-unused
    bytes are fragmentation."""
    sim = install(monkeypatch, SimCuda())
    sim.alloc(100 * MiB)  # the model's weights and the like, there before the loop
    acts, temp = 300 * MiB, 500 * MiB
    model = torch.nn.Linear(8, 10)

    def forward_holds_activations(module: Any, args: Any, out: torch.Tensor) -> None:
        sim.alloc(acts)
        out.register_hook(lambda g: sim.free(acts))

    model.register_forward_hook(forward_holds_activations)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_makes_a_temporary(optimizer: Any, args: Any, kwargs: Any) -> None:
        sim.alloc(temp, retry=True)
        time.sleep(0.05)  # long enough for several readings
        sim.free(temp)

    opt.register_step_post_hook(step_makes_a_temporary)
    memory = train(tmp_path, model, opt, torch.randn(16, 8))
    gpu = next(d for d in memory["devices"] if d["device"] == "cuda:0")
    assert gpu["peak_source"] == "cuda_allocator" and gpu["peak_stage"] == "optimizer"
    assert gpu["peak_bytes"] == 100 * MiB + temp
    # reserved stays at the window's high-water mark: the activations' and the temporary's together
    assert gpu["fragmentation_bytes"] == sim.allocators[0].reserved - gpu["peak_bytes"]
    assert gpu["alloc_retries"] == 1 and gpu["ooms"] == 0
    assert gpu["total_bytes"] == sim.total_bytes


class Blocks(torch.nn.Module):
    """A stack of wide MLP blocks: most of what a step keeps for backward is inside the blocks."""

    def __init__(self, d: int = 64, n: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
            for _ in range(n)
        )
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = x + block(x)
        return self.head(x)


# Run with glibc mapping every allocation of 128 KiB or more apart: freed, it leaves the process, so
# the memory a forward leaves behind is what autograd holds.
_MEASURE = """
import json, os, sys
import torch
sys.path.insert(0, {tests!r})
from test_memory import Blocks

def held(model, x, y):
    page = os.sysconf("SC_PAGE_SIZE")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
    model.zero_grad(set_to_none=True)
    before = rss()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    after = rss()
    loss.backward()
    return after - before, float(loss), [p.grad.clone() for p in model.parameters()]

torch.manual_seed(0)
model = Blocks()
x, y = torch.randn(8000, 64), torch.randint(0, 10, (8000,))
held(model, x, y)
plain, loss0, grads0 = held(model, x, y)
exec({fix!r})
held(model, x, y)
fixed, loss1, grads1 = held(model, x, y)
grad_diff = max(float((a - b).abs().max()) for a, b in zip(grads0, grads1))
print(json.dumps({{"plain": plain, "fixed": fixed, "loss0": loss0, "loss1": loss1, "grad_diff": grad_diff}}))
"""


def test_the_checkpointing_fix_pasted_cuts_the_activations_and_keeps_the_loss(tmp_path: Path) -> None:
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    from perfmagic.advise import advise

    torch.manual_seed(0)
    model = Blocks()
    x = torch.randn(512, 64)
    report = train_report(tmp_path, model, torch.optim.AdamW(model.parameters()), x)
    memory, analysis = report.to_dict()["memory"], report.analysis
    assert memory is not None and analysis is not None
    assert memory["blocks_path"] == "layers" and len(memory["blocks"]) == 4
    # a batch-size estimate asked for (tuning tried the batch): the memory cards speak below the limit
    asked = dataclasses.replace(
        analysis, tuning=[{"knob": "batch_size", "best": {"value": 4000, "seconds": 0.001}}]
    )
    card = next(c for c in advise(asked).cards if c.id == "activation_memory")
    assert "for block in model.layers:" in card.fix
    assert card.metrics["freed_bytes"] > 0.3 * memory["devices"][0]["activations_bytes"]
    script = _MEASURE.format(tests=str(Path(__file__).parent), fix=card.fix)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["fixed"] <= 0.7 * got["plain"], got  # activations held for backward fall by 30% or more
    assert abs(got["loss1"] - got["loss0"]) <= 1e-6 and got["grad_diff"] <= 1e-6, got


_EIGHT_BIT = """
import json
import torch

def trained(fix):
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.8, 0.95), weight_decay=0.1)
    pasted = {{"torch": torch, "model": model, "opt": opt}}
    exec(fix, pasted)
    opt = pasted["opt"]
    x, y = torch.randn(4, 1024), torch.randint(0, 10, (4,))
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    state = sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    group = opt.param_groups[0]
    return {{"cls": type(opt).__name__, "state": state, "lr": group["lr"], "betas": list(group["betas"]),
             "weight_decay": group["weight_decay"], "first": losses[0], "last": losses[-1]}}

print(json.dumps({{"plain": trained(""), "fixed": trained({fix!r})}}))
"""


def test_the_eight_bit_optimizer_fix_pasted_quarters_the_state_and_keeps_the_settings(tmp_path: Path) -> None:
    import dataclasses
    import json
    import subprocess
    import sys

    from perfmagic.advise import advise

    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.8, 0.95), weight_decay=0.1)
    report = train_report(tmp_path, model, opt, torch.randn(4, 1024))
    assert report.analysis is not None
    asked = dataclasses.replace(  # a batch-size estimate asked for: the memory cards speak below the limit
        report.analysis, tuning=[{"knob": "batch_size", "best": {"value": 8, "seconds": 0.001}}]
    )
    card = next(c for c in advise(asked).cards if c.id == "optimizer_memory")
    assert "opt = bnb.optim.AdamW8bit(opt.param_groups)" in card.fix  # the user's name, their groups
    pasted = card.fix.replace("# $ pip install", "#").splitlines()
    out = subprocess.run(
        [sys.executable, "-c", _EIGHT_BIT.format(fix="\n".join(pasted))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    plain, fixed = got["plain"], got["fixed"]
    assert fixed["cls"] == "AdamW8bit" and plain["cls"] == "AdamW"
    assert fixed["state"] <= 0.3 * plain["state"], got  # 8-bit moments: about a quarter
    assert card.metrics["freed_bytes"] <= plain["state"] - fixed["state"] + plain["state"] * 0.05, got
    for setting in ("lr", "betas", "weight_decay"):
        assert fixed[setting] == plain[setting], got
    assert fixed["last"] < 0.5 * fixed["first"], got  # and it trains
