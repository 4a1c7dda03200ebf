"""What each table shows, as plain text cells computed from the controller's state.

Kept free of Textual so the same rows can be printed or tested without a terminal.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from console.controller import Controller
from console.fleet.health_rules import Severity
from console.fleet.hosts import STALE_AFTER_SAMPLES, HostRuntime
from console.states import HostState, JobState
from console.supervise.supervisor import Supervisor
from protocol.messages import Health
from protocol.units import MIB, size_mb, used_of

Row = tuple[str, ...]

FLEET_COLUMNS = (
    "host",
    "state",
    "role",
    "GPU",
    "GPU mem",
    "temp/power",
    "CPU/mem",
    "disk",
    "seen",
    "job",
    "util trend",
    "alerts",
)
JOB_COLUMNS = (
    "job",
    "host -> spare",
    "state",
    "epoch",
    "restarts",
    "progress",
    "loss",
    "steps/s",
    "checkpoint",
    "replica",
)
FLEET_WIDTHS = {"GPU": 7, "GPU mem": 9, "temp/power": 9, "CPU/mem": 9, "disk": 8, "seen": 4}
JOB_WIDTHS = {"epoch": 5, "loss": 7, "checkpoint": 14}
"""Room kept from the start for a column's usual values (``LiveTable``'s ``min_widths``): a
number growing a digit does not shift the columns to its right."""
REGION_PREFIX = "region:"
BAR_WIDTH = 12
SPARK_WIDTH = 10
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
TAG_MARK = "●"
ALERTS_WIDTH = 22


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def age(seconds: float | None) -> str:
    """A short human age: 0.4s, 12s, 3m, 2h."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def seen(ago: float, every_s: float) -> str:
    """``ok`` while the host is heard on time (its heartbeat, or the reachability probe of a
    host with no executor, every ``every_s``), else how long ago it last was (a cell that does
    not change on every redraw for every healthy host)."""
    return "ok" if ago <= 2 * every_s else age(ago)


def progress_bar(step: int, steps: int, width: int = BAR_WIDTH) -> str:
    frac = min(max(step / steps, 0.0), 1.0) if steps else 0.0
    full = round(frac * width)
    digits = len(str(steps))  # as wide at step 5 as at the last step: no shifting
    return f"{'█' * full}{'░' * (width - full)} {step:>{digits}}/{steps} {frac:4.0%}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def spark(values: Sequence[float | None], width: int = SPARK_WIDTH, top: float = 100.0) -> str:
    """The last ``width`` values as a one-line sparkline scaled 0..top (a gap where unknown)."""
    steps = len(SPARK_BLOCKS) - 1
    scale = steps / top if top > 0 else 0.0
    out = []
    for i in range(max(len(values) - width, 0), len(values)):  # a deque indexes its ends fast
        v = values[i]
        if v is None or v != v:  # unknown, or NaN
            out.append(" ")
        else:
            out.append(SPARK_BLOCKS[round(min(max(v * scale, 0.0), steps))])
    return "".join(out)


def filtered(rows: Mapping[str, Row], text: str, is_item: Callable[[str], bool]) -> dict[str, Row]:
    """Rows with ``text`` in any cell or in their group's header (case-insensitive); a header
    stays while any of its rows does."""
    if not text:
        return dict(rows)
    needle = text.lower()
    out: dict[str, Row] = {}
    header: tuple[str, Row] | None = None
    in_header = False
    for key, row in rows.items():
        if not is_item(key):
            header, in_header = (key, row), any(needle in cell.lower() for cell in row)
            continue
        if in_header or any(needle in cell.lower() for cell in row):
            if header is not None:
                out.setdefault(header[0], header[1])
            out[key] = row
    return out


_NUMBER = re.compile(r"(\d+(?:\.\d+)?)\s*(kib|mib|gib|tib|pib|s|m|h)?(?![a-z])|[a-z_]+")
_SCALE = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
_SCALE |= {"s": 1, "m": 60, "h": 3600}
_NO_VALUE = frozenset({"", "-"})


