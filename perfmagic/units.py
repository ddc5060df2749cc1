"""How every layer writes numbers for people: durations, bytes and shares, with their units."""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def fmt_seconds(seconds: float | None) -> str:
    """A duration with a unit that keeps three significant digits."""
    if seconds is None:
        return "n/a"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def fmt_bytes(n: float | None) -> str:
    """Bytes in binary units (KiB, MiB, ...)."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_fraction(x: float | None) -> str:
    """A share in [0, 1] as a whole percentage."""
    return "n/a" if x is None else f"{x * 100:.0f}%"


def fmt_rate(x: float | None) -> str:
    """A rate for people: whole numbers with thousands separators from 100 up, else 3 significant digits.

    ``1180.4`` → ``"1,180"``, ``43.72`` → ``"43.7"``: never ``1.18e+03``.
    """
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
