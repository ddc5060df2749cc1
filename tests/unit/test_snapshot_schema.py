"""The sidebar's snapshot schema: Python TypedDicts, generated TypeScript, real snapshots.

``perfmagic/server/snapshot.py`` declares the snapshot as TypedDicts; the sidebar's types
(``labextension/src/snapshot.ts``) are generated from them (``python -m perfmagic.server.snapshot_ts``).
These tests hold the three together: the committed TypeScript is what the generator writes now,
and snapshots the server really builds (from the fake NVML, through the sampler's own code) have
exactly the declared fields, of the declared types: a field added, dropped or renamed on either
side fails here.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import fake_nvml as fakes
import pytest

from perfmagic.server import handlers, service, snapshot, snapshot_ts
from perfmagic.server.kernels import kernel_info

GiB = 1024**3


def test_generated_typescript_is_up_to_date() -> None:
    committed = snapshot_ts.TS_PATH.read_text()
    assert committed == snapshot_ts.render(), (
        "labextension/src/snapshot.ts is not what perfmagic/server/snapshot.py's TypedDicts generate: "
        "run `python -m perfmagic.server.snapshot_ts` and commit the file"
    )


def test_the_generator_maps_json_types_only() -> None:
    found: list[type] = []
    assert snapshot_ts.ts_type(list[int | None] | None, found) == "(number | null)[] | null"
    assert snapshot_ts.ts_type(Literal["a", "b"], found) == "'a' | 'b'"
    assert snapshot_ts.ts_type(snapshot.KernelRef | None, found) == "IKernelRef | null"
    assert found == [snapshot.KernelRef]
    for unmapped in (Any, dict[str, int], object):
        with pytest.raises(TypeError):
            snapshot_ts.ts_type(unmapped, found)


def mismatches(value: Any, tp: Any, where: str = "snapshot") -> list[str]:
    """How ``value`` differs from the annotation ``tp`` (a TypedDict checked key for key)."""
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        hints = get_type_hints(tp)
        out = [f"{where}.{k}: missing" for k in sorted(tp.__required_keys__ - value.keys())]
        out += [f"{where}.{k}: not in {tp.__name__}" for k in sorted(value.keys() - hints.keys())]
        for k in value.keys() & hints.keys():
            out += mismatches(value[k], hints[k], f"{where}.{k}")
        return out
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        arms = [mismatches(value, a, where) for a in args]
        return [] if any(not m for m in arms) else [m for arm in arms for m in arm]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        return [m for i, v in enumerate(value) for m in mismatches(v, args[0], f"{where}[{i}]")]
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r} is not one of {args}"]
    if tp is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    wanted = (int, float) if tp is float else (tp,)
    if (isinstance(value, bool) and tp is not bool) or not isinstance(value, wanted):
        return [f"{where}: {value!r} is not {tp.__name__}"]
    return []


def _snapshot(monkeypatch: pytest.MonkeyPatch, prepare: Callable[[Any], None] = lambda nv: None) -> Any:
    """One sample as the sampler thread takes it, served as the handlers serve it."""
    me = {"pid": os.getpid(), "rank": 1, "local_rank": 0, "hostname": "node-a"}
    monkeypatch.setattr(service, "running_sessions", lambda: [me])
    monitor = service.MonitorService()
    kernel = kernel_info("k-1", types.SimpleNamespace(kernel_name="python3"), {"path": "a/train.ipynb"})
    monkeypatch.setattr(monitor.kernels, "kernel_for", lambda pid: kernel if pid == os.getpid() else None)
    nv, reason = service.open_nvml()
    static = [] if nv is None else [nv.static_info(i) for i in range(nv.device_count())]
    try:
        if nv is not None:
            prepare(nv)
        host = snapshot.HostReader()
        snap = monitor._sample(1, nv, reason, static, host, snapshot.ProcessCache(0.0))
    finally:
        if nv is not None:
            nv.close()
    return handlers._with_age(snap)


SCENARIOS = {
    "two_gpus": fakes.two_gpus,
    "fields_not_supported": fakes.fields_not_supported,
    "older_driver": fakes.older_driver,
    "mig": fakes.mig,
    "foreign_pids": fakes.foreign_pids,
    "no_library": fakes.no_library,
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_real_snapshots_have_exactly_the_schema(
    name: str, fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml(SCENARIOS[name]())
    snap = _snapshot(monkeypatch)
    assert mismatches(snap, snapshot.Snapshot) == []
    if name == "two_gpus":  # every part of the schema was there to check
        assert len(snap["gpus"]) == 2 and snap["host"]["cpu_count"] >= 1
        mine = [p for p in snap["processes"] if p["pid"] == os.getpid()]
        assert mine[0]["kernel"]["notebook"] == "train.ipynb" and mine[0]["rank"] == 1


def test_lost_and_unreadable_gpus_keep_the_schema(fake_nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_nvml(fakes.gpu_lost())

    def lose_one_and_break_the_other(nv: Any) -> None:
        fake.gpus[1].lost = True
        real_read = nv.read

        def read(i: int) -> Any:
            if i == 0:
                raise RuntimeError("driver hung")
            return real_read(i)

        nv.read = read

    snap = _snapshot(monkeypatch, lose_one_and_break_the_other)
    assert [g["lost"] for g in snap["gpus"]] == [True, True]
    assert snap["gpus"][0]["lost_reason"] == "read failed: RuntimeError: driver hung"
    assert snap["gpus"][1]["lost_reason"] and snap["gpus"][1]["util_gpu"] is None
    assert mismatches(snap, snapshot.Snapshot) == []


def test_the_starting_snapshot_has_the_schema() -> None:
    snap = handlers._with_age(service.starting_snapshot(1.0))
    assert mismatches(snap, snapshot.Snapshot) == []


def test_a_wrong_field_is_named() -> None:
    snap = handlers._with_age(service.starting_snapshot(1.0))
    snap["nvml"] = {**snap["nvml"], "device_count": "0", "extra": 1}
    del snap["seq"]
    assert sorted(mismatches(snap, snapshot.Snapshot)) == [
        "snapshot.nvml.device_count: '0' is not int",
        "snapshot.nvml.extra: not in NvmlStatus",
        "snapshot.seq: missing",
    ]