def sort_key(cell: str) -> tuple[tuple[int, float, str], ...]:
    """A cell as it sorts: numbers as numbers (with their unit: ``3m`` after ``12s``,
    ``980 KiB`` before ``7.5 GiB``), words as words, in the order they come."""
    key: list[tuple[int, float, str]] = []
    for m in _NUMBER.finditer(cell.lower()):
        number, unit = m.group(1), m.group(2)
        if number is None:
            key.append((1, 0.0, m.group(0)))
        else:
            key.append((0, float(number) * _SCALE.get(unit or "", 1), ""))
    return tuple(key)


def sorted_rows(
    rows: Mapping[str, Row], column: int, reverse: bool, is_item: Callable[[str], bool]
) -> dict[str, Row]:
    """Rows sorted by one column within their group (a header row and its items stay
    together); a cell with no value (``-``) last either way."""
    out: dict[str, Row] = {}
    group: list[tuple[str, Row]] = []

    def flush() -> None:
        known = [kr for kr in group if kr[1][column].strip() not in _NO_VALUE]
        unknown = [kr for kr in group if kr[1][column].strip() in _NO_VALUE]
        known.sort(key=lambda kr: sort_key(kr[1][column]), reverse=reverse)
        out.update(known + unknown)
        group.clear()

    for key, row in rows.items():
        if is_item(key):
            group.append((key, row))
        else:
            flush()
            out[key] = row
    flush()
    return out


def tagged(rows: Mapping[str, Row], tags: set[str]) -> dict[str, Row]:
    """Rows with a mark in their first cell where tagged."""
    return {
        k: ((f"{TAG_MARK}{r[0][1:]}" if r[0].startswith(" ") else f"{TAG_MARK} {r[0]}"), *r[1:])
        if k in tags
        else r
        for k, r in rows.items()
    }


def _gpu_cells(h: Health | None) -> Row:
    if h is None:
        return ("-", "-", "-")
    if not h.gpus:
        return ("no GPU", "-", "-")
    n = len(h.gpus)

    def avg(xs: list[float | None]) -> float | None:
        vals = [x for x in xs if x is not None]
        return sum(vals) / len(vals) if vals else None

    util = avg([g.util_pct for g in h.gpus])
    used = sum(g.mem_used_mb or 0.0 for g in h.gpus)
    total = sum(g.mem_total_mb or 0.0 for g in h.gpus)
    temp = max((g.temp_c for g in h.gpus if g.temp_c is not None), default=None)
    power = sum(g.power_w for g in h.gpus if g.power_w is not None) if h.gpus else None
    lost = sum(g.lost for g in h.gpus)
    mem = used_of(used * MIB, total * MIB) if total else "-"
    util_s = _num(util, "%") + (f" x{n}" if n > 1 else "") + (f" {lost} lost" if lost else "")
    return (util_s, mem, f"{_num(temp, 'C')} {_num(power, 'W')}")


RowCache = dict[str, tuple[tuple[object, ...], Row]]
"""A host's row, kept while what it shows has not changed (a thousand rows, four times a second)."""


def fleet_rows(
    ctl: Controller, now: float | None = None, cache: RowCache | None = None
) -> dict[str, Row]:
    """Hosts grouped by region (a header row per region), keyed by host name."""
    now = time.monotonic() if now is None else now
    cache = {} if cache is None else cache
    rows: dict[str, Row] = {}
    blank = ("",) * (len(FLEET_COLUMNS) - 1)
    spare_of = spares_of(ctl)
    for region in sorted(ctl.inv.regions, key=lambda r: (ctl.inv.regions[r].priority, r)):
        names = sorted(n for n, h in ctl.inv.hosts.items() if h.region == region)
        if not names:
            continue
        rows[REGION_PREFIX + region] = (f"▼ {region}", *blank)
        for name in names:
            rt = ctl.fleet.hosts[name]
            heartbeat = seen(now - rt.last_seen, rt.heard_every_s) if rt.last_seen else "-"
            old = sample_old(rt, now)
            does = role(ctl, name, spare_of.get(name, ()))
            key = (rt.samples, rt.state, rt.job, heartbeat, old, does)
            hit = cache.get(name)
            if hit is None or hit[0] != key:
                hit = cache[name] = (key, host_row(ctl, name, heartbeat, old, does))
            rows[name] = hit[1]
    return rows


