"""Fix code speaks of the user's own objects: the model and the optimizer by the names their code
calls them by, the optimizer's own statement rewritten with every argument they passed."""

from __future__ import annotations

import runpy
from pathlib import Path

import torch
from analysis_builder import MODEL, OPTIMIZER, build

import perfmagic
from perfmagic.advise import gpu
from perfmagic.advise.fixes import fused_optimizer_code, model_name
from perfmagic.analyze import training_config

TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.AdamW(net.parameters(), 3e-4,
                        weight_decay=0.1, foreach=True)
batches = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 2)), batch_size=8)
for x, y in batches:
    loss = torch.nn.functional.mse_loss(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_the_fused_optimizer_is_the_users_statement_and_runs_as_pasted(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with perfmagic.profile(outdir=tmp_path, sample=False, children=False) as session:
        trained = runpy.run_path(str(script))
    config = training_config(session.timeline)
    (model,), (opt,) = config.models, config.optimizers
    assert model["variable"] == "net" and opt["variable"] == "opt"
    fix = fused_optimizer_code(opt)
    assert fix.splitlines()[1:] == [
        "opt = torch.optim.AdamW(",
        "    net.parameters(),",
        "    3e-4,",
        "    weight_decay=0.1,",
        "    # foreach=True removed: torch rejects foreach=True beside fused=True",
        "    fused=True,  # was None",
        ")",
    ], fix
    pasted = {"torch": torch, "net": trained["net"]}
    exec(fix, pasted)
    fused = pasted["opt"]
    assert fused.defaults["fused"] is True and fused.defaults["foreach"] is None
    assert fused.defaults["lr"] == 3e-4 and fused.defaults["weight_decay"] == 0.1
    # it steps the same parameters
    before = [q.detach().clone() for q in trained["net"].parameters()]
    torch.nn.functional.mse_loss(trained["net"](trained["x"]), trained["y"]).backward()
    fused.step()
    assert all(not torch.equal(b, q) for b, q in zip(before, trained["net"].parameters(), strict=True))


def test_without_the_statement_the_change_is_said_and_the_names_are_the_users() -> None:
    said = fused_optimizer_code({**OPTIMIZER, "cls": "AdamW"})  # type: ignore[typeddict-item]
    assert said.startswith("# and build opt with fused=True: torch.optim.AdamW(..., fused=True)")
    trace = {
        "busy_fraction": 0.6,
        "idle_fraction": 0.4,
        "idle_breakdown": {"host_wait": 0.1, "kernel_wait": 0.25},
        "launches": None,
    }
    a = build(model={**MODEL, "device": "cuda:0"}, gpu=trace, optimizer={"cls": "AdamW"})
    assert model_name(a) == "net"
    card = gpu.launch_bound(a)
    assert card is not None
    assert card.fix.startswith("net = torch.compile(net, mode='reduce-overhead')"), card.fix
    compile(card.fix, "fix", "exec")
    unnamed = build(model={**MODEL, "variable": None}, gpu=trace)
    assert model_name(unnamed) == "model"
