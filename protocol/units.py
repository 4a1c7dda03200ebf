"""One way to write a size, wherever hotspare shows one (the console's views, ``hotspare
check``, disk-full messages, ``hotspare-executor health``): binary units spelled as such, a
space before the unit, a decimal only below 10 (``980 KiB``, ``7.5 GiB``, ``74 GiB``).

Here, beside the wire protocol, because both the console and the executor show sizes and
neither may import the other.
"""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
MIB = 2**20


def _scale(n_bytes: float) -> tuple[float, str]:
    """``n_bytes`` in the largest unit that keeps it at 1 or more (as printed, so 1023.9 MiB
    is 1.0 GiB, not 1024 MiB)."""
    value = float(n_bytes)
    for unit in UNITS[:-1]:
        if abs(value) < 1023.5:
            return value, unit
        value /= 1024
    return value, UNITS[-1]


def _digits(value: float, unit: str) -> int:
    """Decimals to print: one below 10 (9.96 would print as 10.0: none), none for bytes."""
    return 0 if unit == "B" or abs(value) >= 9.95 else 1


def size(n_bytes: float) -> str:
    """``512 B``, ``980 KiB``, ``12 MiB``, ``7.5 GiB``, ``74 GiB``, ``1.2 TiB``."""
    value, unit = _scale(n_bytes)
    return f"{value:.{_digits(value, unit)}f} {unit}"


def size_mb(mib: float) -> str:
    """A size measured in MiB (as Health and the preflight report them)."""
    return size(mib * MIB)


def used_of(used_bytes: float, total_bytes: float) -> str:
    """``40/80 GiB``, ``3.0/8.0 GiB``: a part and its whole in the whole's unit and digits."""
    total, unit = _scale(total_bytes)
    used, digits = used_bytes / 1024 ** UNITS.index(unit), _digits(total, unit)
    return f"{used:.{digits}f}/{total:.{digits}f} {unit}"