def spares_of(ctl: Controller) -> dict[str, list[str]]:
    """Host -> the live jobs it is a spare of (in the order of ``ctl.jobs``)."""
    out: dict[str, list[str]] = {}
    for name, sup in ctl.jobs.items():
        if not sup.state.is_terminal():
            for spare in sup.spares:
                out.setdefault(spare, []).append(name)
    return out


ROLE_WIDTH = 16


def role(ctl: Controller, host: str, spare_for: Sequence[str] = ()) -> str:
    """What the host does now, not what the inventory first made it: ``runs demo`` (a spare
    that took the job over too), ``spare of demo``, else ``spare`` (free) or ``idle``."""
    job = ctl.fleet.hosts[host].job
    if job:
        return _short(f"runs {job}", ROLE_WIDTH)
    if spare_for:
        whose = spare_for[0] if len(spare_for) == 1 else f"{len(spare_for)} jobs"
        return _short(f"spare of {whose}", ROLE_WIDTH)
    return "spare" if ctl.inv.hosts[host].role == "spare" else "idle"


HOST_MARKS = {
    HostState.DOWN: "error",
    HostState.SUSPECT: "warning",
    HostState.DRAINING: "warning",
    HostState.DRAINED: "muted",
    HostState.CORDONED: "muted",
}
"""Host states whose Fleet row is coloured, and how (``LiveTable.MARKS``): lost in the error
colour, on its way out in the warning colour, set aside by an operator (or a GPU FAIL's
drain, once drained) muted."""


def host_mark(rt: HostRuntime) -> str | None:
    """A host's colour: a health rule's FAIL (GPU FAIL) as lost, a WARN as suspect, else its
    state's (``HOST_MARKS``)."""
    if rt.state is HostState.DOWN or any(f.severity is Severity.FAIL for f in rt.findings):
        return "error"
    mark = HOST_MARKS.get(rt.state)
    if mark is None and rt.findings:
        return "warning"
    return mark


def host_marks(ctl: Controller, keys: Iterable[str]) -> dict[str, str]:
    """The Fleet rows (of ``keys``: hosts and region headers) to colour for their host's state
    and health."""
    hosts = ctl.fleet.hosts
    return {k: m for k in keys if k in hosts and (m := host_mark(hosts[k]))}


JOB_MARKS = {
    JobState.FAILED: "error",
    JobState.UNREACHABLE: "warning",
    JobState.FAILING_OVER: "warning",
    JobState.RESTARTING: "warning",
    JobState.STOPPED: "muted",
    JobState.FINISHED: "success",
}
"""Job states whose Jobs row is coloured, and how (``LiveTable.MARKS``)."""


def job_marks(ctl: Controller, keys: Iterable[str]) -> dict[str, str]:
    """The Jobs rows to colour: a failover awaiting the operator's approval stands out
    (``attention``), else the job's state's colour (``JOB_MARKS``)."""
    out: dict[str, str] = {}
    for key in keys:
        sup = ctl.jobs.get(key)
        if sup is None:
            continue
        if sup.awaiting_approval:
            out[key] = "attention"
        elif mark := JOB_MARKS.get(sup.state):
            out[key] = mark
    return out


def sample_old(rt: HostRuntime, now: float) -> str | None:
    """``"38s old"`` when the host's newest sample is too old to show as current, else None."""
    return f"{age(rt.sample_age(now))} old" if rt.sample_stale(now) else None


def host_row(
    ctl: Controller, name: str, heartbeat: str, old: str | None = None, does: str | None = None
) -> Row:
    """A host's row; with ``old`` (its newest sample's age, the sample too old to be current),
    the numbers are not shown as live: the GPU cell says how old they are, the rest is blank.
    ``does``: its role now (``role``; worked out here when not given)."""
    rt = ctl.fleet.hosts[name]
    h = rt.health[-1] if rt.health else None
    gpu, cpu_mem, disk, trend = _gpu_cells(h), "-", "-", spark(rt.util_history)
    if old is not None:
        gpu, trend = (f"({old})", "-", "-"), ""
    elif h is not None:
        cpu_mem = f"{h.cpu_pct:.0f}%/{h.mem_used_pct:.0f}%"
        disk = size_mb(h.disk_free_mb)
    alerts = _short(", ".join(dict.fromkeys(f.rule for f in rt.findings)), ALERTS_WIDTH)
    return (
        f"  {name}",
        rt.state.value,
        role(ctl, name, spares_of(ctl).get(name, ())) if does is None else does,
        *gpu,
        cpu_mem,
        disk,
        heartbeat,
        rt.job or "",
        trend,
        alerts,
    )


