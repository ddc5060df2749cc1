"""Fix code built from what was observed: the user's own names, their DataLoader and optimizer calls,
round intervals."""

from __future__ import annotations

from typing import Any

from perfmagic.advise.calls import WITHOUT_WORKERS, Drop, UserCall, find_call
from perfmagic.analyze import Analysis
from perfmagic.contract import LoaderConfig
from perfmagic.contract.code import FixSite
from perfmagic.contract.marks import OptimizerMark

FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
"""torch optimizers with a ``fused`` implementation: the update of all parameters in one kernel."""

_NOT_BESIDE_FUSED = Drop("torch rejects foreach=True beside fused=True")


def nice_interval(steps: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``steps``."""
    k = 1
    while k < steps:
        k = k * 5 // 2 if str(k).startswith("2") else k * 2
    return k


def loader_call(ld: LoaderConfig | None) -> UserCall | None:
    """The user's statement that built the DataLoader (None: not found for certain)."""
    return find_call(ld.call) if ld else None


def dataset_name(ld: LoaderConfig | None) -> str:
    """The user's own expression for the loader's dataset, where it is a name (``train_set``,
    ``self.data``); else ``dataset``."""
    call = loader_call(ld)
    text = call.passed().get("dataset") if call else None
    return text if text and text.replace(".", "").replace("_", "").isalnum() else "dataset"


def loader_site(ld: LoaderConfig | None) -> FixSite | None:
    call = loader_call(ld)
    return call.site if call else None


def dataloader_code(ld: LoaderConfig, **changes: Any) -> str:
    """The user's DataLoader call with ``changes`` applied, each change commented with the old value:
    their own statement where it was found, else a call of the settings perfmagic saw."""
    if ld.call is not None and (call := find_call(ld.call)) is not None:
        if not changes.get("num_workers", ld.num_workers):  # DataLoader rejects these without workers
            changes = {**changes, "persistent_workers": WITHOUT_WORKERS, "prefetch_factor": WITHOUT_WORKERS}
        return call.rewritten(changes, ld.call["values"])
    observed: dict[str, Any] = {
        "batch_size": ld.batch_size,
        "num_workers": ld.num_workers,
        "pin_memory": ld.pin_memory,
        "persistent_workers": ld.persistent_workers,
        "prefetch_factor": ld.prefetch_factor,
        "drop_last": ld.drop_last,
    }
    new = {**observed, **changes}
    if not new["num_workers"]:  # DataLoader rejects these without workers
        new["persistent_workers"] = new["prefetch_factor"] = None
    lines = ["loader = DataLoader(", "    dataset,"]
    for key, value in new.items():
        changed = key in changes and value != observed.get(key)
        if value is None or (value is False and not changed and key not in ("pin_memory",)):
            continue
        note = f"  # was {observed.get(key)!r}" if changed else ""
        lines.append(f"    {key}={value!r},{note}")
    lines += ["    # ...your other arguments (shuffle, sampler, collate_fn) unchanged", ")"]
    return "\n".join(lines)


def model_name(a: Analysis) -> str:
    """The name the user's code calls the model by (``net``); ``model`` where the hooks found none."""
    md = a.config.model
    named = md["variable"] if md else None
    return named or (a.memory["model_name"] if a.memory else None) or "model"


def fused_optimizer_code(opt: OptimizerMark) -> str:
    """The user's statement that built the optimizer, with ``fused=True``; where it was not found, the
    change in words (a comment)."""
    hint = opt["call"]
    call = find_call(hint) if hint else None
    if call is not None and hint is not None:
        return call.rewritten({"fused": True, "foreach": _NOT_BESIDE_FUSED}, hint["values"])
    name = opt["variable"] or "the optimizer"
    return f"# and build {name} with fused=True: torch.optim.{opt['cls']}(..., fused=True), its update in one kernel"
