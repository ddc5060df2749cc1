"""NVML as a careful query helper: every NVML call perfmagic makes goes through :meth:`NvmlQuery.query`.

It turns "not supported", "no permission", a symbol missing from an older driver or an
older nvidia-ml-py into ``None`` plus one warning, and a lost GPU into a lost mark plus
one warning. Nothing NVML does raises out of it after :meth:`NvmlQuery.open`.

pynvml is reached only through :func:`_load_pynvml`, the seam tests replace with a
fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from perfmagic.clock import REAL_CLOCK, Clock

# NVML return codes (nvml.h; stable ABI, so plain ints keep this module import-free).
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_NO_DATA = 21
_GPU_NOT_FOUND = 28
_UNKNOWN = 999
_UNAVAILABLE_CODES = frozenset(
    {_NOT_SUPPORTED, _NO_PERMISSION, 2, 25, 26}
)  # + invalid arg, version, deprecated
_NO_DATA_CODES = frozenset({_NOT_FOUND, _NO_DATA})
_LOST_CODES = frozenset({_GPU_IS_LOST, _RESET_REQUIRED, _GPU_NOT_FOUND, _UNKNOWN})

#: c_nvmlValue_t member for each NVML_VALUE_TYPE_* (0..6).
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# A query: called with the pynvml module; alternatives are tried newest first.
Query = Callable[..., Any]


def _load_pynvml() -> Any:
    """The pynvml module; the one seam tests replace with a fake NVML."""
    import pynvml

    return pynvml


class NvmlUnavailable(Exception):
    """NVML cannot be used here; ``str(e)`` is the reason, for people."""


def _init_reason(error: Exception) -> str:
    code = getattr(error, "value", None)
    if code == _LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if code == _DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded"
    if code == _LIB_RM_VERSION_MISMATCH:
        return (
            "NVML and the NVIDIA kernel driver versions differ (reboot or reload the driver after an upgrade)"
        )
    if code == _NO_PERMISSION:
        return "no permission to talk to the NVIDIA driver"
    return f"NVML failed to start ({describe(error)})"


def describe(error: Exception) -> str:
    """An NVML error for people, even when the library is gone."""
    try:
        return str(error)
    except Exception:  # pynvml's __str__ calls into the library, which may be gone
        return f"NVML error {getattr(error, 'value', '?')}"


def text(value: Any) -> str:
    """An NVML string, which older nvidia-ml-py returns as bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlQuery:
    """An open NVML session and the one defensive query function.

    What NVML cannot say comes back as ``None``, and why goes into :attr:`warnings`,
    each reason once.
    """

    def __init__(self, nv: Any, handles: list[Any], clock: Clock = REAL_CLOCK) -> None:
        """Use :meth:`open`."""
        self.nv, self.handles, self.now, self.wall = nv, handles, clock.now, clock.wall
        self.warnings: list[str] = []
        self.names: dict[int, str] = {}  # GPU names, for warnings
        self._off: set[tuple[int | None, str]] = set()  # (index, key) not available, said once
        self._said: set[tuple[int | None, str]] = set()
        self._pick: dict[tuple[int | None, str], int] = {}  # which alternative of a query works
        self._lost: dict[int, str] = {}

    @classmethod
    def open(cls, clock: Clock = REAL_CLOCK) -> NvmlQuery:
        """Initialize NVML (slow reads timed on ``clock``); raises :class:`NvmlUnavailable` with the reason."""
        try:
            nv = _load_pynvml()
        except ImportError as e:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({e})") from e
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise NvmlUnavailable(_init_reason(e)) from e
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
            raise NvmlUnavailable(f"NVML cannot count the GPUs ({describe(e)})") from e
        handles: list[Any] = []
        failures: list[tuple[int, Exception]] = []
        for i in range(count):
            try:
                handles.append(nv.nvmlDeviceGetHandleByIndex(i))
            except nv.NVMLError as e:  # one bad GPU must not hide the others
                handles.append(None)
                failures.append((i, e))
        self = cls(nv, handles, clock)
        for i, error in failures:
            self.mark_lost(i, f"cannot be opened ({describe(error)})")
        return self

    def query(self, index: int | None, key: str, *queries: Query) -> Any:
        """Run the first query that exists here; ``None`` when not available.

        A query that hits a symbol missing from the driver (``FunctionNotFound``)
        or from an older nvidia-ml-py (a missing name or parameter) falls through
        to the next alternative; once one works it is used directly from then on.
        """
        slot = (index, key)
        if slot in self._off or (index is not None and index in self._lost):
            return None
        first = self._pick.get(slot, 0)
        nv = self.nv
        for k in range(first, len(queries)):
            try:
                value = queries[k](nv)
            except (AttributeError, TypeError):
                continue
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                if code == _FUNCTION_NOT_FOUND:
                    continue
                self._pick[slot] = k
                self.failed(index, key, e)
                return None
            self._pick[slot] = k
            return value
        self.unavailable(index, key, "not in this driver or nvidia-ml-py")
        return None

    def failed(self, index: int | None, key: str, error: Exception) -> None:
        """Take note of a failed read: a lost GPU, a metric not available here, or a miss to retry."""
        code = getattr(error, "value", None)
        if code in _LOST_CODES and index is not None:
            self.mark_lost(index, describe(error))
        elif code in _UNAVAILABLE_CODES:
            self.unavailable(index, key, describe(error))
        elif code not in _NO_DATA_CODES:
            self._say((index, key), f"{self._who(index)}: reading {key} failed ({describe(error)}), retrying")

    def unavailable(self, index: int | None, key: str, why: str) -> None:
        """``key`` is not available on this GPU: never asked again."""
        self._off.add((index, key))
        self._say((index, key), f"{self._who(index)}: {key} not available ({why})")

    def is_off(self, index: int | None, key: str) -> bool:
        return (index, key) in self._off

    def mark_lost(self, index: int, why: str) -> None:
        if index not in self._lost:
            self._lost[index] = why
            self.warnings.append(f"{self._who(index)} was lost ({why}); its metrics stop, the rest go on")

    def is_lost(self, index: int) -> bool:
        return index in self._lost

    def lost_reason(self, index: int) -> str | None:
        return self._lost.get(index)

    def _say(self, slot: tuple[int | None, str], message: str) -> None:
        if slot not in self._said:
            self._said.add(slot)
            self.warnings.append(message)

    def _who(self, index: int | None) -> str:
        if index is None:
            return "NVML"
        name = self.names.get(index)
        return f"GPU {index}" + (f" ({name})" if name else "")

    def close(self) -> None:
        with contextlib.suppress(self.nv.NVMLError):
            self.nv.nvmlShutdown()