def replica_cell(
    ctl: Controller,
    job: str,
    spare: str,
    newest: int | None,
    shards: list[int | None] | None = None,
    now: float | None = None,
) -> str:
    """The spare's newest replica, its age and its lag: the steps from it to the job's newest
    checkpoint ``newest`` (a replica of that checkpoint is ``lag 0``, however far training has
    gone on since; no lag where no checkpoint is known). DISK FULL while copies to it fail
    for space. A multi-host job's spare is as current as its oldest shard (``shards``: the
    job's, ``Supervisor.shards``; default one host's whole checkpoint)."""
    now = time.time() if now is None else now
    states = [ctl.replicator.replica(job, spare, s) for s in shards or [None]]
    st = min(states, key=lambda x: -1 if x.manifest is None else x.manifest.step)
    text = "-" if st.manifest is None else f"{spare} @{st.manifest.step}"
    if st.manifest is not None:
        said = [] if newest is None else [f"lag {max(newest - st.manifest.step, 0)}"]
        if st.at:
            said.append(f"{age(now - st.at)} old")
        if said:
            text += f" ({', '.join(said)})"
    if any(x.full for x in states):
        return f"{spare} DISK FULL" if st.manifest is None else f"{text} DISK FULL"
    return text


def rate_current(ctl: Controller, sup: Supervisor, now: float, mono: float) -> bool:
    """Is a running job's steps/s current: its executor heard from within two heartbeats, and
    its newest step reported within two heartbeats plus three of its steps? An executor just
    started after a move is heard from before it trains: the rate then is the old run's, and
    showed for the 12-15 s the new one took to start."""
    beat = STALE_AFTER_SAMPLES * ctl.detection.heartbeat_s
    if not sup.last_seen or mono - sup.last_seen > beat or not sup.history:
        return False
    at, _, _, rate = sup.history[-1]
    return now - at <= beat + (3.0 / rate if rate > 0 else 0.0)


def job_rows(
    ctl: Controller, now: float | None = None, mono: float | None = None
) -> dict[str, Row]:
    """Jobs keyed by name; ``now`` is wall time (checkpoint ages), ``mono`` monotonic (the
    executor's last word: steps/s is shown only while running and current)."""
    now = time.time() if now is None else now
    mono = time.monotonic() if mono is None else mono
    rows: dict[str, Row] = {}
    for name, sup in ctl.jobs.items():
        spare = sup.spares[0] if sup.spares else None
        hosts = sup.hosts_in_use()
        planned = len(ctl.inv.members(name))
        resized = f" ({len(hosts)}/{planned})" if hosts and len(hosts) != planned else ""
        route = f"{'+'.join(hosts) or '-'}{resized} -> {', '.join(sup.spares) or '-'}"
        ckpt = sup.checkpoint
        ckpt_s = f"@{ckpt.step} {age(now - ckpt.created_at)} ago" if ckpt else "-"
        newest = ckpt.step if ckpt else None
        replica = (
            "-" if spare is None else replica_cell(ctl, name, spare, newest, sup.shards(), now)
        )
        state = sup.state.value
        if sup.state is JobState.UNREACHABLE:  # counted down live, not the moment it was noted
            state = f"waiting out lease on {sup.host}: {max(0.0, sup.lease.left()):.0f} s left"
        if sup.failure is not None:
            state += f" ({sup.failure.value})"
        elif sup.awaiting_approval:
            state += " (awaiting approval)"
        rows[name] = (
            name,
            route,
            state,
            str(sup.epoch),
            str(sup.rec.restarts),
            progress_bar(sup.step, sup.spec.steps),
            "-" if math.isnan(sup.loss) else f"{sup.loss:.4f}",
            f"{sup.steps_per_s:.1f}"
            if sup.state is JobState.RUNNING and rate_current(ctl, sup, now, mono)
            else "-",
            ckpt_s,
            replica,
        )
    return rows
