"""The output convention every benchmark shares: human-readable figures, and with ``--json`` one
JSON object as the last line of stdout, which ``benchmarks/run_all.py`` collects.

A benchmark run as ``python benchmarks/NAME.py`` has ``benchmarks/`` on ``sys.path``, so::

    from common import Figure, emit

    emit("protocol_rate", [Figure("decode rate", 2.1e5, "msgs/s", ">= 100000", True)],
         notes="8 GPUs per Health, 20000 messages", as_json=args.json)

The JSON line is::

    {"benchmark": "<name>", "figures": [{"name": ..., "value": <number>, "unit": ...,
     "target": "<e.g. <= 5 s, or empty>", "ok": <true|false|null>}], "notes": "<one line>"}
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Figure:
    """One measured figure. ``ok`` is None when the figure has no target."""

    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None


def at_most(value: float, bar: float) -> bool:
    return math.isfinite(value) and value <= bar


def at_least(value: float, bar: float) -> bool:
    return math.isfinite(value) and value >= bar


def fmt_value(value: float) -> str:
    """A figure's value for a table: a few significant digits, no exponent for everyday sizes."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e12:
        return f"{int(value)}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _json_number(value: float) -> float | None:
    # JSON has no NaN or infinity; a figure that could not be measured is null.
    return value if math.isfinite(value) else None


def to_json(benchmark: str, figures: list[Figure], notes: str) -> str:
    body = {
        "benchmark": benchmark,
        "figures": [{**asdict(f), "value": _json_number(float(f.value))} for f in figures],
        "notes": " ".join(notes.split()),
    }
    return json.dumps(body, allow_nan=False)


def emit(benchmark: str, figures: list[Figure], notes: str, as_json: bool) -> None:
    """Print the figures as a table; with ``as_json``, also print the JSON object as the last line."""
    print(f"# {benchmark}: {notes}")
    print("| figure | value | target | met |\n|---|---|---|---|")
    for f in figures:
        met = "" if f.ok is None else ("yes" if f.ok else "NO")
        print(f"| {f.name} | {fmt_value(f.value)} {f.unit} | {f.target} | {met} |")
    if as_json:
        print(to_json(benchmark, figures, notes), flush=True)
