"""Fix code built from what was observed: the user's own DataLoader call, round intervals."""

from __future__ import annotations

from typing import Any


def nice_interval(steps: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``steps``."""
    k = 1
    while k < steps:
        k = k * 5 // 2 if str(k).startswith("2") else k * 2
    return k


def dataloader_code(ld: dict[str, Any], **changes: Any) -> str:
    """The user's DataLoader call with ``changes`` applied, each change commented with the old value."""
    observed: dict[str, Any] = {
        "batch_size": ld.get("batch_size"),
        "num_workers": ld.get("num_workers") or 0,
        "pin_memory": bool(ld.get("pin_memory")),
        "persistent_workers": bool(ld.get("persistent_workers")),
        "prefetch_factor": ld.get("prefetch_factor"),
        "drop_last": bool(ld.get("drop_last")),
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
