"""The user's statements rewritten with a change: their text kept, only the change added."""

from __future__ import annotations

from perfmagic.advise.calls import WITHOUT_WORKERS, Drop, UserCall


def _call(statement: str) -> UserCall:
    return UserCall(
        "train.py", 12, 12, statement, ("DataLoader",), ("dataset", "batch_size", "shuffle", "sampler")
    )


def test_an_argument_written_as_an_expression_already_worth_the_change_stays_as_written() -> None:
    call = _call("loader = DataLoader(ds, batch_size=8, num_workers=w, persistent_workers=w > 0)")
    fix = call.rewritten(
        {"num_workers": 4, "persistent_workers": True}, {"num_workers": 2, "persistent_workers": True}
    )
    assert "persistent_workers=w > 0," in fix and "persistent_workers=True" not in fix, fix
    assert "num_workers=4,  # was 2 (w)" in fix, fix
    # an expression worth something else is changed, and says what it was worth
    off = call.rewritten(
        {"num_workers": 4, "persistent_workers": True}, {"num_workers": 0, "persistent_workers": False}
    )
    assert "persistent_workers=True,  # was False (w > 0)" in off, off
    # 1 is not True: a change of type is a change
    counted = _call("loader = DataLoader(ds, batch_size=n)").rewritten(
        {"batch_size": 1}, {"batch_size": True}
    )
    assert "batch_size=1,  # was True (n)" in counted, counted


def test_dropped_arguments_and_positional_ones_keep_the_users_text() -> None:
    call = _call("loader = DataLoader(ds, 8, True, prefetch_factor=4)")
    fix = call.rewritten(
        {"prefetch_factor": WITHOUT_WORKERS, "shuffle": False}, {"shuffle": True, "prefetch_factor": 4}
    )
    assert fix.startswith("# in place of train.py:12:\n"), fix
    assert "    ds,\n    8,\n" in fix and "False,  # shuffle, was True" in fix, fix
    assert "# prefetch_factor=4 removed: DataLoader rejects it without workers" in fix, fix


def test_the_optimizer_made_fused_keeps_every_argument_and_drops_foreach() -> None:
    call = UserCall(
        "train.py",
        30,
        31,
        "opt = torch.optim.AdamW(net.parameters(), 3e-4,\n                        weight_decay=0.1, foreach=True)",
        ("AdamW", "Optimizer"),
        ("params", "lr", "betas", "eps", "weight_decay", "amsgrad"),
    )
    no_foreach = Drop("torch rejects foreach=True with fused=True")
    fix = call.rewritten({"fused": True, "foreach": no_foreach}, {"fused": None, "foreach": True})
    assert fix.splitlines()[1:] == [
        "opt = torch.optim.AdamW(",
        "    net.parameters(),",
        "    3e-4,",
        "    weight_decay=0.1,",
        "    # foreach=True removed: torch rejects foreach=True with fused=True",
        "    fused=True,  # was None",
        ")",
    ], fix
    compile(fix, "fix", "exec")
